"""Document support (`documents: "support"`, not in CRP-SPEC-024): a fact's relevance weighed by
how well its document matches the task.

On a knowledge base of many documents of one kind, a task's sibling documents share its words
and its sections: for a task about `io_destroy(2)`, the pages of `io_setup`, `io_cancel` and
`io_submit` name the same context, the same library and each other in "See also", and their
facts pass the relevance gate one by one beside the task's own (the retrieval benchmark
measured a third of Window 1 from such pages). Fact by fact nothing tells them apart; document
by document the task's own page holds the best-matching facts. So, over Phase 1's candidates
(the facts past the gate):

    support(d)  = the best relevance of document d's candidates
    relevance'  = relevance · (support(d) / max over documents of support) ^ POWER

and the gate is applied again to relevance'. The best-supported document's facts keep their
relevance; a document that matches the task nearly as well (a task drawing on several pages)
loses little; a sibling that matches it clearly less loses its weakest facts. Facts below the
gate were never candidates, so the weighing only removes; the §7.1 score multiplies the
weighed relevance (docs/retrieval.md, "Relevance means the task's own material").

A fact whose text several documents share is stored once, under the first document that held it
(`cdr.ckf`), and is weighed by that document.

The row → document map is built once per committed state of a knowledge base and cached, over
the whole row space, so a sharded index weighs exactly as one CKF holding all the rows.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from cdr.retrieval.factindex import Selection, check_gate
from cdr.retrieval.navigation import content_rows
from cdr.retrieval.per_state import PerState, every_fact

# (support ratio) ** POWER: chosen on the TUNE split of the retrieval benchmark's two corpora
# (bench/results/tune_focused_round3.md).
POWER = 2.0
# A document's support is the mean of its TOP_N best candidates' relevances.
TOP_N = 3


def _document_codes(index: Any) -> np.ndarray:
    codes = np.zeros(int(index.n_rows), dtype=np.int64)
    names: dict[str, int] = {}
    for row, f in every_fact(index):
        codes[row] = names.setdefault(str(f.source), len(names))
    return codes


# int64 (n_rows,): a code per row naming its document (the same code for the rows of one
# source), built on first use for an index's state and shared by every session on it.
document_codes = PerState(_document_codes)


def _content_sizes(index: Any) -> np.ndarray:
    codes = document_codes(index)
    out: np.ndarray = np.bincount(codes[content_rows(index)],
                                  minlength=int(codes.max()) + 1 if len(codes) else 0)
    return out


# int64 (n_docs,): each document's content facts (selectable, not navigation), per state.
content_sizes = PerState(_content_sizes)


def document_support(doc: np.ndarray, rel: np.ndarray, n_docs: int, top_n: int = TOP_N
                     ) -> np.ndarray:
    """float64 (n_docs,): each document's support, the mean of its `top_n` best candidate
    relevances, a document with fewer candidates counting the missing ones as 0. One fact
    that matches the task's words closely (a chapter's one-line summary page, a page naming
    every term) does not outweigh a page many of whose facts match it."""
    if top_n < 1:
        raise ValueError(f"document support needs top_n >= 1, got {top_n!r}")
    order = np.lexsort((-rel, doc))
    d, r = doc[order], rel[order]
    starts = np.flatnonzero(np.r_[True, d[1:] != d[:-1]])
    rank = np.arange(len(d)) - np.repeat(starts, np.diff(np.r_[starts, len(d)]))
    keep = rank < top_n
    total = np.zeros(n_docs)
    np.add.at(total, d[keep], r[keep])
    out: np.ndarray = total / top_n
    return out


def _supports(docs: np.ndarray, relevances: np.ndarray, top_n: int
              ) -> tuple[np.ndarray, np.ndarray]:
    """(the distinct document codes ascending, the support of each) among candidates."""
    uniq, inv = np.unique(np.asarray(docs, np.int64), return_inverse=True)
    return uniq, document_support(inv, np.asarray(relevances, np.float64), len(uniq), top_n)


def home_document(docs: np.ndarray, relevances: np.ndarray, top_n: int = TOP_N) -> int | None:
    """The document (code) of the best support among candidates of documents `docs` with
    these relevances (the lowest code on a tie), None without candidates: where a section of
    the task lives, judged page by page."""
    if not len(docs):
        return None
    uniq, support = _supports(docs, relevances, top_n)
    return int(uniq[int(np.argmax(support))])


def section_pages(docs: np.ndarray, relevances: np.ndarray, gate: float,
                  top_n: int = TOP_N) -> np.ndarray:
    """The pages a section lives in, among candidates of documents `docs` with these
    relevances: its home (`home_document`) and every document whose support reaches `gate`
    (codes, ascending; empty without candidates)."""
    if not len(docs):
        return np.zeros(0, np.int64)
    uniq, support = _supports(docs, relevances, top_n)
    keep = support >= gate
    keep[int(np.argmax(support))] = True
    out: np.ndarray = uniq[keep]
    return out


def support_weights(rows: np.ndarray, relevances: np.ndarray, codes: np.ndarray,
                    power: float = POWER, top_n: int = TOP_N) -> np.ndarray:
    """float32 multiplier per candidate: (its document's support among the candidates / the
    best document's) ** power. Empty input gives an empty array."""
    rows = np.asarray(rows, dtype=np.int64)
    rel = np.asarray(relevances, dtype=np.float64)
    if not len(rows):
        return np.zeros(0, np.float32)
    if not np.isfinite(power) or power < 0:
        raise ValueError(f"document support power must be finite and >= 0, got {power!r}")
    doc = codes[rows]
    uniq, inv = np.unique(doc, return_inverse=True)
    best = document_support(inv, rel, len(uniq), top_n)
    top = best.max()
    if top <= 0:  # a gate at or below zero: nothing to weigh against
        return np.ones(len(rows), np.float32)
    ratio = np.clip(best / top, 0.0, 1.0)
    out: np.ndarray = (ratio[inv] ** power).astype(np.float32)
    return out


def supported_select(index: Any, codes: np.ndarray, query_vector: Any, min_relevance: float,
                     limit: int | None, power: float = POWER, top_n: int = TOP_N) -> Selection:
    """Phase 1 with document support: `index`'s candidates past the gate, each relevance
    weighed by its document's support, gated again, best first (ties by row), at most
    `limit`. The weights need every candidate, so the inner select is unlimited."""
    gate, limit = check_gate(min_relevance, limit)
    base = index.select(query_vector, gate, None)
    if not len(base.indices):
        out: Selection = base
        return out
    w = support_weights(base.indices, base.relevances, codes, power, top_n)
    rel = (np.asarray(base.relevances, np.float32) * w).astype(np.float32)
    keep = rel >= np.float32(gate)
    rows, rel, emb = base.indices[keep], rel[keep], base.embeddings[keep]
    order = np.lexsort((rows, -rel))[:limit]
    return Selection(rows[order], rel[order], emb[order])


class SupportedIndex:
    """A fact index whose `select` weighs relevance by document support; every other
    attribute is the wrapped index's (which may itself fuse BM25,
    `cdr.retrieval.lexical.FusedIndex`).
    The window loop wraps its Phase 1 index in one when `documents: "support"` is on."""

    def __init__(self, index: Any, codes: np.ndarray, power: float = POWER,
                 top_n: int = TOP_N) -> None:
        if len(codes) != int(index.n_rows):
            raise ValueError("the document map is of another state of the knowledge base")
        self._index = index
        self._codes = codes
        self._power = float(power)
        self._top_n = int(top_n)

    @property
    def wrapped(self) -> Any:
        return self._index

    def select(self, query_vector: Any, min_relevance: float,
               limit: int | None = None) -> Selection:
        return supported_select(self._index, self._codes, query_vector, min_relevance, limit,
                                self._power, self._top_n)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._index, name)
