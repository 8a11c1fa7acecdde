"""The scan engine at ten million facts without the CKF's per-row SQLite cost (issue 15).

`bench/scale_ckf.py` builds a real CKF through `CKF.append_raw`, whose per-row SQLite inserts
run at ~2-4k rows/s on a loaded 2-core machine (40+ min for 10M). This benchmark writes the
same kind of rows straight into a raw float32 file (`bench/data/arrays-<rows>/emb.f32`,
memory-mapped, written in chunks, resumable), builds the int8 copy with
`cdr.retrieval.scan.build_quantised` (timed), and times `cdr.retrieval.scan.gated_rows` — the
function `CKF.select` calls — on the map: exact float32 BLAS against the int8 copy + exact
rescoring, interleaved, with recall. `select` adds only query checks, the limit and the sort on top.

Usage: `python bench/scale_arrays.py [--rows 10000000] [--timed 8] [--clean] [--write]`
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np

from _machine import cpu_name
from _paths import BENCH, ROOT  # noqa: F401  (first: makes `cdr` importable)
from cdr.retrieval import scan
from scale_ckf import GATE, log, planted_rows, put_section

D = 384
CHUNK = 250_000
MB = 2**20


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--planted", type=float, default=0.002)
    ap.add_argument("--timed", type=int, default=8)
    ap.add_argument("--work", type=Path)
    ap.add_argument("--clean", action="store_true")
    ap.add_argument("--write", action="store_true")
    raw = sys.argv[1:] if argv is None else argv
    args = ap.parse_args(raw)
    work = args.work or BENCH / "data" / f"arrays-{args.rows}"
    work.mkdir(parents=True, exist_ok=True)
    path = work / "emb.f32"
    rng0 = np.random.default_rng(99)
    qs = rng0.standard_normal((12, D)).astype(np.float32)
    qs /= np.linalg.norm(qs, axis=1, keepdims=True)
    done = path.stat().st_size // (D * 4) if path.exists() else 0
    done -= done % CHUNK  # redo a partial chunk
    t0 = time.perf_counter()
    base: np.ndarray | None = None
    with open(path, "r+b" if path.exists() else "wb") as fh:
        fh.truncate(done * D * 4)
        fh.seek(done * D * 4)
        while done < args.rows:
            k = min(CHUNK, args.rows - done)
            rng = np.random.default_rng([7, done])
            if base is None:
                base = rng.standard_normal((CHUNK, D), dtype=np.float32)
                base /= np.linalg.norm(base, axis=1, keepdims=True)
            # A random sign flip of each column of one random block is again a set of
            # uniformly random unit rows, at a fraction of the cost of drawing normals.
            signs = np.where(rng.random(D) < 0.5, -1, 1).astype(np.float32)
            v = base[:k] * signs
            hot = np.flatnonzero(rng.random(k) < args.planted)
            v[hot] = planted_rows(rng, qs, len(hot))
            v.tofile(fh)
            done += k
            if done % 2_000_000 < CHUNK:
                log(f"rows written {done:,}/{args.rows:,}")
    write_s = time.perf_counter() - t0
    n = args.rows
    emb = np.memmap(path, dtype=np.float32, mode="r", shape=(n, D))
    have = scan.covered_rows(work, 0, D)
    last = [time.perf_counter()]

    def progress(d: int, total: int) -> None:
        if time.perf_counter() - last[0] > 15:
            last[0] = time.perf_counter()
            log(f"int8 copy {d:,}/{total:,}")

    t0 = time.perf_counter()
    scan.build_quantised(work, 0, emb, progress)
    build_s = time.perf_counter() - t0
    built = n - have
    t0 = time.perf_counter()
    quant = scan.open_quantised(work, 0, D, n)
    open_s = time.perf_counter() - t0
    assert quant is not None
    active = np.ones(n, bool)
    log(f"int8 copy: {built:,} rows built in {build_s:.0f} s; open {open_s * 1e3:.1f} ms")
    t0 = time.perf_counter()
    scan.gated_rows(emb[:1000], qs[0], GATE, active[:1000], scan.QuantisedRows(
        quant.codes[:1000], quant.params[:1000]))
    first_s = time.perf_counter() - t0
    times: dict[str, list[float]] = {"int8": [], "exact": []}
    peaks: dict[str, list[int]] = {"int8": [], "exact": []}
    cpu: dict[str, list[float]] = {"int8": [], "exact": []}
    recalls, deltas, passing = [], [], []
    timed = qs[: args.timed]

    def run(arm: str, q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        tracemalloc.start()
        t, c = time.perf_counter(), time.process_time()
        out = scan.gated_rows(emb, q, GATE, active, quant if arm == "int8" else None)
        times[arm].append(time.perf_counter() - t)
        cpu[arm].append(time.process_time() - c)
        peaks[arm].append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
        return out

    # Not interleaved: the exact arm streams the whole float32 file through the page cache
    # and evicts the int8 copy, so each arm is timed in its own phase, the int8 arm first
    # (after one untimed warm-up query that pulls the copy into the page cache).
    t = time.perf_counter()
    scan.gated_rows(emb, qs[-1], GATE, active, quant)
    warm_s = time.perf_counter() - t
    got = [run("int8", q) for q in timed]
    log("int8: " + ", ".join(f"{x * 1e3:.0f}" for x in times["int8"]) + " ms")
    for i, q in enumerate(timed):
        ra, va = run("exact", q)
        rb, vb = got[i]
        common, ia, ib = np.intersect1d(ra, rb, return_indices=True)
        recalls.append(len(common) / max(len(ra), 1))
        deltas.append(float(np.abs(va[ia] - vb[ib]).max()) if len(common) else 0.0)
        passing.append(len(ra))
        log(f"query {i + 1}: {len(ra):,} pass; int8 {times['int8'][i] * 1e3:.0f} ms, "
            f"exact {times['exact'][-1] * 1e3:.0f} ms, recall {recalls[-1]:.6f}")
    t = time.perf_counter()
    scan.gated_rows(emb, qs[0], GATE, active, quant)
    cold_s = time.perf_counter() - t
    per_m = 1e6 / n
    qmb = quant.nbytes / MB
    lines = [
        f"### The scan engine at {n / 1e6:g}M × {D} facts (`cdr.retrieval.scan.gated_rows` on "
        "memory maps)", "",
        "| path | p50 ms | p95 ms | CPU ms per query, all threads (median) | passing the gate "
        "(median) | recall vs exact float32 | max Δ relevance | peak heap, MB per 1M facts |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for arm, label in (("int8", "**int8 copy + exact float32 rescoring**"),
                       ("exact", "exact float32 (BLAS mat-vec)")):
        a = np.asarray(times[arm]) * 1e3
        rec = f"{min(recalls):.6f} (min of {len(recalls)})" if arm == "int8" else "1 (reference)"
        dlt = f"{max(deltas):.1e}" if arm == "int8" else "—"
        lines.append(
            f"| {label} | {np.median(a):,.0f} | {np.percentile(a, 95):,.0f} | "
            f"{np.median(cpu[arm]) * 1e3:,.0f} | {int(np.median(passing)):,} | {rec} | {dlt} | "
            f"{np.median(peaks[arm]) / MB * per_m:.2f} |")
    lines += [
        "",
        f"Unit rows, {args.planted:.1%} planted around 12 queries (cosine U[0.40, 0.85]), the "
        f"rest random; gate {GATE}; {len(timed)} queries per arm, int8 arm first with its "
        f"copy in the page cache (the first, untimed query pulled it in: {warm_s:.1f} s; a "
        f"query right after the exact arm had evicted it again: {cold_s:.1f} s). The float32 "
        f"matrix is {n * D * 4 / 1e9:.1f} GB, the int8 copy {qmb / 1024:.2f} GB "
        f"({qmb * per_m:.0f} MB per 1M facts), mapping it {open_s * 1e3:.1f} ms. Building the "
        f"copy: {built:,} rows in {build_s:.0f} s ({built / max(build_s, 1e-9):,.0f} rows/s). "
        f"Rows written in {write_s:.0f} s. First call in a process (numba cache load or "
        f"compile): {first_s:.1f} s.",
        "",
        f"Machine: {cpu_name()}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} "
        f"at the end, {time.strftime('%Y-%m-%d %H:%M')}. Rerun: "
        f"`python bench/scale_arrays.py{''.join(' ' + a for a in raw)}`",
    ]
    text = "\n".join(lines)
    print(text, flush=True)
    if args.write:
        put_section(BENCH / "results" / "ranking.md", "scale-arrays", text)
    if args.clean:
        del emb, quant
        shutil.rmtree(work)
        log(f"deleted {work}")


if __name__ == "__main__":
    main()
