"""`cdr.spec`: the §7 interface with the spec's names and duck types."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cdr import spec
from cdr.errors import EmbeddingModelMismatchError, InvalidInputError
from tests.reference_cdr import reference_score


@dataclass
class Fact:
    embedding: list[float]
    content: str
    importance_weight: float = 1.0


@dataclass
class SQ:
    id: str
    text: str
    embedding: list[float] = field(default_factory=list)


class ToyModel:
    """A deterministic text→vector map (bag of letters) standing in for an embedder here:
    `update_session_after_window` only needs something with `.encode` and a model id."""

    model_id = "toy-letters"

    def encode(self, texts):
        out = np.zeros((len(texts), 26))
        for i, t in enumerate(texts):
            for ch in t.lower():
                if "a" <= ch <= "z":
                    out[i, ord(ch) - 97] += 1
        return out


def make_session(**kw):
    base = dict(coverage_set=[], residual_set=[], ngram_blacklist=set(), window_count=0,
                max_windows=5, safety_budget=1.0, embed_model=ToyModel(), model_id="toy-letters")
    base.update(kw)
    return SimpleNamespace(**base)


def test_constants():
    assert spec.CDR_MIN_RELEVANCE == 0.55
    assert spec.MIN_NOVELTY_FLOOR == 0.20
    assert spec.COVERAGE_PENALTY_CAP == 0.80


def test_tokenize_and_count_matching_ngrams():
    assert spec.tokenize("Pod-to-pod  traffic, IS direct!") == ["pod", "to", "pod", "traffic",
                                                                "is", "direct"]
    bl = {("a", "b", "c", "d", "e", "f"), ("x", "y", "z", "a", "b", "c")}
    assert spec.count_matching_ngrams("A b c d e f g", bl) == 1
    # distinct 6-grams: a repeated phrase counts once
    assert spec.count_matching_ngrams("a b c d e f a b c d e f", bl) == 1
    assert spec.count_matching_ngrams("short text", bl) == 0


def test_window_one_is_importance_times_relevance_unnormalised_inputs():
    q = [2.0, 0.0, 0.0]
    facts = [Fact([3.0, 0.0, 0.0], "a", 0.8), Fact([1.0, 1.0, 0.0], "b", 0.9),
             Fact([0.0, 1.0, 0.0], "c", 1.0)]
    sess = make_session(residual_set=[SQ("s1", "x", [0.0, 1.0, 0.0])])
    ranked = spec.cdr_rank(facts, q, sess)
    assert [f.content for f, _ in ranked] == ["a", "b"]  # c is gated (cos 0)
    assert ranked[0][1] == pytest.approx(0.8)
    assert ranked[1][1] == pytest.approx(0.9 * np.sqrt(0.5))


def test_full_formula_matches_reference_values():
    q = [1.0, 0.2, 0.0, 0.0]
    cov = [SimpleNamespace(embedding=[0.0, 1.0, 0.0, 0.0], depth_weight=0.9, window_number=0),
           SimpleNamespace(embedding=[1.0, 0.0, 1.0, 0.0], depth_weight=0.4, window_number=0)]
    res = [SQ("r", "r", [0.0, 0.0, 0.0, 1.0])]
    facts = [Fact([1.0, 0.5, 0.0, 0.9], "alpha beta gamma delta epsilon zeta eta", 0.7),
             Fact([1.0, 0.0, 0.0, 0.0], "one two three four five six", 0.9)]
    bl = {("alpha", "beta", "gamma", "delta", "epsilon", "zeta")}
    sess = make_session(coverage_set=cov, residual_set=res, ngram_blacklist=bl)
    got = dict((f.content, s) for f, s in spec.cdr_rank(facts, q, sess))
    for f in facts:
        want = reference_score(f.embedding, f.importance_weight, q,
                               [(c.embedding, c.depth_weight) for c in cov],
                               [r.embedding for r in res],
                               spec.count_matching_ngrams(f.content, bl))
        assert got[f.content] == pytest.approx(want, rel=1e-12)


@settings(max_examples=80, deadline=None)
@given(st.integers(2, 40), st.integers(1, 25), st.integers(0, 4), st.integers(0, 3),
       st.integers(0, 10_000))
def test_spec_rank_equals_reference(d, n, c, r, seed):
    rng = np.random.default_rng(seed)
    q = rng.normal(size=d)
    facts = [Fact((q + rng.normal(size=d) * 0.6).tolist(), f"f{i}", float(rng.uniform(0.5, 1)))
             for i in range(n)]
    cov = [SimpleNamespace(embedding=rng.normal(size=d).tolist(),
                           depth_weight=float(rng.choice([0.0, 0.2, 0.9])), window_number=0)
           for _ in range(c)]
    res = [SQ(f"r{j}", "t", rng.normal(size=d).tolist()) for j in range(r)]
    sess = make_session(coverage_set=cov, residual_set=res)
    got = spec.cdr_rank(facts, q.tolist(), sess)
    scores = [s for _, s in got]
    assert scores == sorted(scores, reverse=True)
    want = {}
    for f in facts:
        w = reference_score(f.embedding, f.importance_weight, q.tolist(),
                            [(e.embedding, e.depth_weight) for e in cov],
                            [x.embedding for x in res], 0)
        if w is not None:
            want[f.content] = w
    assert {f.content for f, _ in got} == set(want)
    for f, s in got:
        assert s == pytest.approx(want[f.content], rel=1e-9, abs=1e-12)


def test_bad_inputs():
    sess = make_session()
    with pytest.raises(InvalidInputError, match="empty"):
        spec.cdr_rank([], [1.0, 0.0], sess)
    with pytest.raises(InvalidInputError, match="zero vector"):
        spec.cdr_rank([Fact([0.0, 0.0], "z")], [1.0, 0.0], sess)
    with pytest.raises(InvalidInputError, match="NaN"):
        spec.cdr_rank([Fact([float("nan"), 1.0], "z")], [1.0, 0.0], sess)
    with pytest.raises(InvalidInputError, match="dimension"):
        spec.cdr_rank([Fact([1.0, 0.0], "z")], [1.0, 0.0, 0.0], sess)
    with pytest.raises(InvalidInputError, match="different dimensions"):
        spec.cdr_rank([Fact([1.0, 0.0], "z"), Fact([1.0, 0.0, 0.0], "y")], [1.0, 0.0], sess)
    bad = make_session(coverage_set=[SimpleNamespace(embedding=[1.0, 0.0], depth_weight=1.5,
                                                     window_number=0)])
    with pytest.raises(InvalidInputError, match="depth_weight"):
        spec.cdr_rank([Fact([1.0, 0.0], "z")], [1.0, 0.0], bad)


def test_should_terminate_priority_order():
    def check(session_kw, completeness, ratio):
        sess = make_session(**session_kw)
        return spec.should_terminate_window_loop(
            sess, SimpleNamespace(completeness_score=completeness),
            SimpleNamespace(mean_novelty_ratio=ratio))

    assert check({"window_count": 1}, 0.95, 0.9) == (True, "task-complete")
    assert check({"window_count": 1, "residual_set": [SQ("a", "a")]}, 0.95, 0.9) == (False, None)
    assert check({"window_count": 5, "residual_set": [SQ("a", "a")]}, 0.5, 0.05) == (
        True, "limit-reached")
    assert check({"window_count": 2, "residual_set": [SQ("a", "a")]}, 0.5, 0.149) == (
        True, "ckf-exhausted")
    assert check({"window_count": 2, "residual_set": [SQ("a", "a")]}, 0.5, 0.15) == (False, None)
    assert check({"window_count": 2, "residual_set": [SQ("a", "a")], "safety_budget": 0.1},
                 0.5, 0.9) == (True, "safety-budget-depleted")
    assert check({"window_count": 2, "residual_set": [SQ("a", "a")], "safety_budget": 0.11},
                 0.5, 0.9) == (False, None)
    assert check({"window_count": 1}, 0.91, 0.9) == (False, None)


def test_update_session_after_window():
    sq1, sq2 = SQ("sq-1", "networking"), SQ("sq-2", "storage")
    sess = make_session(residual_set=[sq1, sq2])
    report = SimpleNamespace(addressed_sub_queries=[sq1, sq2],
                             sub_query_depth={"sq-1": 0.9, "sq-2": 0.4})
    spec.update_session_after_window(sess, report, "one two three four five six seven")
    assert [e.depth_weight for e in sess.coverage_set] == [0.9, 0.4]
    assert [e.window_number for e in sess.coverage_set] == [0, 0]
    np.testing.assert_allclose(sess.coverage_set[0].embedding,
                               ToyModel().encode(["networking"])[0])
    # cumulative reading: sq-2 at 0.4 stays in the Residual Set, sq-1 at 0.9 leaves
    assert [s.id for s in sess.residual_set] == ["sq-2"]
    assert sess.ngram_blacklist == {("one", "two", "three", "four", "five", "six"),
                                    ("two", "three", "four", "five", "six", "seven")}
    assert sess.window_count == 1
    report2 = SimpleNamespace(addressed_sub_queries=[sq2], sub_query_depth={})  # default 0.5
    spec.update_session_after_window(sess, report2, "")
    assert sess.coverage_set[-1].depth_weight == 0.5
    assert sess.coverage_set[-1].window_number == 1
    assert sess.residual_set == []  # 0.4 + 0.5 >= 0.70


def test_update_literal_reading_with_zero_exit_depth():
    sq1 = SQ("sq-1", "x")
    sess = make_session(residual_set=[sq1], residual_exit_depth=0.0)
    spec.update_session_after_window(
        sess, SimpleNamespace(addressed_sub_queries=[sq1], sub_query_depth={"sq-1": 0.15}), "")
    assert sess.residual_set == []


def test_update_refuses_another_embedding_model():
    sess = make_session(model_id="text-embedding-3-large")
    with pytest.raises(EmbeddingModelMismatchError) as err:
        spec.update_session_after_window(
            sess, SimpleNamespace(addressed_sub_queries=[], sub_query_depth={}), "")
    assert "text-embedding-3-large" in str(err.value) and "toy-letters" in str(err.value)
