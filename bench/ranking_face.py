"""The array face at the memory limit (issue 42): `cdr_scores` + top-k beside the BLAS scan.

`bench/ranking.py` times the face against the plain scan back to back. A server does not
rank back to back: it embeds the query (a BLAS call, whose OpenBLAS threads then spin for a
while) and ranks right after. So this run times both arms in two modes, interleaved in one
run, several repetitions, each thread count in turn (BLAS threads and `CDR_ROW_THREADS` alike):

- ``back-to-back``: the arms alternate, nothing between them;
- ``server``: every timed arm is preceded by an untimed "embed the query" BLAS call
  (a (16, d) × (d, 1536) product, a MiniLM feed-forward layer's size, on BLAS's threads).

The result is the median of paired ratios (one repetition's face time over its scan time):
ratios, not absolute times, since this is a shared 2-core machine. The report names the CPU,
its SIMD flags and the BLAS kernel threadpoolctl reports, since which kernel BLAS picks
(Haswell / SkylakeX / Zen) is what moves the ratio; `OPENBLAS_CORETYPE=Haswell` before the run
forces the AVX2 kernels on an AVX-512 CPU.

Usage: `python bench/ranking_face.py [--n 1000000] [--reps 31] [--threads 2,1] [--out PATH]`
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
from threadpoolctl import ThreadpoolController

import ranking as rb  # bench/ranking.py: the data, the two arms, the machine
from _machine import cpu_name
from _paths import BENCH  # first: makes `cdr` importable
from cdr import max_dots
from cdr.ranking import cdr_scores
from cdr.retrieval.row_products import ROW_THREADS_ENV

RESULTS = BENCH / "results" / "ranking-face.md"
MODES = ("back-to-back", "server")
EMBED_WIDTH = 1536


def cpu_flags() -> str:
    """The SIMD flags that decide BLAS's kernel and numpy's loops (from /proc/cpuinfo)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                have = set(line.split(":", 1)[1].split())
                wanted = ("avx2", "fma", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16")
                return " ".join(f for f in wanted if f in have) or "none of avx2/avx512/vnni"
    except OSError:
        pass
    return "unknown"


def blas_info() -> str:
    """threadpoolctl's view of the BLAS: internal_api, architecture, num_threads, version."""
    rows = [i for i in ThreadpoolController().info() if i.get("user_api") == "blas"]
    return "; ".join(
        f"{i.get('internal_api')} {i.get('version')}, architecture {i.get('architecture')}, "
        f"num_threads {i.get('num_threads')}" for i in rows) or "no BLAS found"


@dataclass
class Row:
    threads: int
    mode: str
    scan_s: float
    face_s: float
    pair_ratio: float
    min_ratio: float
    load: str
    exact_ratio: float | None = None  # face with every product exact, over the scan


def time_pairs(arms: dict[str, Callable[[], object]], before: Callable[[], object] | None,
               reps: int) -> dict[str, np.ndarray]:
    """Seconds per call of each arm, the arms' order alternating per repetition; `before`
    (the embed call of a server) runs untimed right before each timed call."""
    for fn in arms.values():
        fn()
    out: dict[str, list[float]] = {k: [] for k in arms}
    names = list(arms)
    for r in range(reps):
        for name in names if r % 2 == 0 else names[::-1]:
            if before is not None:
                before()
            t0 = time.perf_counter()
            arms[name]()
            out[name].append(time.perf_counter() - t0)
    return {k: np.asarray(v) for k, v in out.items()}


def _all_exact(face: Callable[[], object]) -> object:
    """The face with every residual product computed by einsum (before issue 42): the same
    scores, the cost of the (M, R) einsum on the gated rows."""
    old = max_dots.MIN_FILTERED
    max_dots.MIN_FILTERED = 10**18
    try:
        return face()
    finally:
        max_dots.MIN_FILTERED = old


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--reps", type=int, default=31)
    ap.add_argument("--threads", default="2,1")
    ap.add_argument("--seed", type=int, default=20240917)
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--with-exact", action="store_true",
                    help="a third arm: the face with every residual product exact (einsum)")
    raw = sys.argv[1:] if argv is None else argv
    args = ap.parse_args(raw)
    rng = np.random.default_rng(args.seed)
    topics = rb.make_topics(rng, 30)
    facts = rb.generate_facts(args.n, topics, rng, 0.02, (0.40, 0.85))
    imp = rng.uniform(0.5, 1.0, args.n).astype(np.float32)
    counts = np.where(rng.random(args.n) < 0.1, rng.integers(1, 4, args.n), 0).astype(np.int32)
    st = rb.make_state(rng, topics, covered=10, per_topic=5, n_residual=20)
    q = topics.query
    tokens = rng.standard_normal((16, rb.D)).astype(np.float32)
    weights = rng.standard_normal((rb.D, EMBED_WIDTH)).astype(np.float32)
    arms: dict[str, Callable[[], object]] = {
        "scan": lambda: rb.plain_topk(facts, q, rb.TOP_K),
        "face": lambda: rb.scores_topk(cdr_scores(facts, q, st.cov_vectors, st.cov_weights,
                                                  st.res_vectors, imp, counts), rb.TOP_K),
    }
    if args.with_exact:
        arms["face, all products exact"] = lambda: _all_exact(arms["face"])
    scores = cdr_scores(facts, q, st.cov_vectors, st.cov_weights, st.res_vectors, imp, counts)
    gated = int(np.isfinite(scores).sum())
    # The filter changes no value: the same bits as with every residual product exact.
    same = np.array_equal(scores, _all_exact(lambda: cdr_scores(
        facts, q, st.cov_vectors, st.cov_weights, st.res_vectors, imp, counts)), equal_nan=True)
    ctl = ThreadpoolController()
    start_load = rb._load()
    rows: list[Row] = []
    blas_seen: dict[int, str] = {}
    old_env = os.environ.get(ROW_THREADS_ENV)
    try:
        for t in (int(x) for x in args.threads.split(",")):
            os.environ[ROW_THREADS_ENV] = str(t)
            with ctl.limit(limits=t, user_api="blas"):
                blas_seen[t] = blas_info()
                for mode in MODES:
                    before = (lambda: tokens @ weights) if mode == "server" else None
                    times = time_pairs(arms, before, args.reps)
                    pr = times["face"] / times["scan"]
                    rows.append(Row(t, mode, float(np.median(times["scan"])),
                                    float(np.median(times["face"])), float(np.median(pr)),
                                    float(times["face"].min() / times["scan"].min()),
                                    rb._load()))
                    if "face, all products exact" in times:
                        rows[-1].exact_ratio = float(np.median(
                            times["face, all products exact"] / times["scan"]))
                    r = rows[-1]
                    print(f"threads {t} {mode:13s} scan {r.scan_s * 1e3:6.1f} ms  face "
                          f"{r.face_s * 1e3:6.1f} ms  paired ratio {r.pair_ratio:.3f}  "
                          f"fastest {r.min_ratio:.3f}  load {r.load}"
                          + ("" if r.exact_ratio is None else f"  exact {r.exact_ratio:.3f}"),
                          flush=True)
    finally:
        if old_env is None:
            os.environ.pop(ROW_THREADS_ENV, None)
        else:
            os.environ[ROW_THREADS_ENV] = old_env
    lines = [
        f"### `cdr_scores` + top-{rb.TOP_K} vs the BLAS scan + top-{rb.TOP_K}, "
        f"N = {rb.fmt_n(args.n)} × {rb.D}, {gated:,} facts pass the gate", "",
        "| threads (BLAS and `CDR_ROW_THREADS`) | mode | scan, ms | face, ms | "
        "**median of paired ratios** | ratio of fastest runs | every residual product exact "
        "(before issue 42), paired ratio | load average after |",
        "|---:|---|---:|---:|---:|---:|---:|---|",
    ]
    lines += [f"| {r.threads} | {r.mode} | {rb.ms(r.scan_s)} | {rb.ms(r.face_s)} | "
              f"**{r.pair_ratio:.2f}** | {r.min_ratio:.2f} | "
              f"{'—' if r.exact_ratio is None else f'{r.exact_ratio:.2f}'} | {r.load} |"
              for r in rows]
    lines += [
        "",
        f"{args.reps} repetitions per row, the arms alternating. `server`: each timed call "
        f"follows an untimed (16, {rb.D}) × ({rb.D}, {EMBED_WIDTH}) BLAS product, as a server "
        "embeds the query and then ranks. Scan: `facts @ q` (BLAS gemv), the 0.55 gate, top-k "
        "by relevance. Face: `cdr.spec.cdr_scores` with 50 Coverage Set entries, 20 residual "
        "sub-queries, importance and n-gram counts, then top-k of its scores.",
        "",
        "Machine:",
        "",
        f"- CPU: {cpu_name()}, {os.cpu_count()} logical CPUs; flags: {cpu_flags()}",
        *[f"- BLAS with {t} thread(s): {info}" for t, info in blas_seen.items()],
        f"- scores bit-identical to every residual product exact (einsum): {same}",
        f"- OPENBLAS_CORETYPE: {os.environ.get('OPENBLAS_CORETYPE', '(not set)')}",
        f"- numpy {np.__version__}; load average at the start: {start_load}, at the end: "
        f"{rb._load()}",
        f"- date: {datetime.now(UTC):%Y-%m-%d %H:%M} UTC",
        "",
        f"Rerun: `python bench/ranking_face.py{''.join(' ' + a for a in raw)}`",
    ]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
