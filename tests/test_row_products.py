"""Row products on all cores (issue 26): every value bit-identical to one single-threaded
einsum over the whole matrix, whatever the block size, thread count or row layout."""

from __future__ import annotations

import itertools
import multiprocessing

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cdr.errors import InvalidInputError
from cdr.ranking import cdr_scores, rank_all, row_dots
from cdr.retrieval import row_products as rp


def _rows(seed: int, n: int, d: int, dtype: type) -> np.ndarray:
    """Unit-ish rows with a wide spread of magnitudes, so that summing a row's products in
    another order or grouping changes its last bits (checked in
    `test_the_data_is_sensitive_to_summation_order`)."""
    rng = np.random.default_rng(seed)
    f = rng.standard_normal((n, d)) * np.exp(rng.uniform(-6, 6, (n, d)))
    norms = np.linalg.norm(f, axis=1, keepdims=True)
    return (f / np.where(norms == 0, 1, norms)).astype(dtype)


def _einsum(r: np.ndarray, v: np.ndarray) -> np.ndarray:
    return np.einsum("ij,j->i" if v.ndim == 1 else "ij,kj->ik", r, v)


@settings(max_examples=120, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(0, 2_500),
       d=st.sampled_from([1, 3, 16, 33, 384]), dtype=st.sampled_from([np.float32, np.float64]),
       k=st.sampled_from([None, 1, 2, 6, 21]), block=st.integers(1, 3_000),
       threads=st.integers(1, 8), min_rows=st.sampled_from([0, 1, 500, 10**6]))
def test_parallel_row_products_equal_one_einsum_bit_for_bit(
    seed, n, d, dtype, k, block, threads, min_rows
):
    f = _rows(seed, n, d, dtype)
    rng = np.random.default_rng(seed + 1)
    v = rng.standard_normal(d if k is None else (k, d)).astype(dtype)
    want = _einsum(f, v)
    got = rp.row_products(f, v, threads=threads, block_rows=block, min_rows=min_rows)
    assert got.dtype == want.dtype and got.shape == want.shape
    assert np.array_equal(got, want)
    one = rp.row_products(f, v, threads=1)
    assert np.array_equal(got, one)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(2, 1_200), block=st.integers(1, 700),
       threads=st.integers(2, 6), start=st.integers(0, 50))
