"""Residual pull's exact maximum (issue 42): `max_row_dots` gives einsum's values whatever the
BLAS estimate, and a row's value whatever rows share the call — so a fact scores the same bits
on one CKF and on the shard holding it."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cdr.ranking import cdr_components, cdr_scores
from cdr.retrieval import max_dots
from cdr.retrieval.max_dots import max_row_dots


def _rows(rng: np.random.Generator, n: int, d: int, dtype: type) -> np.ndarray:
    """Unit rows with a wide spread of magnitudes, so summation order changes last bits."""
    f = rng.standard_normal((n, d)) * np.exp(rng.uniform(-6, 6, (n, d)))
    norms = np.linalg.norm(f, axis=1, keepdims=True)
    return (f / np.where(norms == 0, 1, norms)).astype(dtype)


def _exact(r: np.ndarray, v: np.ndarray) -> np.ndarray:
    return np.einsum("ij,kj->ik", r, v).max(axis=1)


@settings(max_examples=80, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(0, 1_500),
       d=st.sampled_from([1, 3, 16, 33, 384, 768]), k=st.integers(1, 24),
       dtype=st.sampled_from([np.float32, np.float64]), near_ties=st.booleans())
def test_the_maximum_is_einsums_bit_for_bit(seed, n, d, k, dtype, near_ties):
    rng = np.random.default_rng(seed)
    r = _rows(rng, n, d, dtype)
    v = _rows(rng, k, d, dtype)
    if near_ties and k >= 3:
        # Vectors a few ulps apart and exact duplicates: estimates tie or swap order.
        v[1] = v[0] * (1 + np.finfo(dtype).eps * rng.integers(-4, 5, d))
        v[2] = v[0]
        if n:
            r[: n // 2] = v[0]  # rows equal to a vector: products near 1, all close
    got = max_row_dots(r, v, min_filtered=0)
    assert got.dtype == np.dtype(dtype) and got.shape == (n,)
    assert np.array_equal(got, _exact(r, v))


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), m=st.integers(1, 400),
       cuts=st.lists(st.integers(1, 2_999), max_size=4))
def test_a_rows_maximum_does_not_depend_on_the_rows_beside_it(seed, m, cuts):
    """The BLAS estimate's rounding depends on the matrix's shape and a row's position; the
    value returned does not: any subset or slicing of the rows gives each row the same bits."""
    rng = np.random.default_rng(seed)
    n, d = 3_000, 384
    r = _rows(rng, n, d, np.float32)
    v = _rows(rng, 21, d, np.float32)
    whole = max_row_dots(r, v, min_filtered=0)
    sub = np.sort(rng.choice(n, m, replace=False))
    assert np.array_equal(max_row_dots(r[sub], v, min_filtered=0), whole[sub])
    edges = [0, *sorted(set(cuts)), n]
    parts = [max_row_dots(r[a:b], v, min_filtered=0) for a, b in itertools.pairwise(edges)]
    assert np.array_equal(np.concatenate(parts), whole)


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_non_finite_rows_fall_back_to_every_product(bad):
    rng = np.random.default_rng(5)
    r = _rows(rng, 200, 16, np.float32)
    v = _rows(rng, 8, 16, np.float32)
    r[3, 2] = bad
    np.testing.assert_array_equal(max_row_dots(r, v, min_filtered=0), _exact(r, v))


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), cuts=st.lists(st.integers(1, 5_999), max_size=4))
def test_cdr_scores_through_the_filter_are_the_same_bits_in_any_shard_layout(seed, cuts):
    """End to end with the filter on (it runs above `MIN_FILTERED` products, which the other
    face tests stay below): every fact's score and components equal one call's over the whole
    matrix, and equal the components computed with every residual product exact."""
    rng = np.random.default_rng(seed)
    n, d = 6_000, 384
    q = rng.standard_normal(d).astype(np.float32)
    q /= np.linalg.norm(q)
    f = _rows(rng, n, d, np.float32)
    near = rng.random(n) < 0.3
    f[near] = f[near] * 0.3 + q * 0.8
    f /= np.linalg.norm(f, axis=1, keepdims=True)
    cov = f[rng.choice(np.flatnonzero(near), 4)]
    res = f[rng.choice(np.flatnonzero(near), 12)]
    imp = rng.uniform(0.5, 1, n).astype(np.float32)
    counts = rng.integers(0, 3, n)
    w = np.full(4, 0.5)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(max_dots, "MIN_FILTERED", 10**12)  # every product exact
        want = cdr_scores(f, q, cov, w, res, imp, counts)
        rel = np.einsum("ij,j->i", f, q)
        exact_terms = cdr_components(f, rel, imp, counts, cov[0], res, True)
    assert np.isfinite(want).sum() > 100
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(max_dots, "MIN_FILTERED", 0)
        whole = cdr_scores(f, q, cov, w, res, imp, counts)
        edges = [0, *sorted(set(cuts)), n]
        parts = [cdr_scores(f[a:b], q, cov, w, res, imp[a:b], counts[a:b])
                 for a, b in itertools.pairwise(edges)]
        terms = cdr_components(f, rel, imp, counts, cov[0], res, True)
    np.testing.assert_array_equal(whole, want)
    np.testing.assert_array_equal(np.concatenate(parts), want)
    for a, b in zip(terms, exact_terms, strict=True):
        np.testing.assert_array_equal(a, b)


def test_blas_threads_are_restored_after_concurrent_callers():
    """The one-thread limit is process-wide: callers overlapping on several threads leave BLAS
    with the thread count it had before any of them."""
    from concurrent.futures import ThreadPoolExecutor

    from threadpoolctl import ThreadpoolController

    ctl = ThreadpoolController()
    before = [i["num_threads"] for i in ctl.info() if i["user_api"] == "blas"]
    rng = np.random.default_rng(8)
    r = _rows(rng, 5_000, 64, np.float32)
    v = _rows(rng, 21, 64, np.float32)
    want = _exact(r, v)
    with ThreadPoolExecutor(4) as ex:
        got = list(ex.map(lambda _: max_row_dots(r, v, min_filtered=0), range(16)))
    assert all(np.array_equal(g, want) for g in got)
    assert [i["num_threads"] for i in ctl.info() if i["user_api"] == "blas"] == before
