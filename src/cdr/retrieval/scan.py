"""Phase 1 scan engine: the rows of a memory-mapped fact matrix that pass a relevance gate,
with their exact float32 relevance, without ever reading the whole matrix into memory.

Three paths, chosen by what is on disk:

- **float32, exact** (the default): one BLAS mat-vec over the map, as before.
- **float16, exact**: a compiled kernel converts each half to float32 in registers (exact: every
  float16 is a float32) and accumulates in float32. numpy has no float16 BLAS path, and block
  conversion (`astype` per block, then BLAS) still costs ~4–5× the float32 scan; the kernel
  reads half the bytes of a float32 scan, so it is the faster of the two.
- **int8 quantised copy + exact rescoring** (for large stores): a sidecar copy of the rows as
  int8 codes with a per-row scale `s` is scanned first; for each row the kernel computes an
  *upper bound* of its cosine, `s·(c·q) + ‖x − s·c‖ + ε`, where `‖x − s·c‖` (the row's
  quantisation error, stored per row) bounds `(x − s·c)·q` for a unit query by Cauchy–Schwarz,
  and ε covers float32 rounding of the approximate dot. Rows whose bound is below the gate
  cannot pass; the survivors (the passing rows plus a thin band just under the gate) are
  rescored exactly from the float32/float16 rows. So the gated set is exactly the exact
  path's — recall 1, not "≥ 0.999" — and the relevances returned are exact float32, while the
  scan reads a quarter of the bytes.

The kernels need numba (the `fast` extra). Without it, float16 falls back to numpy block
conversion and the int8 copy is not used: results are the same, only slower.

Exactness contract: the relevance of a row is computed from the row's own bytes by one
row-independent routine per storage type — numpy's einsum for float32 (the full scan, the
rescoring of int8 survivors and the tail past the copy alike), the `f16` kernel for float16 —
so it is bit-identical whichever path, block or shard reached the row (a shard and
one CKF must rank near-ties alike). BLAS is not used: its rounding depends on the row count.

The int8 copy lives beside the store's array files as ``quant.e{epoch}.i8`` (codes, n × d) and
``quant.e{epoch}.f32`` (n × 2: scale, error bound). Rows are append-only within an epoch, so a
copy of the first n rows stays valid as the store grows; rows past it are scanned exactly.
"""

from __future__ import annotations

import contextlib
import importlib.util
import mmap
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cdr.retrieval.row_products import row_products

# The `fast` extra (numba): whether it is installed is a look-up, not an import. Every process
# that touches a fact index imports this module (each gateway, each `cdr` command, each test
# worker), and importing numba took 0.4-0.8 s of a 1.5 s gateway import on the build machine
# (`python -X importtime -c "import cdr.gateway.app"`), spent by every process although only a
# float16 store or an int8 copy runs a kernel. `_kernels` imports it on first use; a numba that
# is installed but cannot be imported (built for another numpy) leaves the exact numpy paths,
# as if it were absent.
HAVE_KERNELS = importlib.util.find_spec("numba") is not None
# From this many rows on, the store keeps the int8 copy (its writer extends it after every
# commit that adds rows); below it exact float32 is the only path. Chosen by measurement
# (bench/results/ranking.md, scan paths): at 100k rows the copy saved nothing in one run
# (0.96x the float32 scan's CPU; rescoring the ~1% that pass plus the kernels' fixed cost) and
# up to 0.23x in another, at 200k it is clearly ahead (0.35x), and there the exact scan alone
# (~16 ms of CPU) reaches most of the gateway's 25 ms envelope budget. The copy costs 26% more
# disk and ~7 us of CPU per row to build (negligible next to embedding a real fact).
QUANT_MIN_ROWS = 200_000
# Slack on the int8 bound for float32 rounding of s·(c·q): |error| ≤ d·u·s·Σ|c_j q_j| ≤ d·u·s‖c‖
# with u = 2⁻²⁴, i.e. ≤ 2.3e-5 at d = 384 for unit rows; 1e-4 leaves 4× headroom.
BOUND_EPS = 1e-4
_BLOCK = 65_536  # rows per block when building the copy or converting without kernels
_POW112 = np.float32(2.0**112)  # float16 bits << 13 read as float32, times 2^112 = the value
_KERNEL_LOCK = threading.Lock()  # numba's default threading layer is not re-entrant


# ----------------------------------------------------------------------------- kernels