def test_a_rows_value_is_the_same_in_any_slice_or_shard_of_the_matrix(
    seed, n, block, threads, start
):
    """A shard holds a slice of the rows (and a gated block a copy of some): each row's value
    there, computed in parallel, equals the whole matrix's single-threaded value."""
    f = _rows(seed, n + start, 384, np.float32)
    q = np.random.default_rng(seed).standard_normal(384).astype(np.float32)
    whole = _einsum(f, q)
    part = rp.row_products(f[start:], q, threads=threads, block_rows=block, min_rows=0)
    assert np.array_equal(part, whole[start:])
    sub = np.sort(np.random.default_rng(seed).choice(n + start, n // 2 + 1, replace=False))
    gathered = rp.row_products(np.take(f, sub, axis=0), q, threads=threads, block_rows=block,
                               min_rows=0)
    assert np.array_equal(gathered, whole[sub])


def test_the_data_is_sensitive_to_summation_order():
    """The properties above could fail: on these rows, summing the products in another
    grouping (BLAS, reversed order) changes some float32 values."""
    f = _rows(7, 4_000, 384, np.float32)
    q = np.random.default_rng(8).standard_normal(384).astype(np.float32)
    want = _einsum(f, q)
    reversed_sum = np.add.reduce((f * q)[:, ::-1], axis=1, dtype=np.float32)
    assert not np.array_equal(reversed_sum, want)
    assert not np.array_equal(np.cumsum(f * q, axis=1, dtype=np.float32)[:, -1], want)


def test_non_contiguous_rows_give_one_einsums_values():
    f = _rows(3, 3_000, 40, np.float32)
    q = np.random.default_rng(4).standard_normal(20).astype(np.float32)
    for view in (np.asfortranarray(f[:, :20]), f[:, ::2], f[::2, :20]):
        got = rp.row_products(view, q, threads=4, block_rows=7, min_rows=0)
        assert np.array_equal(got, _einsum(view, q))


def test_memory_mapped_rows_give_the_in_memory_values(tmp_path):
    f = _rows(5, 20_000, 384, np.float32)
    path = tmp_path / "rows.f32"
    f.tofile(path)
    mm = np.memmap(path, dtype=np.float32, mode="r", shape=f.shape)
    q = np.random.default_rng(6).standard_normal(384).astype(np.float32)
    assert np.array_equal(rp.row_products(mm, q, threads=3, block_rows=999), _einsum(f, q))


def test_errors_in_a_block_reach_the_caller():
    f = np.ones((50_000, 8), np.float32)
    with pytest.raises(ValueError):
        rp.row_products(f, np.ones(9, np.float32), threads=4)
    with pytest.raises(ValueError, match="block_rows"):
        rp.row_products(f, np.ones(8, np.float32), block_rows=0)


def test_threads_come_from_the_environment(monkeypatch):
    monkeypatch.delenv(rp.ROW_THREADS_ENV, raising=False)
    assert rp.row_threads() == max(1, __import__("os").cpu_count() or 1)
    monkeypatch.setenv(rp.ROW_THREADS_ENV, "3")
    assert rp.row_threads() == 3
    for bad in ("0", "-2", "two", "1.5"):
        monkeypatch.setenv(rp.ROW_THREADS_ENV, bad)
        with pytest.raises(InvalidInputError, match=rp.ROW_THREADS_ENV):
            rp.row_threads()


def test_small_inputs_run_inline_without_the_pool(monkeypatch):
    def no_pool(_workers: int) -> None:
        raise AssertionError("the pool was used for a small input")

    monkeypatch.setattr(rp, "shared_pool", no_pool)
    f = _rows(1, rp.PARALLEL_MIN_ROWS - 1, 16, np.float32)
    q = np.ones(16, np.float32)
    assert np.array_equal(rp.row_products(f, q, threads=8), _einsum(f, q))
    assert np.array_equal(row_dots(f, q), _einsum(f, q))


def test_few_rows_against_many_vectors_are_shared_out(monkeypatch):
    """Work is rows × vectors: 2,000 gated rows against 21 vectors go to the pool."""
    used = []
    real = rp.shared_pool

    def spy(workers: int):
        used.append(workers)
        return real(workers)

    monkeypatch.setattr(rp, "shared_pool", spy)
    f = _rows(2, 2_000, 384, np.float32)
    v = np.random.default_rng(3).standard_normal((21, 384)).astype(np.float32)
    assert np.array_equal(rp.row_products(f, v, threads=2), _einsum(f, v))
    assert used == [2]


def test_concurrent_callers_with_different_thread_counts_all_get_exact_values():
    """Callers on several threads (a gateway's requests) share the pool, each with its own
    thread count; the pool growing under one caller must not fail another."""
    from concurrent.futures import ThreadPoolExecutor

    f = _rows(9, 30_000, 64, np.float32)
    vs = [np.random.default_rng(s).standard_normal(64).astype(np.float32) for s in range(12)]
    want = [_einsum(f, v) for v in vs]
    with ThreadPoolExecutor(6) as callers:
        got = list(callers.map(
            lambda i: rp.row_products(f, vs[i], threads=1 + i, block_rows=997), range(12)))
    for g, w in zip(got, want, strict=True):
        assert np.array_equal(g, w)


def _child(conn) -> None:  # pragma: no cover - runs in a forked process
    f = np.ones((40_000, 4), np.float32)
    conn.send(float(rp.row_products(f, np.ones(4, np.float32), threads=2).sum()))


def test_a_forked_process_gets_its_own_pool():
    """A pool inherited through fork has no threads; work sent there would hang."""
    rp.row_products(np.ones((40_000, 4), np.float32), np.ones(4, np.float32), threads=2)
    ctx = multiprocessing.get_context("fork")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_child, args=(child,))
    proc.start()
    try:
        assert parent.poll(60), "the forked process did not finish its row products"
        assert parent.recv() == 160_000.0
    finally:
        proc.join(10)
        if proc.is_alive():
            proc.kill()


@pytest.mark.parametrize("threads", ["1", "2", "5"])
def test_cdr_scores_and_rank_all_are_the_same_on_any_thread_count(monkeypatch, threads):
    """The public faces above the threshold: scores for every fact, and the ranking's values,
    bit-identical to one thread's."""
    rng = np.random.default_rng(11)
    n, d = 3 * rp.PARALLEL_MIN_ROWS + 17, 64
    f = _rows(12, n, d, np.float32)
    f /= np.linalg.norm(f, axis=1, keepdims=True)
    q = f[:50].mean(axis=0)
    q = (q / np.linalg.norm(q)).astype(np.float32)
    f[:2_000] = f[:2_000] * 0.3 + q * 0.7  # a share near the query passes the gate
    f /= np.linalg.norm(f, axis=1, keepdims=True)
    cov = f[rng.integers(0, 2_000, 5)]
    res = f[rng.integers(0, 2_000, 4)]
    imp = rng.uniform(0.5, 1, n).astype(np.float32)
    counts = rng.integers(0, 3, n)
    args = (f, q, cov, np.full(5, 0.5), res, imp, counts)
    monkeypatch.setenv(rp.ROW_THREADS_ENV, "1")
    want = cdr_scores(*args)
    want_rank = rank_all(f, q, importance=imp, ngram_counts=counts, top_k=40)
    assert np.isfinite(want).sum() > 100
    monkeypatch.setenv(rp.ROW_THREADS_ENV, threads)
    monkeypatch.setattr(rp, "BLOCK_ROWS", 1_001)
    got = cdr_scores(*args)
    assert np.array_equal(got, want, equal_nan=True)
    got_rank = rank_all(f, q, importance=imp, ngram_counts=counts, top_k=40)
    assert np.array_equal(got_rank.indices, want_rank.indices)
    assert np.array_equal(got_rank.score, want_rank.score)
    assert np.array_equal(got_rank.relevance, want_rank.relevance)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), cuts=st.lists(st.integers(1, 5_999), max_size=4),
       block=st.integers(64, 5_000), threads=st.integers(1, 6),
       min_rows=st.sampled_from([0, 2_000, 10**7]))
