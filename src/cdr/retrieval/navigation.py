"""Navigation pages (a back-of-book index, a table of contents, a list of links) are not
content: under `pool: "sections"` their facts are not Phase 1 candidates.

A manual's index page is a long list of "term, section title" lines. It names every term of
the manual, so BM25 ranks its facts first for any task's words, and as the best-matching
document it makes document support weigh every real page down: on a slice of the PostgreSQL
manual (56 pages), the default sent 100 of its 113 facts from `bookindex.html` for a guide to
indexes and declared the pages on partial indexes unreachable. A table of contents
(`sql-commands.html`: "ALTER TABLE — change the definition of a table", a line per command) is
the same for a survey of commands: it was the best match of four of five sections. Fact by
fact an index line looks like a short list item; page by page it is unmistakable, so the rule
is per document, counted in lines:

- an *entry* is a line of at most `ENTRY_WORDS` words that ends without a sentence's
  punctuation and starts (after a list marker) with a letter, a digit or `$_.`; a line of code
  or of a table (a fact holding a `|`-separated row) is never an entry;
- a *navigation* document is one of at least `MIN_FACTS` facts and `MIN_LINES` lines of which
  at least `ENTRY_SHARE` are entries.

Measured on three knowledge bases (the benchmark's PostgreSQL slice of 216 pages, 60 man
pages, 52 Python-docs pages): the index, the book's table of contents and the SQL-command list
have 92–99% entry lines; every content page of 20 lines or more at most 44% (a table of
operator classes, 98% short lines, is a table and counts none).

A content page with a list or two keeps every fact. The mask is built once per committed state
over the whole row space, like the lexical index, so shards and one CKF agree.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

import numpy as np

from cdr.retrieval.factindex import Selection
from cdr.retrieval.per_state import PerState, every_fact

ENTRY_WORDS = 12
MIN_FACTS = 5
MIN_LINES = 20
ENTRY_SHARE = 0.8
_SENTENCE_END = (".", ";", ":", "!", "?")
_LIST_MARKER = re.compile(r"^(?:[-*+]|\d{1,9}[.)])\s+")
_ENTRY_START = re.compile(r"^[A-Za-z0-9$_.]")


def entry_lines(content: str, is_code: bool = False) -> tuple[int, int]:
    """(entry lines, non-empty lines) of a fact's text: how much of it is a list of short
    names rather than prose, code or a table."""
    lines = [line.strip() for line in content.splitlines() if line.strip()]
    if is_code or any(" | " in line or line.startswith("|") for line in lines):
        return 0, len(lines)
    entries = 0
    for line in lines:
        item = _LIST_MARKER.sub("", line, count=1)
        if (len(item.split()) <= ENTRY_WORDS and not item.endswith(_SENTENCE_END)
                and _ENTRY_START.match(item)):
            entries += 1
    return entries, len(lines)


def _navigation_rows(index: Any) -> np.ndarray:
    rows: dict[str, list[int]] = {}
    entries: Counter[str] = Counter()
    lines: Counter[str] = Counter()
    for row, f in every_fact(index):
        src = str(f.source)
        rows.setdefault(src, []).append(row)
        e, n = entry_lines(str(f.content), bool(getattr(f, "is_code", False)))
        entries[src] += e
        lines[src] += n
    mask = np.zeros(int(index.n_rows), dtype=bool)
    for src, rs in rows.items():
        if (len(rs) >= MIN_FACTS and lines[src] >= MIN_LINES
                and entries[src] >= ENTRY_SHARE * lines[src]):
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