def _kernels() -> dict[str, Callable[..., None]] | None:
    """The scan kernels, compiled (or loaded from numba's cache) once per process; None
    without numba (or with `HAVE_KERNELS` off), when the numpy paths run instead."""
    global _COMPILED
    if not HAVE_KERNELS:
        return None
    if _COMPILED is not None:
        return _COMPILED
    try:
        import numba as nb
    except ImportError:  # installed but unusable: the exact numpy paths
        return None
    jit = nb.njit(parallel=True, fastmath=True, cache=True, nogil=True)

    @jit
    def int8_bound(codes, params, q, lo, active, out):  # type: ignore[no-untyped-def]
        # out[i] = 1 if the row's relevance upper bound reaches lo and the row is active
        n, d = codes.shape
        for i in nb.prange(n):
            acc = np.float32(0.0)
            for j in range(d):
                acc += np.float32(codes[i, j]) * q[j]
            ub = params[i, 0] * acc + params[i, 1]
            out[i] = 1 if (ub >= lo and active[i]) else 0

    @jit
    def dot_rows_f16(bits, rows, start, q112, out):  # type: ignore[no-untyped-def]
        # float16 → float32 without a branch: shift exponent+mantissa into float32 position,
        # read as float32 (value / 2^112, subnormals included), times 2^112 (folded into q112).
        d = bits.shape[1]
        gathered = rows.shape[0] > 0
        for k in nb.prange(out.shape[0]):
            i = rows[k] if gathered else start + k
            buf = np.empty(d, np.uint32)
            f = buf.view(np.float32)
            for j in range(d):
                h = np.uint32(bits[i, j])
                buf[j] = ((h & np.uint32(0x7FFF)) << np.uint32(13)) | (
                    (h & np.uint32(0x8000)) << np.uint32(16))
            acc = np.float32(0.0)
            for j in range(d):
                acc += f[j] * q112[j]
            out[k] = acc

    @jit
    def quantise_rows(x, codes, params):  # type: ignore[no-untyped-def]
        n, d = x.shape
        for i in nb.prange(n):
            peak = np.float32(0.0)
            for j in range(d):
                peak = max(peak, abs(x[i, j]))
            s = peak / np.float32(127.0) if peak > 0 else np.float32(1.0)
            err = 0.0  # float64
            for j in range(d):
                c = min(max(np.floor(x[i, j] / s + np.float32(0.5)), -127.0), 127.0)
                codes[i, j] = np.int8(c)
                r = np.float64(x[i, j]) - np.float64(s) * c
                err += r * r
            params[i, 0] = s
            params[i, 1] = np.float32(np.sqrt(err) * (1 + 1e-5) + 1e-9)

    _COMPILED = {"int8_bound": int8_bound, "f16": dot_rows_f16,
                 "quantise": quantise_rows}
    return _COMPILED


_COMPILED: dict[str, Callable[..., None]] | None = None


def exact_relevance(
    emb: np.ndarray, rows: np.ndarray | None, q: np.ndarray,
    start: int = 0, stop: int | None = None,
) -> np.ndarray:
    """Exact float32 cosine of `rows` of `emb` (float32 or float16), or of rows start…stop when
    `rows` is None, with the unit query `q`.

    float32 rows: einsum per block, the same routine as the full scan (`_blas_similarities`),
    so a row's value never depends on the path. float16 with kernels: one fixed-order float32
    sum per row; without, numpy on the rows converted to float32 (also exact)."""
    stop = emb.shape[0] if stop is None else stop
    idx = np.zeros(0, np.int64) if rows is None else np.ascontiguousarray(rows, dtype=np.int64)
    count = (stop - start) if rows is None else idx.shape[0]
    out = np.empty(count, np.float32)
    if not count:
        return out
    kernels = _kernels() if emb.dtype == np.float16 else None
    if kernels is not None:
        base = np.asarray(emb)
        with _KERNEL_LOCK:
            kernels["f16"](base.view(np.uint16), idx, start, (q * _POW112).astype(np.float32),
                           out)
        return out
    for s in range(0, count, _BLOCK):
        block = (np.take(emb, idx[s : s + _BLOCK], axis=0) if rows is not None
                 else emb[start + s : start + min(s + _BLOCK, count)])
        out[s : s + _BLOCK] = np.einsum("ij,j->i", block.astype(np.float32, copy=False), q)
    return out


# --------------------------------------------------------------------- the int8 copy

