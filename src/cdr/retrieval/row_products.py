"""Per-row dot products on all cores, each row's value independent of how rows are grouped.

Why not BLAS: a gemv/gemm kernel takes rows in groups and picks its kernel by matrix size, so
a row's last bit depends on how many rows the matrix has and where the row sits; one CKF and
the shard holding a fact then disagree on a score. numpy's einsum computes each row
from that row and the vectors alone, but on one core, which left the array face ~1.9× a
multi-threaded BLAS scan at 1M rows.

So the rows are cut into fixed blocks and each block goes to einsum on a thread of a shared
pool (einsum releases the GIL). A block is a view of the same C-contiguous memory, so every row
is summed by the same inner loop over the same bytes as in one einsum over the whole matrix:
block size, thread count and shard layout never change a value
(`tests/test_row_products.py` compares bit for bit over random shapes, blocks and threads).
Inputs that are not C-contiguous, and small inputs (thread hand-off would cost more than it
saves), run as one inline einsum, exactly as before.
"""

from __future__ import annotations

import itertools
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from cdr import settings
from cdr.errors import InvalidInputError

__all__ = ["BLOCK_ROWS", "PARALLEL_MIN_ROWS", "ROW_THREADS_ENV", "row_products", "row_threads",
           "shared_pool"]

ROW_THREADS_ENV = "CDR_ROW_THREADS"
# Below this many row-vector products (rows × vectors) the product runs inline: at d = 384,
# ~2–3 ms on one core here, where handing blocks to threads (tens of µs) is already small.
PARALLEL_MIN_ROWS = 16_384
# Row-vector products per block (rows per block for one vector; at least 64 rows): ~12 MB of
# rows at d = 384, many blocks per thread at 1M rows so a core slowed by other load does not
# hold the rest back, few enough that hand-off costs nothing.
BLOCK_ROWS = 8_192

_POOL_LOCK = threading.Lock()
_POOL: tuple[int, int, ThreadPoolExecutor] | None = None  # (pid, workers, pool)


def row_threads() -> int:
    """Threads for row products: $CDR_ROW_THREADS, else `os.cpu_count()`."""
    env = settings.env(ROW_THREADS_ENV, "").strip()
    if env:
        if not env.isdigit() or int(env) < 1:
            raise InvalidInputError(f"{ROW_THREADS_ENV} must be a positive integer, got {env!r}")
        return int(env)
    return max(1, os.cpu_count() or 1)


def shared_pool(workers: int) -> ThreadPoolExecutor:
    """The shared pool, with at least `workers` threads (and at least one per CPU, so it
    rarely has to grow). A pool inherited through fork has no threads behind it (work sent
    there would never run), so a new process makes its own. A pool outgrown is not shut
    down: another caller may be handing it work; it ends when the last reference goes."""
    global _POOL
    with _POOL_LOCK:
        pid = os.getpid()
        if _POOL is None or _POOL[0] != pid or _POOL[1] < workers:
            size = max(workers, os.cpu_count() or 1)
            _POOL = (pid, size, ThreadPoolExecutor(size, thread_name_prefix="cdr-rows"))
        return _POOL[2]


def row_products(
    rows: np.ndarray, vectors: np.ndarray, *, threads: int | None = None,
    block_rows: int | None = None, min_rows: int | None = None,
) -> np.ndarray:
    """`rows[i] · vectors` for every row i: (N,) for one vector (d,), (N, K) for (K, d).

    Bit-identical to `np.einsum` over the whole matrix whatever `threads` (default
    `row_threads()`), `block_rows` (default `BLOCK_ROWS` row-vector products) or `min_rows`
    (default `PARALLEL_MIN_ROWS`, in rows × vectors: below it, inline); they only decide how
    the work is shared."""
    r = np.asarray(rows)
    v = np.asarray(vectors)
    spec = "ij,j->i" if v.ndim == 1 else "ij,kj->ik"
    n = r.shape[0] if r.ndim == 2 else 0
    # Work is counted in row-vector products: 13k gated rows against 21 vectors are as much
    # work as 280k rows against one, and are shared out the same way.
    k = 1 if v.ndim == 1 else max(v.shape[0], 1)
    block_rows = max(BLOCK_ROWS // k, 64) if block_rows is None else int(block_rows)
    min_rows = PARALLEL_MIN_ROWS if min_rows is None else int(min_rows)
    workers = row_threads() if threads is None else int(threads)
    if block_rows < 1:
        raise ValueError(f"block_rows must be at least 1, got {block_rows}")
    blocks = -(-n // block_rows)
    if workers <= 1 or n * k < min_rows or n < 2 or blocks < 2 or not r.flags.c_contiguous:
        out: np.ndarray = np.einsum(spec, r, v)
        return out
    out = np.empty((n,) if v.ndim == 1 else (n, v.shape[0]), dtype=np.result_type(r, v))

    tasks = min(workers, blocks)
    # At most `workers` tasks, each taking the next block until none is left (next() on a
    # count is atomic under the GIL), so a thread slowed by other load takes fewer blocks.
    taken = itertools.count()

    def run(_task: int) -> None:
        while (b := next(taken)) < blocks:
            s = b * block_rows
            out[s : s + block_rows] = np.einsum(spec, r[s : s + block_rows], v)

    # list(): wait for every task and re-raise the first error one met.
    list(shared_pool(tasks).map(run, range(tasks)))
    return out
