"""Hybrid relevance (`lexical: "bm25"`): the words BM25 counts, BM25 itself on an exact small
case, the fused Phase 1 equal to a brute-force fused scan (hypothesis, and on a real CKF), and a
run whose envelope carries fused relevances."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cdr.ckf import CKF
from cdr.errors import InvalidInputError
from cdr.retrieval.factindex import Selection, select_rows
from cdr.retrieval.lexical import (
    K1,
    MAX_QUERY_TERMS,
    B,
    FusedIndex,
    LexicalIndex,
    fuse,
    fused_select,
    lexical_index,
    lexical_text,
    session_terms,
    terms,
)
from cdr.retrieval.subject import subject_of
from cdr.trace import build_trace
from cdr.window.loop import GenerationConfig, Generator
from cdr.writers import get_writer
from tests.conftest import BUILTIN_TYPES_OUTLINE, BUILTIN_TYPES_TASK


def test_terms_are_lowercased_words_without_stopwords():
    assert terms("The open(2) call: O_CREAT creates the FILE") == [
        "open", "2", "call", "creat", "creates", "file"]
    assert terms("\x00\x1b[31m naïve Über-cache\u2028") == ["31m", "naïve", "über", "cache"]
    assert lexical_text("/usr/share/man/open.2.md", "open > ERRORS", "EACCES ...") == (
        "open.2 open > ERRORS EACCES ...")


def test_session_terms_are_distinct_and_bounded():
    assert session_terms("asyncio tasks", ["Background", "Cancelling tasks"]) == [
        "asyncio", "tasks", "background", "cancelling"]
    huge = session_terms("w " + " ".join(f"t{i}" for i in range(10_000)), [])
    assert len(huge) == MAX_QUERY_TERMS


def test_bm25_exact_on_three_rows():
    texts = ["pipe pipe buffer", "pipe", "socket buffer data more words"]
    lx = LexicalIndex.build(texts)
    rows, got = lx.scores(["pipe", "unknown"])
    assert rows.tolist() == [0, 1]
    n, df, avg = 3, 2, (3 + 1 + 5) / 3
    idf = math.log1p((n - df + 0.5) / (df + 0.5))

    def part(tf: int, dl: int) -> float:
        return idf * tf * (K1 + 1) / (tf + K1 * (1 - B + B * dl / avg))

    raw = [part(2, 3), part(1, 1)]
    np.testing.assert_allclose(got, np.array(raw) / max(raw), rtol=1e-6)
    assert lx.scores(["nothing"])[0].size == 0
    empty = LexicalIndex.build([])
    assert empty.scores(["pipe"])[0].size == 0


def test_fuse_and_its_bounds():
    np.testing.assert_allclose(fuse(np.array([0.8, 0.2]), np.array([0.0, 1.0]), 0.5),
                               [0.4, 0.6], rtol=1e-6)
    for bad in (-0.1, 1.0, float("nan")):
        with pytest.raises(InvalidInputError, match="lexical weight"):
            fuse(np.zeros(1), np.zeros(1), bad)


class ArrayIndex:
    """A fact index over arrays, with the real Phase 1 (`select_rows`): what `fused_select`
    needs of any backend (select, vectors, active, n_rows, dim)."""

    def __init__(self, emb: np.ndarray, active: np.ndarray) -> None:
        self.emb, self.active = emb, active
        self.n_rows, self.dim = emb.shape

    def select(self, q, gate, limit=None) -> Selection:
        return select_rows(self.emb, self.active, np.asarray(q, np.float32), gate, limit)

    def vectors(self, rows) -> np.ndarray:
        return self.emb[np.asarray(rows, np.int64)]


WORDS = ["pipe", "file", "open", "socket", "read", "write", "buffer", "signal"]


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 40), seed=st.integers(0, 10_000),
       gate=st.sampled_from([-1.0, 0.0, 0.2, 0.4, 0.6]), w=st.sampled_from([0.0, 0.3, 0.5, 0.7]),
       limit=st.sampled_from([None, 1, 3, 10]))
def test_fused_select_equals_a_brute_force_fused_scan(n, seed, gate, w, limit):
    rng = np.random.default_rng(seed)
    emb = rng.normal(size=(n, 8)).astype(np.float32)
    emb /= np.linalg.norm(emb, axis=1, keepdims=True)
    active = rng.random(n) > 0.2
    texts = [" ".join(rng.choice(WORDS, size=rng.integers(0, 6))) for _ in range(n)]
    lx = LexicalIndex.build(texts)
    q = rng.normal(size=8).astype(np.float32)
    q /= np.linalg.norm(q)
    query = ["pipe", "open"]
    got = fused_select(ArrayIndex(emb, active), lx, q, query, gate, limit, w)
    rows_b, b = lx.scores(query)
    dense = np.zeros(n, np.float32)
    dense[rows_b] = b
    rel = fuse(emb @ q, dense, w)
    want = [i for i in np.lexsort((np.arange(n), -rel)) if active[i] and rel[i] >= np.float32(gate)]
    want = want[:limit]
    assert got.indices.tolist() == want
    np.testing.assert_allclose(got.relevances, rel[want], atol=1e-6)
    np.testing.assert_allclose(got.embeddings, emb[want])


@pytest.fixture(scope="module")
def types_ckf(types_ckf_path) -> CKF:
    return CKF.open(types_ckf_path)


def test_fused_phase1_on_a_real_ckf_and_a_run_that_uses_it(types_ckf):
    gen = Generator(types_ckf, get_writer("extractive"),
                    GenerationConfig(max_windows=2, words=1200, lexical="bm25"))
    session = gen.start(BUILTIN_TYPES_TASK, BUILTIN_TYPES_OUTLINE)
    index = gen.phase1_index(session.options, session.task, session.sub_queries)
    assert isinstance(index, FusedIndex) and index.wrapped is types_ckf
    lx = lexical_index(types_ckf)
    assert lx is lexical_index(types_ckf)  # built once per state
    words = session_terms(subject_of(session.task), [sq.text for sq in session.sub_queries])
    rows_b, b = lx.scores(words)
    dense = np.zeros(types_ckf.n_rows, np.float32)
    dense[rows_b] = b
    rel = fuse(np.asarray(types_ckf.embeddings) @ session.query_vector, dense,
               gen.config.lexical_weight)
    sel = gen.candidates(session)
    want = [i for i in np.lexsort((np.arange(len(rel)), -rel))
            if types_ckf.active[i] and rel[i] >= np.float32(session.min_relevance)]
    assert sel.indices.tolist() == want[:len(sel)] and len(sel) > 0
    np.testing.assert_allclose(sel.relevances, rel[sel.indices], atol=1e-5)
    events = list(gen.run(session.task, session=session))
    trace = build_trace(session, events)
    assert trace["options"] == {"lexical": "bm25"}
    first = trace["windows"][0]["envelope"]
    row_of = {f: r for r, f in enumerate(types_ckf.fact_ids(np.arange(types_ckf.n_rows)))}
    assert first  # the envelope's relevance is the fused one
    for f in first:
        assert abs(f["relevance"] - float(rel[row_of[f["fact_id"]]])) < 1e-3


def test_ckf_search_ranks_by_the_fused_relevance(types_ckf_path):
    import json

    from typer.testing import CliRunner

    from cdr.cli import app

    runner = CliRunner()
    r = runner.invoke(app, ["ckf", "search", "tuple methods", "--ckf", str(types_ckf_path),
                            "--lexical", "bm25", "-n", "5", "--json"])
    assert r.exit_code == 0, r.output
    hits = json.loads(r.stdout)
    with CKF.open(types_ckf_path) as ckf:
        want = fused_select(ckf, lexical_index(ckf), ckf.embedder.encode(["tuple methods"])[0],
                            session_terms("tuple methods", []), -1.0, 5)
    assert [h["row"] for h in hits] == want.indices.tolist()
    assert [h["relevance"] for h in hits] == [round(float(x), 4) for x in want.relevances]
    bad = runner.invoke(app, ["ckf", "search", "x", "--ckf", str(types_ckf_path),
                              "--lexical", "tfidf"])
    assert bad.exit_code == 2 and "--lexical must be one of off, bm25" in bad.output
