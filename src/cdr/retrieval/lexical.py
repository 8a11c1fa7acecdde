"""Hybrid relevance (`lexical: "bm25"`, not in CRP-SPEC-024): BM25 fused with the cosine.

A small embedding model places a fact about `open(2)`'s flags about as near to a task about
`openat2(2)` as to its own page; the words themselves tell them apart. With the option on, the
relevance that §2.6 gates and §7.1's score multiplies is

    fused = (1 − w) · cosine + w · bm25 / bm25_max

where `bm25` is Okapi BM25 (k1 = 1.2, b = 0.75) of the task's words (its subject and its
outline lines, `cdr.retrieval.subject`) against the fact's *lexical text* (its document's name, its
section path and its content: the words a reader would look it up by), and `bm25_max` is the
best score any fact of the knowledge base reaches for those words. So the normalised score lies
in [0, 1] like the cosines it is mixed with, and it depends on the query and the whole corpus,
never on which facts a shard happened to hold (docs/retrieval.md, "Relevance means the task's own
material"). The gate a fused relevance must pass is calibrated for it (`FUSED_GATES`).

Phase 1 stays exact without scoring every row: a fact with no query word has fused relevance
(1 − w) · cosine, so it can pass the gate g only if its cosine reaches g / (1 − w); the
candidates are that cosine-gated set (the index's own fast scan) united with the rows that hold
a query word (the postings), and only their vectors are read.

The index (`LexicalIndex`) is built once per committed state of a knowledge base and cached.
Its statistics (the number of facts, each word's document frequency, the mean length) count
the selectable facts only, each once: not rows a deletion left behind, and not a second copy
of a fact that another shard also holds (a shard set hides those, `cdr.cluster.shard_view`).
So a shard set and one CKF holding the same documents give the same BM25, hence the same
order, whatever their row layouts and histories.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

import numpy as np

from cdr.errors import InvalidInputError
from cdr.retrieval.factindex import Selection, check_gate
from cdr.retrieval.per_state import PerState, every_fact

K1 = 1.2
B = 0.75
# The lexical share of the fused relevance: chosen with its gate (`cdr.retrieval.gates`) on the TUNE
# tasks of the retrieval benchmark's two corpora (bench/results/calibration_lexical.md).
LEXICAL_WEIGHT = 0.6
MAX_QUERY_TERMS = 64
_WORD = re.compile(r"[^\W_]+", re.UNICODE)
# Words that name no subject: function words and the words every task and outline uses.
STOPWORDS = frozenset((
    "a", "an", "and", "are", "as", "at", "be", "by", "for", "from", "has", "have", "how", "in",
    "is", "it", "its", "of", "on", "or", "that", "the", "this", "to", "was", "were", "what",
    "when", "where", "which", "who", "why", "will", "with", "write", "guide", "about", "into",
    "than", "then", "there", "these", "those", "their", "them", "they", "you", "your", "can",
    "may", "not", "no", "all", "any", "each", "other", "some", "such", "only", "own", "same",
    "so", "too", "very", "just", "also", "using", "use", "used",
))


def terms(text: str) -> list[str]:
    """The words BM25 counts: lowercased letter/digit runs, stopwords and 1-letter words out
    (digits kept: "2" in "open(2)" is not a word, but "64" in "int64" is part of a token)."""
    return [t for t in (m.group().casefold() for m in _WORD.finditer(text))
            if (len(t) > 1 or t.isdigit()) and t not in STOPWORDS]


def lexical_text(source: str, section: str | None, content: str) -> str:
    """What a fact is looked up by: its document's file name, its section path, its text."""
    stem = PurePosixPath(str(source).replace("\\", "/")).stem if source else ""
    return f"{stem} {section or ''} {content}"


