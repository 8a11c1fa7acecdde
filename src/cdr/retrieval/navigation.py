"""Navigation pages (a back-of-book index, a table of contents, a list of links) are not
content: under `pool: "sections"` their facts are not Phase 1 candidates.

A manual's index page is a long list of "term, section title" lines. It names every term of
the manual, so BM25 ranks its facts first for any task's words, and as the best-matching
document it makes document support weigh every real page down: on a slice of the PostgreSQL
manual (56 pages), the default sent 100 of its 113 facts from `bookindex.html` for a guide to
indexes and declared the pages on partial indexes unreachable. Fact by fact an index line looks
like a short list item; page by page it is unmistakable, so the rule is per document:

- a *listing* fact is one of at least `MIN_LINES` lines of which at least `SHORT_SHARE` are
  short (at most `SHORT_WORDS` words) and end without a sentence's punctuation; code is never a
  listing;
- a *navigation* document is one of at least `MIN_FACTS` facts of which at least
  `LISTING_SHARE` are listings.

A content page with a list or two keeps every fact. The mask is built once per committed state
over the whole row space, like the lexical index, so shards and one CKF agree.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np

from cdr.retrieval.factindex import Selection
from cdr.retrieval.per_state import PerState, every_fact

MIN_LINES = 3
SHORT_WORDS = 8
SHORT_SHARE = 0.8
MIN_FACTS = 5
LISTING_SHARE = 0.6
_SENTENCE_END = (".", ";", ":", "!")


def is_listing(content: str, is_code: bool = False) -> bool:
    """Whether a fact's text is a list of short entries rather than prose."""
    if is_code:
        return False
    lines = [line.strip() for line in content.splitlines() if line.strip()]
    if len(lines) < MIN_LINES:
        return False
    short = sum(1 for line in lines
                if len(line.split()) <= SHORT_WORDS and not line.endswith(_SENTENCE_END))
    return short >= SHORT_SHARE * len(lines)


def _navigation_rows(index: Any) -> np.ndarray:
    rows: dict[str, list[int]] = {}
    listing: Counter[str] = Counter()
    for row, f in every_fact(index):
        src = str(f.source)
        rows.setdefault(src, []).append(row)
        if is_listing(str(f.content), bool(getattr(f, "is_code", False))):
            listing[src] += 1
    mask = np.zeros(int(index.n_rows), dtype=bool)
    for src, rs in rows.items():
        if len(rs) >= MIN_FACTS and listing[src] >= LISTING_SHARE * len(rs):
            mask[rs] = True
    return mask


# bool (n_rows,): the rows of navigation documents, built on first use for an index's state.
navigation_rows = PerState(_navigation_rows)


def _content_rows(index: Any) -> np.ndarray:
    out: np.ndarray = np.asarray(index.active, bool) & ~navigation_rows(index)
    return out


# bool (n_rows,): the selectable rows of content documents, per index state.
content_rows = PerState(_content_rows)


class ContentIndex:
    """A fact index without the rows of navigation documents: `select` never returns them and
    `active` counts them out (so BM25 fusion skips them too); every other attribute is the
    wrapped index's."""

    def __init__(self, index: Any, navigation: np.ndarray) -> None:
        if len(navigation) != int(index.n_rows):
            raise ValueError("the navigation mask is of another state of the knowledge base")
        self._index = index
        self._navigation = navigation

    @property
    def wrapped(self) -> Any:
        return self._index

    @property
    def active(self) -> np.ndarray:
        out: np.ndarray = np.asarray(self._index.active) & ~self._navigation
        return out

    def select(self, query_vector: Any, min_relevance: float,
               limit: int | None = None) -> Selection:
        if not self._navigation.any():
            out: Selection = self._index.select(query_vector, min_relevance, limit)
            return out
        sel: Selection = self._index.select(query_vector, min_relevance, None)
        return sel.where(np.flatnonzero(~self._navigation[sel.indices])[:limit])

    def __getattr__(self, name: str) -> Any:
        return getattr(self._index, name)
