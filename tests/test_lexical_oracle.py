"""The library's BM25 (`cdr.retrieval.lexical.LexicalIndex`) against an independent implementation:
`bm25s` with the same constants (k1 = 1.2, b = 0.75) and its `lucene` variant, whose IDF is the
library's log(1 + (N − df + 0.5) / (df + 0.5)). `bench/lexical_engines.py` measures the same
agreement on the benchmark corpora; here it is a property over random corpora (repeated words,
empty rows, query words that are in no row, a query word given twice: the library scores a
query's distinct words, `bm25s` every token it is given, so the oracle gets them distinct)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from cdr.retrieval.lexical import K1, B, LexicalIndex, terms

if TYPE_CHECKING:
    import bm25s


@pytest.fixture(scope="module", autouse=True)
def bm25s_imported() -> None:
    """Imports the oracle (and skips when it is absent) when this module's test runs, not when
    pytest collects it: `bm25s` imports numba (about 0.5 s of CPU), and under `make test` each
    xdist worker collects every module while only one of them runs this one."""
    global bm25s
    bm25s = pytest.importorskip("bm25s")


WORDS = ("pipe", "buffer", "socket", "signal", "thread", "errno", "flags", "read")
rows_st = st.lists(st.lists(st.sampled_from(WORDS), max_size=9), min_size=1, max_size=25)
query_st = st.lists(st.sampled_from((*WORDS, "absent", "missing")), min_size=1, max_size=6)


@settings(max_examples=60, deadline=None)
@given(rows=rows_st, query=query_st)
def test_library_bm25_equals_bm25s_lucene(rows: list[list[str]], query: list[str]) -> None:
    assume(any(rows))  # bm25s cannot index a corpus without a word
    texts = [" ".join(r) for r in rows]
    lib = LexicalIndex.build(texts)
    got_rows, got = lib.scores(terms(" ".join(query)))

    ref_index = bm25s.BM25(k1=K1, b=B, method="lucene")
    ref_index.index([terms(t) for t in texts], show_progress=False)
    distinct = list(dict.fromkeys(terms(" ".join(query))))
    ref = np.asarray(ref_index.get_scores(distinct), np.float64)
    hit = np.flatnonzero(ref)
    assert got_rows.tolist() == hit.tolist()  # exactly the rows holding a query word
    if len(hit):
        np.testing.assert_allclose(got, ref[hit] / ref[hit].max(), rtol=1e-5, atol=1e-6)
