"""The quality benchmark's own code: arms (xQuAD, pyversity adapters), tasks and measures."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

from cdr.ckf.records import Selection
from cdr.errors import InvalidInputError
from quality_arms import (
    CachingEmbedder,
    PyversityRanker,
    ShownMemoryCdrRanker,
    XQuADRanker,
    fill_k,
    max_normalised,
    ranking_from_order,
    xquad_order,
)
from quality_metrics import WindowData, alpha_ndcg_vs_page, first_exit, run_metrics
from quality_tasks import clean_title, label_of, make_task, page_of, section_outline


def unit(*rows: list[float]) -> np.ndarray:
    x = np.asarray(rows, dtype=np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


# ----------------------------------------------------------------------------------- xQuAD


def test_xquad_covers_the_second_aspect_before_a_near_duplicate() -> None:
    # d0 and d1 serve aspect A; d2 serves aspect B and is less relevant.
    rel = np.array([1.0, 0.9, 0.6])
    p = np.array([[1.0, 0.0], [0.9, 0.0], [0.0, 1.0]])
    order, scores, left = xquad_order(rel, p, 3, lam=0.5)
    assert order.tolist() == [0, 2, 1]
    # First pick: 0.5·1 + 0.5·(½·1) = 0.75. Then d2: 0.5·0.6 + 0.5·½·1 = 0.55 beats
    # d1: 0.5·0.9 + 0.5·½·0.9·(1 − 1) = 0.45.
    assert scores.tolist() == pytest.approx([0.75, 0.55, 0.45])
    assert left.tolist() == pytest.approx([0.0, 0.0])


def test_xquad_with_lambda_zero_is_relevance_order() -> None:
    rel = np.array([0.2, 0.9, 0.5, 0.7])
    p = np.random.default_rng(0).random((4, 3))
    order, _, _ = xquad_order(rel, p, 4, lam=0.0)
    assert order.tolist() == [1, 3, 2, 0]


def test_xquad_prior_carries_coverage_from_earlier_windows() -> None:
    rel = np.array([1.0, 0.6])
    p = np.array([[1.0, 0.0], [0.0, 1.0]])
    # Aspect A was covered by facts shown before: its mass left is 0.
    order, _, _ = xquad_order(rel, p, 1, lam=0.5, prior=np.array([0.0, 1.0]))
    assert order.tolist() == [1]


@pytest.mark.parametrize(
    ("rel", "p", "lam", "match"),
    [
        (np.array([1.5]), np.array([[0.5]]), 0.5, "within \\[0, 1\\]"),
        (np.array([0.5]), np.array([[-0.1]]), 0.5, "within \\[0, 1\\]"),
        (np.array([0.5]), np.array([[0.5]]), 1.5, "lambda"),
        (np.array([0.5, 0.4]), np.array([[0.5]]), 0.5, "shape"),
    ],
)
def test_xquad_rejects_bad_input(rel: np.ndarray, p: np.ndarray, lam: float, match: str) -> None:
    with pytest.raises(InvalidInputError, match=match):
        xquad_order(rel, p, 1, lam)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 30), st.integers(1, 5), st.integers(0, 40), st.floats(0, 1),
       st.integers(0, 2**31 - 1))
def test_xquad_picks_distinct_candidates(m: int, q: int, k: int, lam: float, seed: int) -> None:
    rng = np.random.default_rng(seed)
    order, _, left = xquad_order(rng.random(m), rng.random((m, q)), k, lam)
    assert len(order) == min(k, m)
    assert len(set(order.tolist())) == len(order)
    assert ((left >= 0) & (left <= 1)).all()


def test_max_normalised_clips_and_scales_per_column() -> None:
    x = np.array([[0.5, -0.2], [0.25, 0.4], [-1.0, 0.0]])
    assert np.allclose(max_normalised(x), [[1.0, 0.0], [0.5, 1.0], [0.0, 0.0]])
    assert max_normalised(np.array([-1.0, -2.0])).tolist() == [0.0, 0.0]


# ------------------------------------------------------------------------- rankings and k


def test_ranking_from_order_puts_picks_first_then_relevance() -> None:
    rows = np.array([10, 11, 12, 13, 14])
    rel = np.array([0.9, 0.8, 0.7, 0.6, 0.5], dtype=np.float32)
    r = ranking_from_order(rows, rel, np.array([3, 1]), "x", {"k": 2.0})
    assert r.indices.tolist() == [13, 11, 10, 12, 14]
    assert r.relevance.tolist() == pytest.approx([0.6, 0.8, 0.9, 0.7, 0.5])
    assert (np.diff(r.score) < 0).all()
    assert r.novelty.tolist() == [1.0] * 5 and r.ngram_penalty.tolist() == [0.0] * 5
    assert r.n_candidates == 5 and r.mode == "x" and r.extra == {"k": 2.0}


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 25), st.integers(0, 2**31 - 1))
def test_ranking_from_order_is_a_permutation(m: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    rows = rng.permutation(1000)[:m]
    order = rng.permutation(m)[: rng.integers(0, m + 1)]
    r = ranking_from_order(rows, rng.random(m).astype(np.float32), order, "x")
    assert sorted(r.indices.tolist()) == sorted(rows.tolist())
    assert r.indices[: len(order)].tolist() == rows[order].tolist()


def test_ranking_from_order_rejects_repeated_positions() -> None:
    with pytest.raises(InvalidInputError, match="distinct"):
        ranking_from_order(np.arange(3), np.ones(3, np.float32), np.array([1, 1]), "x")


def test_fill_k_is_two_envelopes_at_the_median_size() -> None:
    tokens = np.array([92, 92, 92, 500, 10])  # median 92, +8 framing = 100 per fact
    assert fill_k(tokens, 1000) == 5  # 20 wanted, only 5 candidates
    assert fill_k(np.full(100, 92), 1000) == 20
    assert fill_k(np.zeros(0, dtype=np.int64), 1000) == 0


def _selection(emb: np.ndarray, rel: list[float], rows: list[int]) -> Selection:
    return Selection(np.asarray(rows, dtype=np.int64), np.asarray(rel, dtype=np.float32), emb)


class _Session:
    def __init__(self, sq: np.ndarray) -> None:
        self.sub_query_embeddings = sq


def test_pyversity_mmr_ranks_every_candidate_once_best_first() -> None:
    emb = unit([1, 0, 0], [0.99, 0.1, 0], [0, 1, 0], [0, 0, 1])
    sel = _selection(emb, [0.9, 0.85, 0.6, 0.5], [7, 8, 9, 10])
    ranker = PyversityRanker(1000, np.full(20, 42), strategy="mmr", diversity=0.5, name="mmr")
    r = ranker(None, sel, np.ones(4, np.float32), None)
    assert sorted(r.indices.tolist()) == [7, 8, 9, 10]
    assert r.indices[0] == 7  # MMR's first pick is the most relevant
    assert r.indices[1] == 9  # the near-duplicate of 7 waits
    assert r.mode == "mmr"


def test_pyversity_ssd_avoids_what_earlier_windows_showed() -> None:
    vectors = unit([1, 0, 0], [0, 1, 0], [0, 0, 1])  # CKF rows 0, 1, 2
    sel = _selection(vectors[[0, 1]], [0.8, 0.8], [0, 1])
    ranker = PyversityRanker(1000, np.full(3, 42), strategy="ssd", diversity=0.5, name="ssd",
                             fact_vectors=lambda rows: vectors[rows])
    ranker.remember(np.array([0]))  # row 0 was in an earlier envelope
    r = ranker(None, sel, np.ones(2, np.float32), None)
    assert r.indices.tolist() == [1, 0]


def test_xquad_ranker_leaves_earlier_facts_out_of_its_picks() -> None:
    emb = unit([1, 0], [0.9, 0.1], [0, 1], [0.1, 0.9])
    sel = _selection(emb, [0.9, 0.8, 0.7, 0.6], [0, 1, 2, 3])
    ranker = XQuADRanker(1000, np.full(4, 42), lam=0.5)
    session = _Session(unit([1, 0], [0, 1]))
    first = ranker(session, sel, np.ones(4, np.float32), None)
    assert first.indices[:2].tolist() == [0, 2]  # one fact per aspect first
    ranker.remember(first.indices[:2])
    second = ranker(session, sel, np.ones(4, np.float32), None)
    assert set(second.indices[:2].tolist()) == {1, 3}
    assert second.indices[2:].tolist() == [0, 2]  # shown facts only as filler, by relevance


def test_shown_memory_cdr_demotes_facts_of_earlier_envelopes() -> None:
    from cdr.coverage import SubQuery
    from cdr.session import Session

    emb = unit([1, 0.1, 0], [1, 0.2, 0], [1, 0, 0.3])
    sq = unit([1, 0.1, 0], [1, 0, 0.3])
    session = Session.start("t", [SubQuery("sq-1", "a", 100), SubQuery("sq-2", "b", 100)],
                            sq, unit([1, 0.05, 0.1])[0], "toy", min_relevance=0.0)
    rel = emb @ session.query_vector
    sel = _selection(emb, rel.tolist(), [5, 6, 7])
    ranker = ShownMemoryCdrRanker(1000, np.full(8, 42))
    first = ranker(session, sel, np.ones(3, np.float32), None)
    assert first.indices.tolist() == (np.array([5, 6, 7])[np.argsort(-rel)]).tolist()
    top = int(first.indices[0])
    ranker.remember(np.array([top]))
    second = ranker(session, sel, np.ones(3, np.float32), None)
    assert second.indices[-1] == top  # the shown fact drops to the end
    k = second.indices.tolist().index(top)
    assert second.novelty[k] == pytest.approx(0.2) and second.score[k] == pytest.approx(
        0.2 * first.score[0])
    assert second.mode == "cdr+shown"


# ----------------------------------------------------------------------------------- tasks


def test_clean_title_strips_section_numbers() -> None:
    assert clean_title("3.3.1. Basic customization") == "Basic customization"
    assert clean_title("3. Data model") == "Data model"
    assert clean_title("Logger Objects") == "Logger Objects"


PAGE = ["Top", "Top > A", "Top > A", "Top > B", "Top > B", "Top > C > C1", "Top > C > C1",
        "Top > C > C2", "Top > C > C2", "Top > C", "Top > D"]


def test_section_outline_splits_the_largest_section_until_there_are_enough() -> None:
    keys = section_outline(PAGE, min_sections=4, min_facts=2)
    # A, B, C hold ≥ 2 facts, D one: 3 < 4, so C (largest) becomes C1, C2.
    assert keys == [("Top", "A"), ("Top", "B"), ("Top", "C", "C1"), ("Top", "C", "C2")]
    assert section_outline(PAGE, min_sections=3, min_facts=2) == [
        ("Top", "A"), ("Top", "B"), ("Top", "C")]


def test_label_of_takes_the_longest_matching_section() -> None:
    keys = [("Top", "A"), ("Top", "C", "C1")]
    assert label_of("Top > C > C1 > deep", keys) == 1
    assert label_of("Top > A", keys) == 0
    assert label_of("Top > C", keys) is None
    assert label_of("Other > A", keys) is None


def test_make_task_uses_titles_and_qualifies_repeated_ones() -> None:
    page = ["7. Stmts", "7. Stmts > 7.1. X > Examples", "7. Stmts > 7.1. X > Examples",
            "7. Stmts > 7.2. Y > Examples", "7. Stmts > 7.2. Y > Examples"]
    t = make_task("reference/x.html", page, min_sections=2, min_facts=2)
    assert t is not None
    assert t.title == "Stmts"
    assert t.outline == ("X", "Y")
    t2 = make_task("reference/x.html", page, min_sections=3, min_facts=1)
    assert t2 is None
    t3 = make_task("reference/x.html", [*page, "7. Stmts > 7.3. Z"], min_sections=3,
                   min_facts=1)
    assert t3 is not None and t3.outline == ("X", "Y", "Z")
    t4 = make_task("p", ["T", "T > S > Examples", "T > S > Examples", "T > S > Examples",
                         "T > R > Examples", "T > R > Examples"], min_sections=2, min_facts=2)
    assert t4 is not None and t4.outline == ("S", "R")
    deep = ["T > S > E", "T > S > E", "T > S > F", "T > S > F", "T > R > E", "T > R > E",
            "T > R > G", "T > R > G"]
    t5 = make_task("p", ["T", *deep], min_sections=4, min_facts=2)
    assert t5 is not None and t5.outline == ("S: E", "F", "R: E", "G")


def test_page_of() -> None:
    assert page_of("/docs/html/library/re.html", "/docs/html") == "library/re.html"
    assert page_of("/elsewhere/re.html", "/docs/html") is None


# -------------------------------------------------------------------------------- measures


def test_alpha_ndcg_vs_page_is_one_for_the_ideal_and_less_for_a_single_topic() -> None:
    labels = {"a1": "A", "a2": "A", "b1": "B"}
    pool = {"A": 2, "B": 1}
    assert alpha_ndcg_vs_page(["a1", "b1", "a2"], labels, pool) == pytest.approx(1.0)
    # a1, a2: gains 1, 0.5 vs the ideal's 1, 1, 0.5 (one A, the B, the other A).
    expected = (1 + 0.5 / np.log2(3)) / (1 + 1 / np.log2(3) + 0.5 / 2)
    assert alpha_ndcg_vs_page(["a1", "a2"], labels, pool) == pytest.approx(expected)
    # With A already shown once, the ideal leads with B; "a1" first earns 0.5.
    got = alpha_ndcg_vs_page(["a1"], labels, pool, prior={"A": 1}, k=1)
    assert got == pytest.approx(0.5)
    assert alpha_ndcg_vs_page(["x"], labels, {}) == 0.0


def _window(ids: list[str], text: str, status: str = "in-progress") -> WindowData:
    return WindowData(ids, text, [0.5] * len(ids), 1, ids[:1], 0.5, status, 1.0, 10)


def test_run_metrics_per_window() -> None:
    labels = {"a": "A", "b": "B", "c": "C"}
    w1 = _window(["a", "x"], "one two three four five six seven")
    w2 = _window(["a", "b"], "one two three four five six eight", "limit-reached")
    m = run_metrics([w1, w2], labels, ["A", "B", "C"], Counter(labels.values()))
    assert m.fact_reuse == [0.0, 0.5]
    assert m.subtopic_recall == pytest.approx([1 / 3, 2 / 3])
    assert m.written_recall == pytest.approx([1 / 3, 1 / 3])
    assert m.cwr6 == [0.0, 0.5]  # 1 of the 2 distinct 6-grams of W2 was in W1
    assert m.on_page_share == [0.5, 0.5]
    assert m.status == ["in-progress", "limit-reached"]
    assert first_exit(m.status) == 2
    assert first_exit(["in-progress"] * 3) == 3


def test_run_metrics_gives_no_cwr6_to_a_window_that_wrote_nothing() -> None:
    w1 = _window(["a"], "one two three four five six seven")
    m = run_metrics([w1, _window(["a"], "")], {}, ["A"], {})
    assert m.cwr6[0] == 0.0 and np.isnan(m.cwr6[1])
    assert m.words == [7.0, 0.0]


class _CountingEmbedder:
    model_id, dim = "toy", 2

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def encode(self, texts: list[str], *, batch_size: int = 32, progress: object = None
               ) -> np.ndarray:
        self.calls.append(list(texts))
        return unit(*[[len(t), 1.0] for t in texts])


def test_caching_embedder_embeds_each_text_once() -> None:
    inner = _CountingEmbedder()
    emb = CachingEmbedder(inner)
    a = emb.encode(["xx", "y", "xx"])
    b = emb.encode(["y", "zzz"])
    assert inner.calls == [["xx", "y"], ["zzz"]]
    assert np.array_equal(a[1], b[0]) and np.array_equal(a[0], a[2])
    assert np.allclose(b[1], unit([3.0, 1.0])[0])
    assert emb.encode([]).shape == (0, 2) and emb.model_id == "toy" and emb.computed == 3