@dataclass(frozen=True)
class QuantisedRows:
    """int8 codes of the first `n` rows of a store, per-row scale and error bound."""

    codes: np.ndarray  # (n, d) int8
    params: np.ndarray  # (n, 2) float32: scale s, bound ≥ ‖x − s·c‖₂

    @property
    def n(self) -> int:
        return int(self.codes.shape[0])

    @property
    def nbytes(self) -> int:
        return int(self.codes.nbytes + self.params.nbytes)


def quantise(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(codes, params) for float rows: symmetric per-row int8, error norm rounded up.

    The error ‖x − s·c‖ is taken with the float32 scale actually stored, summed in float64
    and scaled up by 1 + 1e-5 before rounding to float32, so rounding can only make the bound
    looser, never tighter. With kernels this is one parallel pass; else numpy in float64."""
    x = np.ascontiguousarray(rows)
    n, d = x.shape
    codes = np.empty((n, d), np.int8)
    params = np.empty((n, 2), np.float32)
    kernels = _kernels() if x.dtype in (np.float32, np.float16) and n else None
    if kernels is not None:
        with _KERNEL_LOCK:
            kernels["quantise"](x.astype(np.float32, copy=False), codes, params)
        return codes, params
    x64 = x.astype(np.float64)
    peak = np.abs(x64).max(axis=1) if n else np.zeros(0)
    scale = np.where(peak > 0, (peak / 127.0), 1.0).astype(np.float32)
    c = np.clip(np.floor(x64 / scale[:, None] + 0.5), -127, 127)
    err = np.linalg.norm(x64 - c * scale[:, None].astype(np.float64), axis=1)
    codes[:] = c
    params[:, 0] = scale
    params[:, 1] = (err * (1 + 1e-5) + 1e-9).astype(np.float32)
    return codes, params


def wants_quantised(n_rows: int) -> bool:
    """Whether a store of `n_rows` facts keeps an int8 copy: at `QUANT_MIN_ROWS` and above,
    and only where the kernels that scan it exist (without numba `select` ignores a copy).
    The store's writer extends the copy after every commit that adds rows."""
    return n_rows >= QUANT_MIN_ROWS and _kernels() is not None


def quant_paths(root: Path, epoch: int) -> tuple[Path, Path]:
    return root / f"quant.e{epoch}.i8", root / f"quant.e{epoch}.f32"


def covered_rows(root: Path, epoch: int, dim: int) -> int:
    """Rows the int8 copy holds complete (codes and params both written)."""
    codes, params = quant_paths(root, epoch)
    if not codes.exists() or not params.exists():
        return 0
    return min(codes.stat().st_size // dim, params.stat().st_size // 8)


def build_quantised(
    root: Path, epoch: int, emb: np.ndarray,
    progress: Callable[[int, int], None] | None = None,
) -> int:
    """Extend the int8 copy of `emb` (the store's committed rows) to all its rows.

    Incremental (only rows past the copy are read) and crash-safe: codes are appended before
    params, and a reader trusts only rows present in both, so an interrupted build leaves a
    shorter valid copy; the next build cuts the torn tail and continues. Returns rows covered."""
    n, dim = emb.shape
    codes_p, params_p = quant_paths(root, epoch)
    start = covered_rows(root, epoch, dim)
    for p, size in ((codes_p, start * dim), (params_p, start * 8)):
        if not p.exists():
            p.touch()
        if p.stat().st_size != size:
            os.truncate(p, size)
    if start >= n:
        return start
    with open(codes_p, "r+b") as fc, open(params_p, "r+b") as fp:
        fc.seek(start * dim)
        fp.seek(start * 8)
        for s in range(start, n, _BLOCK):
            codes, params = quantise(emb[s : s + _BLOCK])
            codes.tofile(fc)
            fc.flush()
            params.tofile(fp)
            fp.flush()
            if progress is not None:
                progress(min(s + _BLOCK, n), n)
        os.fsync(fc.fileno())
        os.fsync(fp.fileno())
    return int(n)


_OPEN: dict[tuple[str, int, int], QuantisedRows] = {}
_OPEN_LOCK = threading.Lock()


def open_quantised(root: Path, epoch: int, dim: int, n_rows: int) -> QuantisedRows | None:
    """The int8 copy's committed prefix (≤ n_rows), memory-mapped; None if absent or empty."""
    n = min(covered_rows(root, epoch, dim), n_rows)
    if n == 0:
        return None
    key = (str(root), epoch, n)
    with _OPEN_LOCK:
        q = _OPEN.get(key)
        if q is None:
            codes_p, params_p = quant_paths(root, epoch)
            q = QuantisedRows(
                np.memmap(codes_p, dtype=np.int8, mode="r", shape=(n, dim)),
                np.memmap(params_p, dtype="<f4", mode="r", shape=(n, 2)),
            )
            _OPEN.clear()  # one store's copy at a time is what a process scans
            _OPEN[key] = q
        return q


# ------------------------------------------------------------------------- the scan

def gated_rows(
    emb: np.ndarray, q: np.ndarray, gate: float, active: np.ndarray,
    quantised: QuantisedRows | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """(rows, relevance): active rows of `emb` whose exact float32 cosine with the unit query
    `q` is ≥ `gate`, ascending by row, and that cosine. Picks the path (module docstring)."""
    g = np.float32(gate)
    n = emb.shape[0]
    kernels = _kernels() if quantised is not None and quantised.n > 0 else None
    if kernels is not None:
        assert quantised is not None
        emb = _random_rows(emb)
        m = quantised.n
        lo = np.float32(float(g) - BOUND_EPS)
        mask = np.empty(m, np.uint8)
        act = np.ascontiguousarray(active[:m], dtype=np.bool_)  # a view, no copy
        with _KERNEL_LOCK:
            kernels["int8_bound"](
                np.asarray(quantised.codes), np.asarray(quantised.params), q, lo, act, mask)
        cand = np.flatnonzero(mask)
        if m < n:  # rows appended after the copy was built: exact scan of the tail
            tail = exact_relevance(emb, None, q, m, n)
            t_rows = np.flatnonzero((tail >= g) & active[m:]) + m
            rel = np.concatenate([exact_relevance(emb, cand, q), tail[t_rows - m]])
            cand = np.concatenate([cand, t_rows])
        else:
            rel = exact_relevance(emb, cand, q)
        keep = rel >= g
        return cand[keep], rel[keep]
    if emb.dtype == np.float32 or _kernels() is None:
        sims = _blas_similarities(emb, q)
        idx = np.flatnonzero((sims >= g) & active)
        return idx, sims[idx]
    rel = exact_relevance(emb, None, q)
    idx = np.flatnonzero((rel >= g) & active)
    return idx, rel[idx]


_RANDOM: dict[tuple[str, int, tuple[int, ...], str], np.ndarray] = {}


def _random_rows(emb: np.ndarray) -> np.ndarray:
    """The float rows to rescore candidates from: a second, read-only mapping of the same file
    advised MADV_RANDOM. With the copy the float rows are read only at the few candidates
    (and the short tail past the copy); through the default mapping each cold candidate's page
    fault reads ~128 KB ahead, ~85 rows nobody asked for: at 10M facts a cold select read
    hundreds of MB and spent seconds of CPU faulting them in (bench/results/ranking.md). A
    separate mapping, so full scans of the store's own map keep their readahead. Anything that
    is not a file map (or a system without madvise) is used as it is."""
    name = getattr(emb, "filename", None)
    if (not isinstance(emb, np.memmap) or not isinstance(emb.base, mmap.mmap)  # not a slice
            or name is None or not hasattr(mmap, "MADV_RANDOM")):
        return emb
    key = (str(name), int(emb.offset), tuple(emb.shape), emb.dtype.str)
    with _OPEN_LOCK:
        view = _RANDOM.get(key)
        if view is None:
            view = np.memmap(name, dtype=emb.dtype, mode="r", offset=emb.offset,
                             shape=emb.shape)
            mm = getattr(view, "_mmap", None)
            if mm is not None and hasattr(mm, "madvise"):
                with contextlib.suppress(OSError, ValueError):
                    mm.madvise(mmap.MADV_RANDOM)
            _RANDOM.clear()  # one store's rows at a time, like the copy
            _RANDOM[key] = view
        return view


def _blas_similarities(emb: np.ndarray, q: np.ndarray) -> np.ndarray:
    if emb.dtype == np.float32:
        # einsum, not BLAS gemv: gemv's rounding depends on the matrix's row count (kernels
        # take rows in groups), so a fact's relevance could differ in the last bit between
        # one CKF and the shard holding it; einsum's depends on the row alone, and
        # it measured no slower here (memory-bound either way). Row blocks on all cores
        # (`cdr.retrieval.row_products`) change no row's value.
        return row_products(emb, q)
    out = np.empty(len(emb), dtype=np.float32)
    for s in range(0, len(emb), 4096):
        out[s : s + 4096] = np.einsum("ij,j->i", emb[s : s + 4096].astype(np.float32), q)
    return out
