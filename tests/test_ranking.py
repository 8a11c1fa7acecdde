"""The vectorised ranking core against the spec's numbers and a per-fact reference."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from cdr.coverage import CoverageSet, ResidualSet, SubQuery
from cdr.errors import InvalidInputError
from cdr.ranking import cdr_scores, novelty_from_coverage, rank, rank_all
from tests.reference_cdr import reference_score


def unit(v: np.ndarray) -> np.ndarray:
    return (v / np.linalg.norm(v, axis=-1, keepdims=True)).astype(np.float32)


def basis(d: int, i: int) -> np.ndarray:
    e = np.zeros(d, np.float32)
    e[i] = 1.0
    return e


def mix(d: int, weights: dict[int, float]) -> np.ndarray:
    v = np.zeros(d, np.float32)
    for i, w in weights.items():
        v[i] = w
    return unit(v)


def residual_of(vectors: list[np.ndarray]) -> ResidualSet:
    sqs = [SubQuery(f"sq-{i}", f"t{i}") for i in range(len(vectors))]
    return ResidualSet(sqs, np.stack(vectors) if vectors else np.zeros((0, 8)), 8)


def test_window_one_equals_importance_times_relevance():
    rng = np.random.default_rng(1)
    q = unit(rng.normal(size=16))
    facts = unit(q + 0.6 * rng.normal(size=(200, 16)))
    imp = rng.uniform(0.5, 0.9, 200).astype(np.float32)
    res = ResidualSet(
        [SubQuery("a", "a")], unit(rng.normal(size=(1, 16))), 16
    )  # a full Residual Set must not pull in Window 1 (§2.7)
    r = rank_all(facts, q, importance=imp, coverage=CoverageSet(16), residual=res,
                 min_relevance=0.3)
    rel = facts @ q
    np.testing.assert_allclose(r.score, imp[r.indices] * rel[r.indices], rtol=1e-6)
    assert (r.novelty == 1.0).all() and (r.residual_pull == 0.0).all()
    base = rank_all(facts, q, importance=imp, mode="relevance", min_relevance=0.3)
    np.testing.assert_array_equal(r.indices, base.indices)


def test_fact_covered_at_one_of_two_subqueries_gets_half_penalty():
    # §2.3: a fact between a covered and an uncovered topic → about 50% penalty.
    d = 8
    covered, uncovered = basis(d, 0), basis(d, 1)
    fact = mix(d, {0: 1.0, 1: 1.0})  # cos 0.707 with each
    cs = CoverageSet(d)
    cs.add(covered, 0.9, 1)
    cs.add(uncovered, 0.0, 1)  # weight 0: present, contributes nothing
    r = rank(fact[None], np.array([1.0], np.float32), coverage=cs, min_relevance=0.0)
    assert r.coverage_score[0] == pytest.approx(math.sqrt(0.5), abs=1e-6)
    # Covered only at the first topic, with the second one covered too but at equal weight:
    cs2 = CoverageSet(d)
    cs2.add(covered, 0.9, 1)
    cs2.add(basis(d, 2), 0.9, 1)  # an unrelated covered topic
    half = mix(d, {0: 1.0, 1: 1.0})
    r2 = rank(half[None], np.array([1.0], np.float32), coverage=cs2, min_relevance=0.0)
    assert r2.coverage_score[0] == pytest.approx(math.sqrt(0.5) / 2, abs=1e-6)
    assert r2.novelty[0] == pytest.approx(1 - math.sqrt(0.5) / 2, abs=1e-6)


def test_floor_and_cap():
    d = 4
    cs = CoverageSet(d)
    cs.add(basis(d, 0), 1.0, 1)
    fact = basis(d, 0)[None]
    r = rank(fact, np.array([0.9], np.float32), coverage=cs, min_relevance=0.0)
    assert r.coverage_score[0] == pytest.approx(1.0)
    assert r.novelty[0] == pytest.approx(0.20)  # cap 0.80 → floor 0.20
    assert r.score[0] == pytest.approx(0.9 * 0.20, rel=1e-6)
    np.testing.assert_allclose(
        novelty_from_coverage(np.array([-0.5, 0.0, 0.3, 0.8, 0.95], np.float32)),
        [1.0, 1.0, 0.7, 0.2, 0.2], rtol=1e-6,
    )


def test_anti_correlated_coverage_does_not_boost():
    d = 4
    cs = CoverageSet(d)
    cs.add(basis(d, 0), 0.9, 1)
    fact = (-basis(d, 0))[None]
    r = rank(fact, np.array([0.7], np.float32), coverage=cs, min_relevance=0.0)
    assert r.coverage_score[0] == pytest.approx(-1.0)
    assert r.novelty[0] == 1.0
    assert r.score[0] == pytest.approx(0.7)


def test_gate_excludes_below_threshold_even_when_novel():
    facts = np.eye(3, dtype=np.float32)
    rel = np.array([0.54, 0.55, 0.9], np.float32)
    r = rank(facts, rel, min_relevance=0.55)
    assert sorted(r.indices.tolist()) == [1, 2]
    r2 = rank(facts, rel, min_relevance=0.65)
    assert r2.indices.tolist() == [2]
    for mode in ("relevance", "mmr"):
        assert sorted(rank(facts, rel, mode=mode).indices.tolist()) == [1, 2]


@pytest.mark.parametrize("count,expected", [(0, 0.0), (1, 0.15), (2, 0.30), (5, 0.75),
                                            (6, 0.80), (40, 0.80)])
def test_ngram_penalty_steps(count, expected):
    r = rank(np.eye(1, dtype=np.float32), np.array([1.0], np.float32),
             ngram_counts=np.array([count]), min_relevance=0.0)
    assert r.ngram_penalty[0] == pytest.approx(expected, abs=1e-6)
    assert r.score[0] == pytest.approx(1.0 - expected, abs=1e-6)
    assert r.ngram_activations == (1 if count else 0)


def test_residual_pull_lifts_a_fact_for_what_remains():
    d = 6
    q = basis(d, 0)
    cs = CoverageSet(d)
    cs.add(basis(d, 1), 0.9, 1)
    res = ResidualSet([SubQuery("r", "r")], basis(d, 2)[None], d)
    fact = mix(d, {0: 0.6, 2: 0.8})  # relevance 0.6, pull 0.8
    r = rank(fact[None], fact[None] @ q, coverage=cs, residual=res, min_relevance=0.55)
    assert r.residual_pull[0] == pytest.approx(0.8, abs=1e-6)
    assert r.score[0] == pytest.approx(0.8, abs=1e-6)  # novelty 1 (orthogonal to coverage)


def test_mmr_prefers_diverse_second_pick_and_relevance_does_not():
    facts = unit(np.array([[1, 0.05, 0, 0], [1, 0.06, 0, 0], [0.7, 0.7, 0, 0]], np.float32))
    rel = np.array([0.95, 0.94, 0.80], np.float32)
    assert rank(facts, rel, mode="relevance").indices.tolist()[:2] == [0, 1]
    mmr = rank(facts, rel, mode="mmr", mmr_lambda=0.5)
    assert mmr.indices.tolist()[:2] == [0, 2]
    assert mmr.extra["mmr_lambda"] == 0.5


def test_rank_rows_and_top_k():
    facts = np.eye(5, dtype=np.float32)
    rel = np.array([0.6, 0.9, 0.7, 0.8, 0.1], np.float32)
    r = rank(facts, rel, rows=np.array([10, 11, 12, 13, 14]), top_k=2)
    assert r.indices.tolist() == [11, 13]
    assert r.n_candidates == 4


def test_bad_inputs_raise_clear_errors():
    with pytest.raises(InvalidInputError, match="unknown ranking mode"):
        rank(np.eye(2, dtype=np.float32), np.ones(2, np.float32), mode="bm25")
    with pytest.raises(InvalidInputError, match="relevance has shape"):
        rank(np.eye(2, dtype=np.float32), np.ones(3, np.float32))
    f = np.eye(3, dtype=np.float32)
    q = basis(3, 0)
    empty = np.zeros((0, 3), np.float32)
    with pytest.raises(InvalidInputError, match="NaN"):
        cdr_scores(np.array([[np.nan, 0, 1]]), q, empty, np.zeros(0), empty, None, None)
    with pytest.raises(InvalidInputError, match="dimension"):
        cdr_scores(f, np.ones(4), empty, np.zeros(0), empty, None, None)
    with pytest.raises(InvalidInputError, match="empty"):
        cdr_scores(np.zeros((0, 3)), q, empty, np.zeros(0), empty, None, None)
    with pytest.raises(InvalidInputError, match="within"):
        cdr_scores(f, q, f[:1], np.array([1.5]), empty, None, None)
    with pytest.raises(InvalidInputError, match="within"):
        cdr_scores(f, q, f[:1], np.array([-0.1]), empty, None, None)
    with pytest.raises(InvalidInputError, match="infinite"):
        cdr_scores(f, np.array([np.inf, 0, 0]), empty, np.zeros(0), empty, None, None)
    cs = CoverageSet(3)
    with pytest.raises(InvalidInputError, match="zero vector"):
        cs.add(np.zeros(3), 0.5, 1)
    with pytest.raises(InvalidInputError, match="depth_weight"):
        cs.add(basis(3, 0), 1.2, 1)
    with pytest.raises(InvalidInputError, match="dimension"):
        cs.add(np.ones(4), 0.5, 1)
    with pytest.raises(InvalidInputError, match="depth_weight"):
        cs.add(basis(3, 0), float("nan"), 1)


# -- property: the vectorised core equals the per-fact reference ------------------------------

@st.composite
def scenarios(draw):
    d = draw(st.sampled_from([2, 3, 8, 32, 384]))
    n = draw(st.integers(1, 30))
    c = draw(st.integers(0, 6))
    r = draw(st.integers(0, 5))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    q = unit(rng.normal(size=d))
    # Facts near the query so that a realistic share passes the gate.
    facts = unit(q + draw(st.floats(0.1, 1.5)) * rng.normal(size=(n, d)) / np.sqrt(d) * 3)
    cov = unit(rng.normal(size=(c, d))) if c else np.zeros((0, d), np.float32)
    if c >= 2 and draw(st.booleans()):
        cov[1] = cov[0]  # duplicate entry
    weights = draw(hnp.arrays(np.float64, c, elements=st.sampled_from([0.0, 0.15, 0.4, 0.7, 0.9,
                                                                       1.0])))
    res = unit(rng.normal(size=(r, d))) if r else np.zeros((0, d), np.float32)
    imp = rng.uniform(0.5, 0.9, n).astype(np.float32)
    counts = rng.integers(0, 8, n)
    gate = draw(st.sampled_from([0.0, 0.3, 0.55]))
    return facts, q, cov, weights, res, imp, counts, gate


@settings(max_examples=150, deadline=None)
@given(scenarios())
def test_vectorised_core_equals_per_fact_reference(sc):
    facts, q, cov, weights, res, imp, counts, gate = sc
    rel = facts.astype(np.float64) @ q.astype(np.float64)
    # float32 vs exact arithmetic: stay clear of the gate's edge.
    assume(np.all(np.abs(rel - gate) > 1e-5))
    got = cdr_scores(facts, q, cov, weights, res, imp, counts, min_relevance=gate)
    for i in range(len(facts)):
        want = reference_score(
            facts[i].tolist(), float(imp[i]), q.tolist(),
            [(cov[j].tolist(), float(weights[j])) for j in range(len(cov))],
            [x.tolist() for x in res], int(counts[i]), gate,
        )
        if want is None:
            assert np.isnan(got[i])
        else:
            assert got[i] == pytest.approx(want, abs=2e-5)


@settings(max_examples=100, deadline=None)
@given(scenarios(), st.sampled_from(["cdr", "relevance", "mmr"]))
def test_order_is_by_score_and_novelty_in_range(sc, mode):
    facts, q, cov, weights, res, imp, counts, gate = sc
    cs = CoverageSet(facts.shape[1])
    for e, w in zip(cov, weights, strict=True):
        cs.add(e, float(w), 1)
    rs = ResidualSet([SubQuery(f"s{i}", "x") for i in range(len(res))], res, facts.shape[1])
    r = rank_all(facts, q, importance=imp, ngram_counts=counts, coverage=cs, residual=rs,
                 mode=mode, min_relevance=gate)
    assert np.all(np.diff(r.score) <= 1e-7)
    assert np.all((r.novelty >= 0.2 - 1e-7) & (r.novelty <= 1.0))
    assert len(set(r.indices.tolist())) == len(r.indices)
    assert np.all(facts[r.indices] @ q >= gate - 1e-6)


# -- validation at scan speed: the product validates the matrix ------------------------------

def _scores(f, q, gate=0.55):
    empty = np.zeros((0, len(q)), np.float32)
    return cdr_scores(f, q, empty, np.zeros(0), empty, None, None, min_relevance=gate)


def _rank_all(f, q, gate=0.55):
    return rank_all(f, q, min_relevance=gate)


@pytest.mark.parametrize("face", [_scores, _rank_all])
@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 40), d=st.sampled_from([3, 8, 384]), pos=st.integers(0, 10_000),
    col=st.integers(0, 10_000), bad=st.sampled_from([np.nan, np.inf, -np.inf]),
    near=st.booleans(), seed=st.integers(0, 2**32 - 1),
)
def test_non_finite_rows_refused_wherever_they_are(face, n, d, pos, col, bad, near, seed):
    """A NaN/inf anywhere — in a row above the gate or far below it, in a column where the
    query is 0 or not — is refused, naming the row."""
    rng = np.random.default_rng(seed)
    q = basis(d, 0)
    f = unit(rng.normal(size=(n, d)))
    if near:
        f[:, 0] = np.abs(f[:, 0]) + 2.0  # most rows pass the gate
        f = unit(f)
    i, j = pos % n, col % d
    f[i, j] = bad
    with pytest.raises(InvalidInputError, match=f"row {i} contains NaN or infinite"):
        face(f, q)


@pytest.mark.parametrize("face", [_scores, _rank_all])
def test_zero_and_non_unit_rows(face):
    """Zero rows: relevance 0, so they can pass only a gate ≤ 0. Below the gate a zero row
    is gated out (NaN score / not ranked), not refused; at a gate ≤ 0 it is refused. A row
    passing the gate must be a unit row."""
    f = np.stack([basis(3, 0), np.zeros(3, np.float32), basis(3, 1)])
    q = basis(3, 0)
    out = face(f, q, 0.55)
    if face is _scores:
        assert out[0] == pytest.approx(1.0) and np.isnan(out[1]) and np.isnan(out[2])
    else:
        assert out.indices.tolist() == [0]
    with pytest.raises(InvalidInputError, match="row 1 is a zero vector"):
        face(f, q, 0.0)
    f[0] *= 2.0
    with pytest.raises(InvalidInputError, match="row 0 is not a unit vector"):
        face(f, q, 0.55)
    f[0] = np.array([3e38, 3e38, 0], np.float32)  # sum overflows: not a unit row
    with pytest.raises(InvalidInputError, match="row 0 is not a unit vector"):
        face(f, unit(np.ones(3, np.float32)), 0.55)


@pytest.mark.parametrize("face", [_scores, _rank_all])
def test_bad_queries_and_ragged_facts(face):
    f = np.eye(3, dtype=np.float32)
    with pytest.raises(InvalidInputError, match="query: is a zero vector"):
        face(f, np.zeros(3, np.float32))
    with pytest.raises(InvalidInputError, match="query: contains NaN"):
        face(f, np.array([np.nan, 0, 0], np.float32))
    with pytest.raises(InvalidInputError, match="facts: not a numeric array"):
        face([[1.0, 0.0], [1.0]], basis(2, 0))
    with pytest.raises(InvalidInputError, match="dimension 4 does not match 3"):
        face(f, np.ones(4, np.float32))


def test_float32_input_is_not_copied_and_other_dtypes_are_accepted():
    """The array face uses a float32 matrix (or memory map) as given; float64 still works."""
    from cdr.vectors import as_fact_matrix

    f = np.eye(4, dtype=np.float32)
    assert as_fact_matrix(f, "facts") is f
    got = _scores(f.astype(np.float64), basis(4, 2))
    assert got[2] == pytest.approx(1.0) and np.isnan(got[[0, 1, 3]]).all()


def test_top_k_keeps_the_lowest_positions_among_scores_tied_at_the_cut() -> None:
    # Ties at the k-th score are decided by position (what a sharded merge reproduces), not
    # by where a partition put them.
    from cdr.ranking import _top

    score = np.array([0.5, 0.9, 0.5, 0.5, 0.1, 0.5, 0.9, 0.5], np.float32)
    assert _top(score, 3).tolist() == [1, 6, 0]
    assert _top(score, 5).tolist() == [1, 6, 0, 2, 3]
    for k in range(1, 9):
        assert _top(score, k).tolist() == np.argsort(-score, kind="stable")[:k].tolist()


# ------------------------------------------------------------------ row independence (issue 12)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32 - 1), st.sampled_from([16, 384]),
       st.sampled_from([np.float32, np.float64]), st.integers(1, 300))
def test_a_facts_score_does_not_depend_on_the_other_rows_ranked_with_it(seed, d, dtype, m):
    """What a shard computes for a fact equals, bit for bit, what one index computes for it:
    every component of a random subset of rows equals the whole matrix's at those rows (BLAS
    products failed this: their rounding depends on the row count and a row's position)."""
    from cdr.ranking import cdr_components, row_dots

    rng = np.random.default_rng(seed)
    n = 600
    f = rng.standard_normal((n, d))
    f[rng.integers(0, n, 100)] = f[rng.integers(0, n, 100)]  # exact duplicates
    f = (f / np.linalg.norm(f, axis=1, keepdims=True)).astype(dtype)
    q = unit(rng.standard_normal(d)).astype(dtype)
    cols = unit(rng.standard_normal((5, d))).astype(dtype)
    rel = row_dots(f, q)
    imp = rng.uniform(0.5, 1.0, n).astype(dtype)
    counts = rng.integers(0, 3, n)
    whole = cdr_components(f, rel, imp, counts, cols[0], cols[1:], True)
    sub = np.sort(rng.choice(n, min(m, n), replace=False))
    part = cdr_components(np.take(f, sub, axis=0), row_dots(f[sub], q), imp[sub],
                          counts[sub], cols[0], cols[1:], True)
    for a, b in zip(whole, part, strict=True):
        assert a.dtype == dtype
        np.testing.assert_array_equal(a[sub], b)
    np.testing.assert_array_equal(rel[sub], row_dots(f[sub], q))
    np.testing.assert_array_equal(row_dots(f, cols)[sub], row_dots(f[sub], cols))
    np.testing.assert_array_equal(row_dots(f[sub[:1]], cols)[0], row_dots(f, cols)[sub[0]])


