"""A row's largest dot product with a set of vectors, exact, without computing every product
exactly: residual pull at the memory limit.

Residual pull is max over the R residual sub-queries of `row · r_k`. Computing all R products
per row with numpy's einsum (row-independent, so a fact scores the same on any shard)
ran on one core at ~8 GFLOP/s and cost as much as a quarter of the whole scan at 1M facts.
Only the largest product's value is used, so:

1. all products are estimated with one BLAS sgemm (fast, but its rounding depends on the
   matrix's shape and the row's position, so it is never used as a value);
2. a bound on how far any float dot product of length d can be from the exact one,
   |fl(x·v) − x·v| ≤ γ_d Σ|x_i v_i| ≤ γ_d ‖x‖‖v‖ with γ_d = d·u / (1 − d·u) (Higham,
   Accuracy and Stability of Numerical Algorithms, §3.1; it holds for any summation order,
   with or without FMA), keeps every vector whose estimate is within twice that bound of the
   row's best estimate — the one whose exact product is largest is always among them;
3. those few products are computed with einsum, bit for bit what `einsum("ij,kj->ik")` gives
   (the same contiguous inner loop over the same bytes; `tests/test_max_dots.py`), and the
   largest is taken.

So the value is exactly today's, a function of the row and the vectors alone, whatever rows
share the call; the sgemm only decides which products to compute.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
from threadpoolctl import ThreadpoolController

# The shared pool of the row products: one set of worker threads for every per-row pass.
from cdr.retrieval.row_products import row_threads, shared_pool

__all__ = ["MIN_FILTERED", "max_row_dots"]

# Below this many row-vector products the exact einsum over all of them is cheap (< ~1 ms)
# and the filter's extra steps would cost more than they save.
MIN_FILTERED = 32_768
# Safety factor on the error bound (norms are themselves rounded; the bound is far from tight
# anyway: real errors are ~√d·u, the bound d·u).
_SLACK = 2.0
# Rows per step (~1.5 MB at d = 384): the chunk, its estimate and the gathered vectors stay
# in L2 through all the steps; per-step overhead (~20 µs) stays small beside the work.
CHUNK_ROWS = 1024

_LOCK = threading.Lock()
_HOLD: list[Any] = []  # [limiter, callers inside] while some caller holds BLAS to one thread
_CONTROLLER: ThreadpoolController | None = None


@contextmanager
def _blas_one_thread() -> Iterator[None]:
    """BLAS held to one thread for the estimates: a multi-threaded sgemm would wake OpenBLAS's
    workers, which then spin for a while and take the cores from the row pool's next pass
    (`cdr.retrieval.row_products`); each chunk's estimate is a fraction of a ms on one core.

    The limit is process-wide, so concurrent callers share one: the first sets it, the last
    restores the thread count it found (two limiters nested out of order would restore 1)."""
    global _CONTROLLER
    with _LOCK:
        if not _HOLD:
            if _CONTROLLER is None:
                _CONTROLLER = ThreadpoolController()
            _HOLD[:] = [_CONTROLLER.limit(limits=1, user_api="blas"), 0]
        _HOLD[1] += 1
    try:
        yield
    finally:
        with _LOCK:
            _HOLD[1] -= 1
            if not _HOLD[1]:
                _HOLD[0].restore_original_limits()
                _HOLD.clear()


def _exact_all(rows: np.ndarray, vectors: np.ndarray) -> np.ndarray:
    out: np.ndarray = np.einsum("ij,kj->ik", rows, vectors).max(axis=1)
    return out


def max_row_dots(rows: np.ndarray, vectors: np.ndarray, *, min_filtered: int | None = None
                 ) -> np.ndarray:
    """(M,): max over k of `rows[i] · vectors[k]`, equal to
    `np.einsum("ij,kj->ik", rows, vectors).max(axis=1)` (the same values; a zero's sign may
    differ), in `rows`' float type. `vectors` is (K, d) with K ≥ 1; `min_filtered` (default
    `MIN_FILTERED`, in rows × vectors) is the size below which every product is exact."""
    r = np.ascontiguousarray(rows)
    v = np.ascontiguousarray(vectors, dtype=r.dtype)
    m, k = r.shape[0], v.shape[0]
    limit = MIN_FILTERED if min_filtered is None else int(min_filtered)
    if k < 3 or m * k < limit or r.dtype.kind != "f":
        return _exact_all(r, v)
    out = np.empty(m, dtype=r.dtype)
    chunks = -(-m // CHUNK_ROWS)
    taken = itertools.count()

    def run(_task: int) -> None:  # a chunk's rows stay in cache through every step
        while (c := next(taken)) < chunks:
            s = c * CHUNK_ROWS
            out[s : s + CHUNK_ROWS] = _filtered(r[s : s + CHUNK_ROWS], v)

    # The chunks go to the row pool's threads (one BLAS thread each, the estimate held to
    # its caller), so BLAS's own threads never wake up to spin beside them.
    tasks = min(row_threads(), chunks)
    with _blas_one_thread():
        if tasks <= 1:
            run(0)
        else:
            list(shared_pool(tasks).map(run, range(tasks)))
    return out


def _filtered(r: np.ndarray, v: np.ndarray) -> np.ndarray:
    """`max_row_dots` of one chunk of rows: estimate, bound, exact products of the few."""
    estimate = r @ v.T
    if not np.isfinite(estimate).all():  # a non-finite row: the bound says nothing
        return _exact_all(r, v)
    m, d = r.shape
    u = float(np.finfo(r.dtype).eps) / 2
    gamma = d * u / (1 - d * u)
    row_norm = np.sqrt(np.einsum("ij,ij->i", r, r).astype(np.float64))
    vec_norm = float(np.sqrt(np.einsum("ij,ij->i", v, v).astype(np.float64)).max())
    # |estimate − einsum| ≤ 2γ‖x‖‖v‖ (both within γ‖x‖‖v‖ of the exact product), so the
    # exact maximum's estimate is within twice that of the best estimate.
    margin = (_SLACK * 4 * gamma * vec_norm) * row_norm + float(np.finfo(r.dtype).tiny) * d
    idx = np.arange(m)
    best_k = estimate.argmax(axis=1)
    best: np.ndarray = np.einsum("ij,ij->i", r, v[best_k])
    near = estimate >= (estimate[idx, best_k] - margin.astype(r.dtype))[:, None]
    near[idx, best_k] = False
    pi, pk = np.nonzero(near)
    if pi.size:
        np.maximum.at(best, pi, np.einsum("ij,ij->i", r[pi], v[pk]))
    return best
