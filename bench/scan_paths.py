"""The Phase 1 scan paths of `cdr.retrieval.scan` side by side on in-memory matrices (issue 15).

For N rows of d = 384 unit vectors (2% planted near the query, gate 0.55), one run times:

- float32, BLAS mat-vec (the exact default),
- float16, numpy block conversion (`astype` per 1,024-row block, then BLAS: what `select` did),
- float16, the conversion kernel (exact),
- int8 copy scan + exact float32 rescoring of the survivors (exact result),

interleaved, and reports the ratio of each to the float32 scan, so the crossover where the
int8 copy starts to pay and the float16 fix can be read off one table. `--clock cpu` counts
the process's CPU time with BLAS and numba held to one thread each (for a busy machine).

Usage: `python bench/scan_paths.py [--sizes 100000,1000000] [--clock cpu] [--write]`
(`--write` puts the table into bench/results/ranking.md between `<!-- scan-paths -->` marks).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

from _machine import cpu_name
from _paths import BENCH, ROOT  # noqa: F401  (first: makes `cdr` importable)
from cdr.retrieval import scan
from scale_ckf import put_section

D = 384
GATE = 0.55


def old_f16(emb: np.ndarray, q: np.ndarray) -> np.ndarray:
    """What `CKF.select` did for float16 before: 1,024-row blocks converted, then BLAS."""
    out = np.empty(len(emb), dtype=np.float32)
    for s in range(0, len(emb), 1024):
        out[s : s + 1024] = emb[s : s + 1024].astype(np.float32) @ q
    return np.flatnonzero(out >= np.float32(GATE))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="100000,1000000")
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall")
    ap.add_argument("--write", action="store_true")
    raw = sys.argv[1:] if argv is None else argv
    args = ap.parse_args(raw)
    clock = time.perf_counter
    if args.clock == "cpu":
        from threadpoolctl import threadpool_limits

        threadpool_limits(1)
        import numba

        numba.set_num_threads(1)
        clock = time.process_time
    rng = np.random.default_rng(7)
    q = rng.standard_normal(D).astype(np.float32)
    q /= np.linalg.norm(q)
    lines = [
        "### Phase 1 scan paths (`cdr.retrieval.scan`), exact results on every path", "",
        "| N | pass the gate | float32 BLAS, ms | float16 block conversion (before) | "
        "float16 kernel | int8 copy + exact rescoring | int8 copy, MB per 1M facts |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for n in [int(x) for x in args.sizes.split(",")]:
        f = rng.standard_normal((n, D), dtype=np.float32)
        hot = rng.random(n) < 0.02
        c = rng.uniform(0.40, 0.85, int(hot.sum())).astype(np.float32)[:, None]
        f[hot] -= (f[hot] @ q)[:, None] * q
        f /= np.linalg.norm(f, axis=1, keepdims=True)
        f[hot] = c * q + np.sqrt(1 - c * c) * f[hot]
        f /= np.linalg.norm(f, axis=1, keepdims=True)
        h = f.astype(np.float16)
        quant = scan.QuantisedRows(*scan.quantise(f))
        active = np.ones(n, bool)
        fns = {
            "f32": lambda f=f, active=active: scan.gated_rows(f, q, GATE, active),
            "f16_old": lambda h=h: old_f16(h, q),
            "f16_kernel": lambda h=h, active=active: scan.gated_rows(h, q, GATE, active),
            "int8": lambda f=f, quant=quant, active=active: (
                scan.gated_rows(f, q, GATE, active, quant)),
        }
        want = fns["f32"]()[0]
        assert np.array_equal(fns["int8"]()[0], want)
        times: dict[str, list[float]] = {k: [] for k in fns}
        for r in range(args.reps):
            names = list(fns)
            for k in names[r % 4 :] + names[: r % 4]:
                t0 = clock()
                fns[k]()
                times[k].append(clock() - t0)
        med = {k: float(np.median(v)) * 1e3 for k, v in times.items()}
        base = med["f32"]
        lines.append(
            f"| {n:,} | {len(want):,} | {base:.1f} | {med['f16_old']:.1f} "
            f"({med['f16_old'] / base:.2f}×) | {med['f16_kernel']:.1f} "
            f"({med['f16_kernel'] / base:.2f}×) | {med['int8']:.1f} ({med['int8'] / base:.2f}×) "
            f"| {quant.nbytes / n * 1e6 / 2**20:.0f} |")
        print(lines[-1], flush=True)
        del f, h, quant
    lines += [
        "",
        f"d = {D}, unit rows, 2% planted near the query (cosine U[0.40, 0.85]), gate {GATE}; "
        f"medians of {args.reps} interleaved repetitions, ratio to float32 BLAS in brackets; "
        + ("process CPU time, BLAS and numba on one thread each."
           if args.clock == "cpu" else "wall clock, BLAS and numba on all cores.")
        + f" Machine: {cpu_name()}, {os.cpu_count()} CPUs, load average "
        f"{os.getloadavg()[0]:.1f}, {time.strftime('%Y-%m-%d %H:%M')}. Rerun: "
        f"`python bench/scan_paths.py{''.join(' ' + a for a in raw)}`",
    ]
    text = "\n".join(lines)
    print(text)
    if args.write:
        put_section(BENCH / "results" / "ranking.md", "scan-paths", text)


if __name__ == "__main__":
    main()