def test_every_score_is_the_same_bits_in_any_shard_layout_block_size_and_thread_count(
    seed, cuts, block, threads, min_rows
):
    """The array face end to end (issue 26): `cdr_scores` of a matrix cut into shards at any
    rows, each shard scored with its own block size and thread count, gives every fact the
    bits one single-threaded call over the whole matrix gives it — the relevance, the coverage
    and residual-pull products of the gated rows, and the score built from them."""
    rng = np.random.default_rng(seed)
    n, d = 6_000, 384
    q = rng.standard_normal(d).astype(np.float32)
    q /= np.linalg.norm(q)
    f = _rows(seed, n, d, np.float32)
    near = rng.random(n) < 0.3  # a share near the query passes the gate
    f[near] = f[near] * 0.3 + q * 0.8
    f /= np.linalg.norm(f, axis=1, keepdims=True)
    cov = f[rng.choice(np.flatnonzero(near), 4)]
    res = f[rng.choice(np.flatnonzero(near), 6)]
    imp = rng.uniform(0.5, 1, n).astype(np.float32)
    counts = rng.integers(0, 3, n)
    w = np.full(4, 0.5)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(rp.ROW_THREADS_ENV, "1")
        mp.setattr(rp, "PARALLEL_MIN_ROWS", 10**9)
        whole = cdr_scores(f, q, cov, w, res, imp, counts)
    assert np.isfinite(whole).sum() > 100
    edges = [0, *sorted(set(cuts)), n]
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(rp.ROW_THREADS_ENV, str(threads))
        mp.setattr(rp, "BLOCK_ROWS", block)
        mp.setattr(rp, "PARALLEL_MIN_ROWS", min_rows)
        parts = [cdr_scores(f[a:b], q, cov, w, res, imp[a:b], counts[a:b])
                 for a, b in itertools.pairwise(edges) if b > a]
    np.testing.assert_array_equal(np.concatenate(parts), whole)