def test_rank_all_and_cdr_scores_give_a_fact_the_same_score_in_any_matrix():
    """The array faces too: scores of rows inside a larger matrix equal those of the rows
    alone (and a duplicated row scores exactly like its twin, so ties stay ties)."""
    rng = np.random.default_rng(7)
    d, n = 384, 3000
    q = unit(rng.standard_normal(d))
    f = unit(q + rng.standard_normal((n, d)) * 0.045)
    f[1::2] = f[0::2]  # every row twice
    cov, res = unit(rng.standard_normal((3, d))), unit(q + rng.standard_normal((4, d)) * 0.06)
    full = cdr_scores(f, q, cov, np.full(3, 0.5), res, None, None)
    sub = np.arange(1, n, 7)
    np.testing.assert_array_equal(full[sub], cdr_scores(f[sub], q, cov, np.full(3, 0.5), res,
                                                        None, None))
    np.testing.assert_array_equal(full[0::2], full[1::2])
    coverage = CoverageSet(d)
    for c in cov:
        coverage.add(c, 0.5, 1)
    residual = ResidualSet([SubQuery(f"s{i}", "t") for i in range(4)], res, d)
    r_full = rank_all(f, q, coverage=coverage, residual=residual)
    r_sub = rank_all(f[sub], q, coverage=coverage, residual=residual)
    assert len(r_sub) > 100
    by_row = dict(zip(r_full.indices.tolist(), r_full.score.tolist(), strict=True))
    assert [by_row[int(sub[i])] for i in r_sub.indices] == r_sub.score.tolist()