@dataclass(frozen=True)
class LexicalIndex:
    """Term statistics of every row of one committed state, as CSR postings.

    Two counts, on purpose: `n_rows` is the row space (scores come back over every row, so
    they index like the CKF's arrays), `n_docs` the facts BM25 counts — the selectable ones,
    without rows a deletion or re-ingest superseded, nor the copies a shard set hides — so a
    knowledge base weighs a word the same in every layout and history."""

    n_rows: int  # the row space the scores are indexed by
    n_docs: int  # the facts counted (selectable ones): BM25's N
    vocabulary: dict[str, int]
    post_offsets: np.ndarray  # int64 (V + 1,)
    post_rows: np.ndarray  # int64: rows holding each term, term by term
    post_tf: np.ndarray  # float32: the term's count in that row
    doc_len: np.ndarray  # float32 (n_rows,): terms per row
    avg_len: float
    # Each posting's BM25 term-frequency part, tf·(k1+1) / (tf + k1·(1 − b + b·len/avg)),
    # computed at build: a query only multiplies by its terms' idf and sums.
    post_part: np.ndarray  # float32, aligned with post_rows

    @classmethod
    def build(cls, texts: Sequence[str | None]) -> LexicalIndex:
        """One pass over the rows' lexical texts (once per state, not per window); a row
        whose text is None is not counted (not selectable: no postings, not in N or the
        mean length)."""
        vocab: dict[str, int] = {}
        t_ids: list[int] = []
        t_rows: list[int] = []
        t_tf: list[int] = []
        doc_len = np.zeros(len(texts), dtype=np.float32)
        counted = np.fromiter((t is not None for t in texts), dtype=bool, count=len(texts))
        for row, text in enumerate(texts):
            if text is None:
                continue
            words = terms(text)
            doc_len[row] = len(words)
            for word, tf in Counter(words).items():
                t_ids.append(vocab.setdefault(word, len(vocab)))
                t_rows.append(row)
                t_tf.append(tf)
        ids = np.asarray(t_ids, dtype=np.int64)
        order = np.argsort(ids, kind="stable")  # rows ascending within each term
        counts = np.bincount(ids, minlength=len(vocab)) if len(vocab) else np.zeros(0, np.int64)
        offsets = np.zeros(len(vocab) + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        n = int(counted.sum())
        rows = np.asarray(t_rows, dtype=np.int64)[order]
        tfs = np.asarray(t_tf, dtype=np.float32)[order]
        # float64 in row order over the counted rows only: the same sum for the same facts
        avg = float(doc_len[counted].astype(np.float64).sum() / n) if n else 0.0
        norm = 1.0 - B + B * doc_len[rows].astype(np.float64) / max(avg, 1e-9)
        part = (tfs * (K1 + 1.0) / (tfs + K1 * norm)).astype(np.float32)
        return cls(len(texts), n, vocab, offsets, rows, tfs, doc_len, avg, part)

    def query_ids(self, query_terms: Sequence[str]) -> np.ndarray:
        """Distinct known term ids of a query, in first-seen order."""
        seen: dict[int, None] = {}
        for t in query_terms:
            i = self.vocabulary.get(t)
            if i is not None:
                seen.setdefault(i, None)
        return np.fromiter(seen, dtype=np.int64, count=len(seen))

    def scores(self, query_terms: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """(rows holding a query word, their BM25 over the best row's), rows ascending: the
        best-matching fact of the whole knowledge base scores 1."""
        ids = self.query_ids(query_terms)
        if not len(ids) or not self.n_rows:
            return np.zeros(0, np.int64), np.zeros(0, np.float32)
        df = (self.post_offsets[ids + 1] - self.post_offsets[ids]).astype(np.float64)
        idf = np.log1p((self.n_docs - df + 0.5) / (df + 0.5))
        total = np.zeros(self.n_rows, dtype=np.float64)
        for i, w in zip(ids.tolist(), idf.tolist(), strict=True):
            lo, hi = self.post_offsets[i], self.post_offsets[i + 1]
            total[self.post_rows[lo:hi]] += w * self.post_part[lo:hi]  # rows distinct per term
        rows = np.flatnonzero(total)
        return rows, (total[rows] / total[rows].max()).astype(np.float32)


def check_weight(weight: float) -> float:
    w = float(weight)
    if not np.isfinite(w) or not 0.0 <= w < 1.0:
        raise InvalidInputError(f"lexical weight must be within [0, 1), got {weight!r}")
    return w


def fuse(cosine: np.ndarray, bm25: np.ndarray, weight: float) -> np.ndarray:
    """The fused relevance of aligned cosines and normalised BM25 scores."""
    w = np.float32(check_weight(weight))
    return ((np.float32(1.0) - w) * np.asarray(cosine, np.float32)
            + w * np.asarray(bm25, np.float32)).astype(np.float32)


def fused_select(index: Any, lexical: LexicalIndex, query_vector: Any,
                 query_terms: Sequence[str], min_relevance: float, limit: int | None,
                 weight: float = LEXICAL_WEIGHT,
                 scores: tuple[np.ndarray, np.ndarray] | None = None) -> Selection:
    """Phase 1 with fused relevance: active rows with fused ≥ `min_relevance`, best first,
    ties by row, at most `limit` — exactly, from the cosine-gated set ∪ the postings.
    `scores`: `lexical.scores(query_terms)` when the caller already has them."""
    w = check_weight(weight)
    gate, limit = check_gate(min_relevance, limit)
    if lexical.n_rows != index.n_rows:
        raise InvalidInputError("the lexical index is of another state of the knowledge base")
    rows_b, bm25 = lexical.scores(query_terms) if scores is None else scores
    if len(rows_b):
        rows_b, bm25 = rows_b[index.active[rows_b]], bm25[index.active[rows_b]]
    cos_gate = gate / (1.0 - w)  # a row holding no query word passes only with this cosine
    if limit is not None:
        # Try the best `limit` by cosine first: a row outside them holding no query word has
        # fused ≤ (1 − w) · (the limit-th cosine), so if the limit-th fused beats that the
        # answer is exact without reading more (the usual case for a small `limit`).
        base = index.select(query_vector, cos_gate, limit)
        out = _fuse_rows(index, base, rows_b, bm25, query_vector, w, gate, limit)
        if len(base) < limit or (len(out) == limit and float(out.relevances[-1])
                                 > (1.0 - w) * float(base.relevances[-1])):
            return out
    base = index.select(query_vector, cos_gate, None)
    return _fuse_rows(index, base, rows_b, bm25, query_vector, w, gate, limit)


def _fuse_rows(index: Any, base: Selection, rows_b: np.ndarray, bm25: np.ndarray,
               query_vector: Any, w: float, gate: float, limit: int | None) -> Selection:
    """Fused relevance over `base` ∪ the postings' rows, gated, best first, ties by row."""
    extra = np.setdiff1d(rows_b, base.indices, assume_unique=True)
    q = np.asarray(query_vector, np.float32).reshape(-1)
    q = q / np.float32(np.linalg.norm(q))
    extra_emb = (np.asarray(index.vectors(extra), np.float32) if len(extra)
                 else np.zeros((0, index.dim), np.float32))
    rows = np.concatenate([base.indices, extra]).astype(np.int64)
    emb = np.concatenate([base.embeddings, extra_emb]).astype(np.float32)
    cos = np.concatenate([base.relevances, extra_emb @ q]).astype(np.float32)
    b = np.zeros(len(rows), np.float32)
    if len(rows_b):
        pos = np.minimum(np.searchsorted(rows_b, rows), len(rows_b) - 1)
        hit = rows_b[pos] == rows
        b[hit] = bm25[pos[hit]]
    rel = fuse(cos, b, w)
    keep = rel >= np.float32(gate)
    rows, rel, emb = rows[keep], rel[keep], emb[keep]
    order = np.lexsort((rows, -rel))[:limit]
    return Selection(rows[order], rel[order], emb[order])


class FusedIndex:
    """A fact index whose `select` ranks by fused relevance for one session's words; every
    other attribute is the wrapped index's. The window loop wraps its index in one when
    `lexical: "bm25"` is on, so Phase 1, the gate and §7.1's relevance factor all see the
    fused score and nothing else changes."""

    def __init__(self, index: Any, lexical: LexicalIndex, query_terms: Sequence[str],
                 weight: float = LEXICAL_WEIGHT) -> None:
        self._index = index
        self._lexical = lexical
        self._terms = list(query_terms)
        self._weight = check_weight(weight)
        self._scores: tuple[np.ndarray, np.ndarray] | None = None

    @property
    def wrapped(self) -> Any:
        return self._index

    def select(self, query_vector: Any, min_relevance: float,
               limit: int | None = None) -> Selection:
        if self._scores is None:  # one BM25 pass per window, however many queries select
            self._scores = self._lexical.scores(self._terms)
        return fused_select(self._index, self._lexical, query_vector, self._terms,
                            min_relevance, limit, self._weight, self._scores)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._index, name)


# ---------------------------------------------------------------------- per-state cache


def _lexical_index(index: Any) -> LexicalIndex:
    texts: list[str | None] = [None] * int(index.n_rows)
    for row, f in every_fact(index, rows=np.flatnonzero(np.asarray(index.active))):
        texts[row] = lexical_text(f.source, f.section, f.content)
    return LexicalIndex.build(texts)


# The `LexicalIndex` of an index's current state: built on first use (reading every row's
# source, section and text once), then shared by every session on that state.
lexical_index = PerState(_lexical_index)


def session_terms(subject: str, lines: Sequence[str]) -> list[str]:
    """The query words of a session: its subject's, then its outline lines', distinct and
    bounded (`MAX_QUERY_TERMS`), so a huge outline cannot make each window's scoring slow."""
    out: dict[str, None] = {}
    for text in (subject, *lines):
        for t in terms(text):
            out.setdefault(t, None)
            if len(out) >= MAX_QUERY_TERMS:
                return list(out)
    return list(out)