def test_the_mode_table_is_the_one_dispatch_of_every_ranking_mode():
    """`MODE_RULES` lists exactly the modes; the one-pass ones are those a shard ranks, and the
    window loop ships exactly those to a ranking index."""
    from cdr.ranking import MODE_RULES, ONE_PASS_MODES, RANKING_MODES
    from cdr.window.loop import SHARD_RANKED_MODES

    assert tuple(MODE_RULES) == RANKING_MODES
    assert ONE_PASS_MODES == ("cdr", "relevance") == SHARD_RANKED_MODES
    assert [m for m, r in MODE_RULES.items() if r.uses_ngrams] == ["cdr"]


@pytest.mark.parametrize("mode", ["mmr", "sections", "bogus"])
def test_score_terms_refuses_a_mode_that_is_not_one_pass(mode):
    from cdr.ranking import score_terms

    one = np.ones(1, np.float32)
    with pytest.raises(InvalidInputError, match=repr(mode)):
        score_terms(mode, np.ones((1, 2), np.float32), one, one, None, None,
                    np.zeros((0, 2), np.float32), False)


def test_score_terms_gives_rank_its_scores_in_both_one_pass_modes():
    """`rank` orders by exactly the scores `score_terms` computes (what a shard computes)."""
    from cdr.ranking import score_terms

    rng = np.random.default_rng(3)
    emb = rng.normal(size=(12, 8)).astype(np.float32)
    emb /= np.linalg.norm(emb, axis=1, keepdims=True)
    rel = rng.uniform(0.6, 0.9, 12).astype(np.float32)
    imp = rng.uniform(0.5, 1.0, 12).astype(np.float32)
    for mode in ("cdr", "relevance"):
        score = score_terms(mode, emb, rel, imp, None, None, np.zeros((0, 8), np.float32),
                            False)[0]
        r = rank(emb, rel, importance=imp, mode=mode, min_relevance=0.0)
        assert r.indices.tolist() == np.argsort(-score, kind="stable").tolist()
        assert np.array_equal(r.score, score[r.indices])
    assert np.array_equal(score_terms("relevance", emb, rel, imp, None, None,
                                      np.zeros((0, 8), np.float32), False)[0], imp * rel)
