"""Ranking benchmark (issue 2): what CDR costs over a plain cosine scan, and over the reference.

One run, one data set of unit vectors (d = 384, float32):

1. CDR `rank_all(..., top_k=k)` (50 Coverage Set entries, 20 residual sub-queries, importance
   and n-gram counts) against a plain exact cosine gate + top-k in numpy, for N = 10k, 100k, 1M:
   medians of interleaved repetitions and their ratio (target: ≤ 1.15 at 1M).
2. CDR against the published reference implementation, `crprotocol==6.2.5` from PyPI, at
   N = 1k and 10k (10 coverage entries, 10 residual). The reference (Elastic License 2.0) is
   installed into its own venv (`bench/.venv-crp`, gitignored) and run in a subprocess of it by
   `bench/_crp_reference.py`, so its code never enters this process or the repository. Data
   goes over as `.npy` files. Its scores are compared with ours.
3. Peak memory each ranking allocates beyond the fact matrix (tracemalloc), per million facts.

Most facts are random directions (cosine to the query ≈ N(0, 0.05²), never gated in); a planted
share lies near the query, spread over sub-topics, with cosine to the query uniform in
[0.40, 0.85], so about 2/3 of them pass the 0.55 gate (1.3% of all facts). The printed table
is the README's performance section; it is also written to `bench/results/ranking.md` with the
machine and the command that reruns it.

4. `cdr_scores` + top-k against the plain scan on all cores and on one thread (BLAS threads
   and `CDR_ROW_THREADS` set alike), wall time beside the process's CPU time, at the largest N
   (issue 26: the array face's row products run as fixed row blocks on every core).

Usage: `python bench/ranking.py [--sizes 10000,100000,1000000] [--quick] [--no-reference]
[--clock cpu] [--cores-only]` (`--clock cpu`: CPU time of one thread, for a machine busy with
other work; `--cores-only`: only section 4, written into its block of the results file).
"""

from __future__ import annotations

import argparse
import ctypes
import glob
import json
import os
import platform
import re
import resource
import subprocess
import sys
import tempfile
import time
import tracemalloc
import venv
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace

import numpy as np
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from _machine import cpu_name
from _paths import BENCH, ROOT  # noqa: F401  (first: makes `cdr` importable)
from cdr.coverage import CoverageEntry, CoverageSet, ResidualSet, SubQuery
from cdr.ranking import (
    CDR_MIN_RELEVANCE,
    Ranking,
    cdr_components,
    cdr_scores,
    rank_all,
)
from cdr.retrieval.row_products import ROW_THREADS_ENV
from cdr.spec import cdr_rank as spec_cdr_rank

D = 384
TOP_K = 64
GATE = np.float32(CDR_MIN_RELEVANCE)
CHUNK = 32_768
CRP_REQ = "crprotocol==6.2.5"
CRP_VENV = Path(os.environ.get("CDR_CRP_VENV", BENCH / ".venv-crp"))
RESULTS = BENCH / "results" / "ranking.md"
MB = 1024 * 1024
# perf_counter (wall clock) by default; `--clock cpu` uses this thread's CPU time, which time
# slices lost to other processes do not inflate (with BLAS held to this one thread).
CLOCK: Callable[[], float] = time.perf_counter

console = Console()


# ----------------------------------------------------------------------------------- data


def _unit_rows(x: np.ndarray) -> np.ndarray:
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    return x


def _perp(x: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Rows of `x` with their component along `q` removed, then normalised."""
    x -= np.outer(x @ q, q)
    return _unit_rows(x)


@dataclass
class Topics:
    """Sub-topics of the task: unit vectors at cosine 0.75 to the query (what sub-queries of a
    decomposed task look like), and their directions orthogonal to the query."""

    query: np.ndarray
    vectors: np.ndarray
    perp: np.ndarray


def make_topics(rng: np.random.Generator, n: int) -> Topics:
    q = rng.standard_normal(D).astype(np.float32)
    q /= np.linalg.norm(q)
    u = _perp(rng.standard_normal((n, D), dtype=np.float32), q)
    vec = _unit_rows((0.75 * q + np.sqrt(1 - 0.75**2) * u).astype(np.float32))
    return Topics(q, vec, u)


def jitter(rng: np.random.Generator, v: np.ndarray, scale: float = 0.15) -> np.ndarray:
    """Another phrasing of the same sub-query: the vector plus a little noise, renormalised."""
    x = v + scale * rng.standard_normal(v.shape, dtype=np.float32) / np.sqrt(D)
    return _unit_rows(np.atleast_2d(x).astype(np.float32))


def generate_facts(
    n: int,
    topics: Topics,
    rng: np.random.Generator,
    share: float,
    cos_range: tuple[float, float],
    advance: Callable[[int], None] = lambda _: None,
) -> np.ndarray:
    """(n, D) unit float32 rows, made in chunks so a million facts need no big temporaries.

    A planted fact has cosine `c ~ U(cos_range)` to the query exactly, and its orthogonal part
    leans towards one sub-topic by a random amount, so coverage and residual pull vary."""
    q = topics.query
    out = np.empty((n, D), dtype=np.float32)
    for s in range(0, n, CHUNK):
        m = min(CHUNK, n - s)
        x = rng.standard_normal((m, D), dtype=np.float32)
        planted = np.flatnonzero(rng.random(m) < share)
        if planted.size:
            w = _perp(x[planted], q)
            lean = rng.uniform(0.0, 2.0, planted.size).astype(np.float32)
            w += lean[:, None] * topics.perp[rng.integers(0, len(topics.perp), planted.size)]
            w = _perp(w, q)
            c = rng.uniform(*cos_range, planted.size).astype(np.float32)
            x[planted] = c[:, None] * q + np.sqrt(1 - c * c)[:, None] * w
        out[s : s + m] = _unit_rows(x)
        advance(m)
    return out


@dataclass
class State:
    """The session state both rankings see: Coverage Set, Residual Set, per-fact arrays."""

    coverage: CoverageSet
    residual: ResidualSet
    cov_vectors: np.ndarray
    cov_weights: np.ndarray
    res_vectors: np.ndarray


def make_state(
    rng: np.random.Generator, topics: Topics, covered: int, per_topic: int, n_residual: int
) -> State:
    """`covered` sub-topics addressed `per_topic` times each (windows 1…per_topic, depth weights
    0.15–0.90), and the next `n_residual` sub-topics still in the Residual Set."""
    cov_vec = np.concatenate(
        [jitter(rng, topics.vectors[:covered]) for _ in range(per_topic)]
    )
    windows = np.repeat(np.arange(1, per_topic + 1), covered)
    weights = rng.uniform(0.15, 0.90, len(cov_vec)).astype(np.float32)
    cs = CoverageSet(D)
    for e, w, n in zip(cov_vec, weights, windows, strict=True):
        cs.add(e, float(w), int(n))
    res_vec = jitter(rng, topics.vectors[covered : covered + n_residual])
    sqs = [SubQuery(f"sq-{covered + j}", f"sub-topic {covered + j}") for j in range(n_residual)]
    return State(cs, ResidualSet(sqs, res_vec, D), cov_vec, weights, res_vec)


# ------------------------------------------------------------------------------ rankings


def plain_topk(facts: np.ndarray, q: np.ndarray, k: int) -> np.ndarray:
    """The baseline: exact cosine, the same gate, top-k by relevance, best first."""
    rel = facts @ q
    idx = np.flatnonzero(rel >= GATE)
    if idx.size > k:
        idx = idx[np.argpartition(-rel[idx], k - 1)[:k]]
    return idx[np.argsort(-rel[idx], kind="stable")]


def interleaved_times(
    fns: dict[str, Callable[[], object]], reps: int, advance: Callable[[], None]
) -> dict[str, np.ndarray]:
    """Seconds per call of each function; each repetition runs all of them, in rotating order,
    so drifting machine load hits every contender alike. One untimed warm-up each."""
    for fn in fns.values():
        fn()
    names = list(fns)
    samples: dict[str, list[float]] = {n: [] for n in names}
    for r in range(reps):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            t0 = CLOCK()
            fns[name]()
            samples[name].append(CLOCK() - t0)
        advance()
    return {n: np.asarray(v) for n, v in samples.items()}


def interleaved_medians(
    fns: dict[str, Callable[[], object]], reps: int, advance: Callable[[], None]
) -> dict[str, float]:
    return {n: float(np.median(v)) for n, v in interleaved_times(fns, reps, advance).items()}


def peak_alloc(fn: Callable[[], object]) -> int:
    """Peak bytes allocated (numpy buffers included) while `fn` runs, result freed after.
    BLAS-internal work buffers are not traced; they are small and the same for both."""
    tracemalloc.start()
    tracemalloc.reset_peak()
    result = fn()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    del result
    return peak


@dataclass
class ScanRow:
    n: int
    passed: int
    plain_s: float
    cdr_s: float
    min_ratio: float
    plain_peak: int
    cdr_peak: int
    scores_s: float = 0.0
    scores_min_ratio: float = 0.0
    scores_peak: int = 0


def bench_scan(
    facts: np.ndarray, topics: Topics, state: State, importance: np.ndarray,
    counts: np.ndarray, n: int, reps: int, progress: Progress,
) -> ScanRow:
    f = facts[:n]
    q = topics.query
    imp, cnt = importance[:n], counts[:n]

    def cdr() -> object:
        return rank_all(
            f, q, importance=imp, ngram_counts=cnt, coverage=state.coverage,
            residual=state.residual, top_k=TOP_K,
        )

    def plain() -> object:
        return plain_topk(f, q, TOP_K)

    def scores() -> object:  # the array face, `cdr.spec.cdr_scores`: a score per fact
        return cdr_scores(f, q, state.cov_vectors, state.cov_weights, state.res_vectors,
                          imp, cnt)

    task = progress.add_task(f"N = {n:>9,}: timing", total=reps)
    times = interleaved_times({"plain": plain, "cdr": cdr, "scores": scores}, reps,
                              lambda: progress.advance(task))
    med = {k: float(np.median(v)) for k, v in times.items()}
    ranking = rank_all(
        f, q, importance=imp, ngram_counts=cnt, coverage=state.coverage,
        residual=state.residual, top_k=TOP_K,
    )
    return ScanRow(
        n, ranking.n_candidates, med["plain"], med["cdr"],
        float(times["cdr"].min() / times["plain"].min()), peak_alloc(plain), peak_alloc(cdr),
        med["scores"], float(times["scores"].min() / times["plain"].min()), peak_alloc(scores),
    )


def breakdown(
    facts: np.ndarray, q: np.ndarray, state: State, importance: np.ndarray,
    counts: np.ndarray, reps: int,
) -> dict[str, float]:
    """Where CDR's time goes beyond the scan: the steps of `rank_all`, timed one by one."""
    rel = facts @ q
    gate = np.flatnonzero(rel >= GATE)
    block = facts[gate]
    centroid = state.coverage.centroid()
    res = state.residual.embeddings
    steps: dict[str, Callable[[], object]] = {
        "mat-vec F @ q": lambda: facts @ q,
        "gate (>= 0.55, flatnonzero)": lambda: np.flatnonzero(rel >= GATE),
        "gather facts[gate]": lambda: facts[gate],
        "CDR terms on the gated block": lambda: cdr_components(
            block, rel[gate], importance[gate], counts[gate], centroid, res, True
        ),
        "whole rank_all": lambda: rank_all(
            facts, q, importance=importance, ngram_counts=counts, coverage=state.coverage,
            residual=state.residual, top_k=TOP_K,
        ),
    }
    return interleaved_medians(steps, reps, _noop)


def scores_topk(scores: np.ndarray, k: int) -> np.ndarray:
    """Top-k of `cdr_scores`' output (NaN = gated), best first: what a caller of the array face
    does after it, the same selection `plain_topk` makes on relevance."""
    idx = np.flatnonzero(~np.isnan(scores))
    if idx.size > k:
        idx = idx[np.argpartition(-scores[idx], k - 1)[:k]]
    return idx[np.argsort(-scores[idx], kind="stable")]


@dataclass
class CoresRow:
    """`cdr_scores` + top-k against the plain BLAS scan + top-k with `threads` threads each
    (BLAS and `CDR_ROW_THREADS` alike): medians of wall time and of the process's CPU time
    (all its threads), seconds."""

    threads: int
    plain_wall: float
    scores_wall: float
    plain_cpu: float
    scores_cpu: float
    min_wall_ratio: float
    pair_wall_ratio: float = 0.0  # median over repetitions of (scores / plain) of one pair
    pair_cpu_ratio: float = 0.0
    load: str = ""  # load average (1, 5, 15 min) when this thread count's runs ended


def bench_cores(
    facts: np.ndarray, q: np.ndarray, state: State, importance: np.ndarray,
    counts: np.ndarray, reps: int, thread_counts: list[int], progress: Progress,
) -> list[CoresRow]:
    """Wall and CPU time on all cores and on one, in one run, interleaved per repetition.

    The thread count is set for both contenders alike: OpenBLAS's threads for the plain
    `facts @ q`, `CDR_ROW_THREADS` for the row blocks of `cdr_scores`. Each call reads both
    clocks, so CPU time (which other processes' load inflates least) sits beside wall time."""
    old_env = os.environ.get(ROW_THREADS_ENV)
    old_blas = _openblas_threads()
    rows = []

    def plain() -> object:
        return plain_topk(facts, q, TOP_K)

    def scores() -> object:
        s = cdr_scores(facts, q, state.cov_vectors, state.cov_weights, state.res_vectors,
                       importance, counts)
        return scores_topk(s, TOP_K)

    try:
        for t in thread_counts:
            set_blas_threads(t)
            os.environ[ROW_THREADS_ENV] = str(t)
            task = progress.add_task(f"N = {len(facts):>9,}: {t} thread(s)", total=reps)
            wall: dict[str, list[float]] = {"plain": [], "scores": []}
            cpu: dict[str, list[float]] = {"plain": [], "scores": []}
            fns = {"plain": plain, "scores": scores}
            for fn in fns.values():
                fn()
            for r in range(reps):
                for name in (("plain", "scores") if r % 2 == 0 else ("scores", "plain")):
                    c0, w0 = time.process_time(), time.perf_counter()
                    fns[name]()
                    wall[name].append(time.perf_counter() - w0)
                    cpu[name].append(time.process_time() - c0)
                progress.advance(task)
            # Each repetition runs both arms back to back: the ratio within one pair sees the
            # same load, so the median of those ratios is the figure least moved by other work.
            pw = np.asarray(wall["scores"]) / np.asarray(wall["plain"])
            pc = np.asarray(cpu["scores"]) / np.asarray(cpu["plain"])
            rows.append(CoresRow(
                t, float(np.median(wall["plain"])), float(np.median(wall["scores"])),
                float(np.median(cpu["plain"])), float(np.median(cpu["scores"])),
                float(min(wall["scores"]) / min(wall["plain"])),
                float(np.median(pw)), float(np.median(pc)), _load(),
            ))
    finally:
        if old_env is None:
            os.environ.pop(ROW_THREADS_ENV, None)
        else:
            os.environ[ROW_THREADS_ENV] = old_env
        if old_blas is not None:
            set_blas_threads(old_blas)
    return rows


def render_cores(rows: list[CoresRow], n: int, info: dict[str, str], argv: list[str]) -> str:
    """The all-cores section of the results (a block other runs of this file keep)."""
    lines = [
        "<!-- cores -->",
        f"### `cdr_scores` + top-{TOP_K} vs a plain multi-threaded BLAS scan + top-{TOP_K}, "
        f"N = {fmt_n(n)}: wall time on all cores beside CPU time",
        "",
        f"Load average (1, 5, 15 min) at the start: {info['load average (1, 5, 15 min) at start']}"
        f", at the end: {_load()}, on {os.cpu_count()} logical CPUs.",
        "",
        "| threads (BLAS and `CDR_ROW_THREADS`) | plain scan wall, ms | `cdr_scores` + top-k "
        "wall, ms | **median of paired wall ratios** | ratio of median walls | "
        "ratio of fastest runs | plain scan CPU, ms | `cdr_scores` + top-k CPU, ms | "
        "median of paired CPU ratios | load average after |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r.threads} | {ms(r.plain_wall)} | {ms(r.scores_wall)} | "
            f"**{r.pair_wall_ratio:.2f}** | {r.scores_wall / r.plain_wall:.2f} | "
            f"{r.min_wall_ratio:.2f} | {ms(r.plain_cpu)} | {ms(r.scores_cpu)} | "
            f"{r.pair_cpu_ratio:.2f} | {r.load} |"
        )
    lines += [
        "",
        "Plain scan: `facts @ q` (OpenBLAS gemv), the 0.55 gate, top-k by relevance. "
        "`cdr_scores`: the `cdr.spec` array face with the full state (50 Coverage Set entries, "
        "20 residual sub-queries, importance, n-gram counts), then top-k over its scores; its "
        "per-row products run as fixed row blocks on `CDR_ROW_THREADS` threads "
        "(`cdr.retrieval.row_products`), every score bit-identical to one thread's. Wall: "
        "`perf_counter`; CPU: `process_time` (all threads of the process). Each repetition "
        "times both arms back to back, their order alternating; a paired ratio is one "
        "repetition's `cdr_scores` time over its plain-scan time, and the table gives the "
        "median of those beside the ratio of the medians.",
        "",
        f"Rerun: `python bench/ranking.py{''.join(' ' + a for a in argv)}`",
        "<!-- /cores -->",
    ]
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------- the reference


def crp_python() -> Path:
    """The reference's venv interpreter, created and filled on first use (idempotent)."""
    py = CRP_VENV / "bin" / "python"
    if py.exists():
        probe = subprocess.run(
            [str(py), "-c", "import importlib.metadata as m; print(m.version('crprotocol'))"],
            capture_output=True, text=True, check=False,
        )
        if probe.returncode == 0 and probe.stdout.strip() == CRP_REQ.split("==")[1]:
            return py
    if not py.exists():
        venv.create(CRP_VENV, with_pip=True, clear=True)
    done = subprocess.run(
        [str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check", CRP_REQ],
        capture_output=True, text=True, check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"installing {CRP_REQ} failed:\n{done.stdout}\n{done.stderr}")
    return py


def _save(dirpath: Path, **arrays: np.ndarray) -> None:
    for name, a in arrays.items():
        np.save(dirpath / f"{name}.npy", np.ascontiguousarray(a, dtype="<f4"))


@dataclass
class RefRow:
    scenario: str
    short: str
    n: int
    passed: int
    ref_s: float
    ours_s: float
    spec_s: float
    agreement: dict[str, float]


def _spec_inputs(
    facts: np.ndarray, importance: np.ndarray, state: State
) -> tuple[list[SimpleNamespace], SimpleNamespace]:
    """The same data as Python objects with list embeddings, the shape the reference takes."""
    objs = [
        SimpleNamespace(embedding=e, content="", importance_weight=float(w))
        for e, w in zip(facts.tolist(), importance.tolist(), strict=True)
    ]
    session = SimpleNamespace(
        coverage_set=[
            CoverageEntry(e.tolist(), float(w), 1)
            for e, w in zip(state.cov_vectors, state.cov_weights, strict=True)
        ],
        residual_set=[
            SimpleNamespace(embedding=e.tolist(), id=sq.id, text=sq.text)
            for e, sq in zip(state.res_vectors, state.residual.sub_queries, strict=True)
        ],
        ngram_blacklist=set(),
    )
    return objs, session


def _spearman(a: np.ndarray, b: np.ndarray) -> float:
    ra = np.argsort(np.argsort(a)).astype(np.float64)
    rb = np.argsort(np.argsort(b)).astype(np.float64)
    return float(np.corrcoef(ra, rb)[0, 1]) if len(a) > 1 else 1.0


def compare_scores(ours: Ranking, ref: dict, importance: np.ndarray) -> dict[str, float]:
    """Ours vs the reference fact by fact, and ours with its +0.20 × pull novelty boost added
    (to show that boost is the whole difference)."""
    r = np.asarray(ref["ranked"], dtype=np.float64).reshape(-1, 5)
    ref_ids = r[:, 0].astype(np.int64)
    o_ids = ours.indices
    common, oi, ri = np.intersect1d(o_ids, ref_ids, return_indices=True)
    rel, nov, pull, score = (np.asarray(a, np.float64)[oi] for a in (
        ours.relevance, ours.novelty, ours.residual_pull, ours.score))
    cov = np.asarray(ours.coverage_score, np.float64)[oi]
    imp = importance[common].astype(np.float64)
    boosted_nov = np.minimum(1.0, np.maximum(1.0 - np.minimum(cov, 0.8), 0.2) + 0.2 * pull)
    boosted = imp * np.maximum(rel, pull) * boosted_nov
    r_rel, r_nov, r_pull, r_score = r[ri, 1], r[ri, 2], r[ri, 3], r[ri, 4]
    k10 = min(10, len(o_ids))
    k64 = min(TOP_K, len(o_ids))
    return {
        "gated_ours": float(len(o_ids)),
        "gated_ref": float(len(ref_ids)),
        "gated_common": float(len(common)),
        "max_d_relevance": float(np.abs(rel - r_rel).max(initial=0)),
        "max_d_pull": float(np.abs(pull - r_pull).max(initial=0)),
        "max_d_novelty": float(np.abs(nov - r_nov).max(initial=0)),
        "mean_d_novelty": float((r_nov - nov).mean()) if len(common) else 0.0,
        "max_d_score": float(np.abs(score - r_score).max(initial=0)),
        "share_score_differs": float((np.abs(score - r_score) > 1e-4).mean())
        if len(common) else 0.0,
        "max_d_score_boosted": float(np.abs(boosted - r_score).max(initial=0)),
        "top10_overlap": len(np.intersect1d(o_ids[:k10], ref_ids[:k10])) / max(k10, 1),
        "top64_overlap": len(np.intersect1d(o_ids[:k64], ref_ids[:k64])) / max(k64, 1),
        "spearman": _spearman(score, r_score),
    }


def bench_reference(
    py: Path, scenario: tuple[str, str], facts: np.ndarray, topics: Topics, state: State,
    importance: np.ndarray, reps: int, progress: Progress,
) -> RefRow:
    n = facts.shape[0]
    q = topics.query
    label, short = scenario
    task = progress.add_task(f"reference, {short}, N = {n:,}", total=None)
    with tempfile.TemporaryDirectory(prefix="cdr-bench-") as tmp:
        d = Path(tmp)
        _save(
            d, facts=facts, query=q, coverage=state.cov_vectors,
            coverage_weights=state.cov_weights, residual=state.res_vectors,
            importance=importance,
        )
        done = subprocess.run(
            [str(py), str(BENCH / "_crp_reference.py"), str(d), str(d / "out.json"), str(reps),
             "cpu" if CLOCK is time.thread_time else "wall"],
            capture_output=True, text=True, check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"the reference run failed:\n{done.stderr[-3000:]}")
        ref = json.loads((d / "out.json").read_text())
    progress.update(task, description=f"ours, {short}, N = {n:,}")

    def ours() -> object:
        return rank_all(
            facts, q, importance=importance, coverage=state.coverage, residual=state.residual
        )

    objs, session = _spec_inputs(facts, importance, state)
    qlist = q.tolist()
    # Timed one after the other, not interleaved: the reference ran in another process, and
    # the object-heavy spec interface would only evict ours from the caches.
    med = {
        name: interleaved_medians({name: fn}, int(np.clip(0.5 / _once(fn), 10, 200)), _noop)[name]
        for name, fn in (("ours", ours), ("spec", lambda: spec_cdr_rank(objs, qlist, session)))
    }
    ranking = ours()
    progress.update(task, total=1, completed=1)
    return RefRow(
        label, short, n, ranking.n_candidates, float(np.median(ref["times"])), med["ours"],
        med["spec"], compare_scores(ranking, ref, importance) | {"version": ref["version"]},
    )


def _once(fn: Callable[[], object]) -> float:
    t0 = CLOCK()
    fn()
    return max(CLOCK() - t0, 1e-6)


def _noop() -> None:
    return None


# ------------------------------------------------------------------------------ report


def _openblas() -> tuple[ctypes.CDLL, str] | None:
    """numpy's bundled OpenBLAS and its symbol prefix, to read or set its thread count."""
    libdir = Path(np.__file__).parent.parent / "numpy.libs"
    for lib in glob.glob(str(libdir / "*openblas*")):
        handle = ctypes.CDLL(lib)
        for prefix, suffix in (("scipy_openblas", "64_"), ("openblas", "64_"), ("openblas", "")):
            if hasattr(handle, f"{prefix}_get_num_threads{suffix}"):
                return handle, f"{prefix}_%s_num_threads{suffix}"
    return None


def _openblas_threads() -> int | None:
    found = _openblas()
    if found is None:
        return None
    handle, pattern = found
    return int(getattr(handle, pattern % "get")())


def blas_threads() -> str:
    found = _openblas()
    if found is None:
        return "unknown (not numpy's bundled OpenBLAS)"
    handle, pattern = found
    return f"OpenBLAS {getattr(handle, pattern % 'get')()}"


def set_blas_threads(n: int) -> None:
    """Limit BLAS threads for the whole run (both contenders alike)."""
    found = _openblas()
    if found is None:
        raise SystemExit("--blas-threads: numpy's bundled OpenBLAS not found; set the "
                         "OPENBLAS_NUM_THREADS environment variable instead")
    handle, pattern = found
    getattr(handle, pattern % "set")(int(n))


def machine() -> dict[str, str]:
    cpu = cpu_name(platform.processor() or "unknown")
    blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]  # type: ignore[index]
    return {
        "CPU": f"{cpu}, {os.cpu_count()} logical CPUs",
        "memory": f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB",
        "Python": platform.python_version(),
        "numpy": np.__version__,
        "BLAS": f"{blas.get('name')} {blas.get('version')}",
        "BLAS threads": blas_threads(),
        "load average (1, 5, 15 min) at start": _load(),
    }


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def fmt_n(n: int) -> str:
    return f"{n // 1_000_000}M" if n >= 1_000_000 and n % 1_000_000 == 0 else (
        f"{n // 1000}k" if n % 1000 == 0 else str(n))


def ms(s: float) -> str:
    return f"{s * 1e3:.3g}" if s < 0.1 else f"{s * 1e3:.0f}"


def busy_note(load: float, clock: str) -> str:
    """A warning for the results when other processes competed for the CPUs."""
    cpus = os.cpu_count() or 1
    if load <= 0.5 * cpus:
        return ""
    how = (
        "times are this thread's CPU time with BLAS on one thread, which lost time slices do "
        "not inflate, but shared caches and memory bandwidth still do"
        if clock == "cpu"
        else "wall-clock times are inflated, most for small N; rerun on a quiet machine, or "
        "with `--clock cpu`"
    )
    return f"> The machine was busy (load average {load:.1f} on {cpus} CPUs at the start): {how}."


def render(
    scan: list[ScanRow], refs: list[RefRow], parts: dict[str, float] | None, share: float,
    info: dict[str, str], argv: list[str], note: str = "",
) -> str:
    """The results as Markdown (what the README's performance section shows)."""
    lines = ["### CDR rank vs a plain exact cosine scan (gate 0.55, top-64)", ""]
    if note:
        lines += [note, ""]
    lines += [
        "| N facts | pass the gate | plain scan, ms | CDR `rank_all`, ms | ratio | "
        "ratio of fastest runs | `cdr_scores`, ms | ratio | ratio of fastest runs | "
        "extra memory per 1M facts, plain / `rank_all` / `cdr_scores` |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in scan:
        lines.append(
            f"| {fmt_n(r.n)} | {r.passed:,} ({r.passed / r.n:.1%}) | {ms(r.plain_s)} | "
            f"{ms(r.cdr_s)} | **{r.cdr_s / r.plain_s:.2f}** | {r.min_ratio:.2f} | "
            f"{ms(r.scores_s)} | **{r.scores_s / r.plain_s:.2f}** | {r.scores_min_ratio:.2f} | "
            f"{r.plain_peak / MB * 1e6 / r.n:.1f} MB / {r.cdr_peak / MB * 1e6 / r.n:.1f} MB / "
            f"{r.scores_peak / MB * 1e6 / r.n:.1f} MB |"
        )
    lines += [
        "",
        f"Unit vectors, d = {D}, float32 (the fact matrix itself is "
        f"{D * 4 * 1e6 / MB:,.0f} MB per million facts); {share:.0%} of facts planted near the "
        "query over 30 sub-topics; CDR with 50 Coverage Set entries, 20 residual sub-queries, "
        "importance and n-gram counts; `cdr_scores` (the `cdr.spec` array face) gets the same "
        "state as arrays and returns a score for every fact (NaN where gated). Both validate "
        "their input (NaN/inf rows refused wherever they are, gated rows must be unit rows) "
        "through the mat-vec they compute anyway. Times are medians of interleaved "
        "repetitions (ratio of "
        "fastest runs: min over min, less sensitive to other load on the machine). Extra "
        "memory: tracemalloc peak of one call beyond its inputs.",
    ]
    if parts:
        total = parts["whole rank_all"]
        lines += ["", f"Where `rank_all`'s time goes at N = {fmt_n(scan[-1].n)} (medians, ms):", ""]
        lines += ["| step | ms | share |", "|---|---:|---:|"]
        for k, v in parts.items():
            lines.append(f"| {k} | {ms(v)} | {v / total:.0%} |")
    if refs:
        ver = refs[0].agreement.get("version", "?")
        lines += [
            "",
            f"### CDR vs the reference implementation (`crprotocol=={ver}`, "
            "`crp.envelope.cdr.cdr_rank`)",
            "",
            "| facts | N | pass the gate | reference, ms | CDR `rank_all`, ms | speed-up | "
            "`cdr.spec.cdr_rank` (same Python objects), ms | speed-up |",
            "|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for r in refs:
            lines.append(
                f"| {r.scenario} | {fmt_n(r.n)} | {r.passed:,} | {ms(r.ref_s)} | "
                f"{ms(r.ours_s)} | **{r.ref_s / r.ours_s:,.0f}×** | {ms(r.spec_s)} | "
                f"{r.ref_s / r.spec_s:,.0f}× |"
            )
        lines += [
            "",
            "d = 384, 10 Coverage Set entries, 10 residual sub-queries, importance in [0.5, 1], "
            "full ranking (no top-k) on both sides. The reference runs in its own venv; its "
            "time is the median of its repetitions of `cdr_rank` alone (building its fact "
            "objects is not timed). `cdr.spec.cdr_rank` takes the same list-of-floats objects.",
            "",
            "Score agreement (facts gated in by both):",
            "",
            "| facts | N | gated ours / ref | max Δ relevance | max Δ residual pull | "
            "max Δ novelty | mean Δ novelty (ref − ours) | max Δ score | scores differing > 1e-4 "
            "| top-10 / top-64 overlap | Spearman | max Δ score with its +0.20 × pull boost |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for r in refs:
            a = r.agreement
            lines.append(
                f"| {r.scenario} | {fmt_n(r.n)} | {a['gated_ours']:.0f} / {a['gated_ref']:.0f} | "
                f"{a['max_d_relevance']:.1e} | {a['max_d_pull']:.1e} | {a['max_d_novelty']:.3f} "
                f"| {a['mean_d_novelty']:+.3f} | {a['max_d_score']:.3f} | "
                f"{a['share_score_differs']:.0%} | {a['top10_overlap']:.0%} / "
                f"{a['top64_overlap']:.0%} | {a['spearman']:.3f} | "
                f"{a['max_d_score_boosted']:.1e} |"
            )
        lines += [
            "",
            "Relevance and residual pull agree to float32 precision. The reference adds "
            "`+0.20 × residual_pull` to novelty (capped at 1), which CRP-SPEC-024 §2.2/§7.1 do "
            "not; applying that boost to our components reproduces its scores (last column), "
            "so it is the only difference.",
        ]
    lines += ["", "Machine:", ""]
    lines += [f"- {k}: {v}" for k, v in info.items()]
    lines.append(f"- load average at the end: {_load()}")
    lines += [
        f"- peak RSS of the run: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:,.0f}"
        " MB",
        f"- date: {datetime.now(UTC):%Y-%m-%d %H:%M} UTC",
        "",
        f"Rerun: `python bench/ranking.py{''.join(' ' + a for a in argv)}`",
    ]
    return "\n".join(lines) + "\n"


def _print_tables(scan: list[ScanRow], refs: list[RefRow]) -> None:
    t = Table(title="CDR rank_all vs plain cosine gate + top-64")
    for col in ("N", "gated", "plain ms", "CDR ms", "ratio", "min ratio", "scores ms",
                "ratio", "MB/1M plain", "MB/1M CDR"):
        t.add_column(col, justify="right")
    for r in scan:
        t.add_row(
            fmt_n(r.n), f"{r.passed:,}", ms(r.plain_s), ms(r.cdr_s),
            f"{r.cdr_s / r.plain_s:.2f}", f"{r.min_ratio:.2f}", ms(r.scores_s),
            f"{r.scores_s / r.plain_s:.2f}",
            f"{r.plain_peak / MB * 1e6 / r.n:.1f}",
            f"{r.cdr_peak / MB * 1e6 / r.n:.1f}",
        )
    console.print(t)
    if refs:
        t = Table(title="CDR vs crprotocol cdr_rank")
        for col in ("facts", "N", "gated", "ref ms", "ours ms", "speed-up", "spec ms",
                    "speed-up", "max Δscore", "Δ after boost"):
            t.add_column(col, justify="right")
        for r in refs:
            t.add_row(
                r.short, fmt_n(r.n), f"{r.passed:,}", ms(r.ref_s), ms(r.ours_s),
                f"{r.ref_s / r.ours_s:,.0f}×", ms(r.spec_s), f"{r.ref_s / r.spec_s:,.0f}×",
                f"{r.agreement['max_d_score']:.3f}",
                f"{r.agreement['max_d_score_boosted']:.1e}",
            )
        console.print(t)


def _print_cores(rows: list[CoresRow]) -> None:
    t = Table(title=f"cdr_scores + top-{TOP_K} vs plain BLAS scan + top-{TOP_K}: wall and CPU")
    for col in ("threads", "plain wall ms", "scores wall ms", "paired wall ratio", "min ratio",
                "plain CPU ms", "scores CPU ms", "paired CPU ratio", "load"):
        t.add_column(col, justify="right")
    for r in rows:
        t.add_row(str(r.threads), ms(r.plain_wall), ms(r.scores_wall),
                  f"{r.pair_wall_ratio:.2f}", f"{r.min_wall_ratio:.2f}",
                  ms(r.plain_cpu), ms(r.scores_cpu), f"{r.pair_cpu_ratio:.2f}", r.load)
    console.print(t)


def _write_cores(out: Path, cores_text: str) -> None:
    """Put the all-cores block into `out` in place of its previous one (else at the end)."""
    old = out.read_text() if out.exists() else ""
    m = re.search(r"<!-- cores -->.*?<!-- /cores -->\n?", old, flags=re.S)
    text = (old[: m.start()] + cores_text + old[m.end() :] if m
            else old.rstrip("\n") + ("\n\n" if old else "") + cores_text)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    console.print(f"written to {out}")


# -------------------------------------------------------------------------------- main


def parse_sizes(text: str) -> list[int]:
    mult = {"k": 1_000, "m": 1_000_000}
    out = []
    for part in text.split(","):
        p = part.strip().lower().replace("_", "")
        out.append(int(float(p[:-1]) * mult[p[-1]]) if p[-1] in mult else int(p))
    if not out or min(out) < TOP_K:
        raise SystemExit(f"--sizes: need sizes of at least {TOP_K}, got {text!r}")
    return sorted(out)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="10000,100000,1000000", type=parse_sizes)
    ap.add_argument("--quick", action="store_true", help="fewer repetitions")
    ap.add_argument("--no-reference", action="store_true", help="skip crprotocol")
    ap.add_argument("--share", type=float, default=0.02, help="planted share near the query")
    ap.add_argument("--seed", type=int, default=20240917)
    ap.add_argument("--blas-threads", type=int, help="limit BLAS threads (default: as is)")
    ap.add_argument(
        "--clock", choices=("wall", "cpu"), default="wall",
        help="cpu: this thread's CPU time, BLAS on one thread (for a busy machine)",
    )
    ap.add_argument(
        "--cores-only", action="store_true",
        help="only the all-cores section (cdr_scores + top-k vs the BLAS scan, wall and CPU "
             "time, all threads then one) at the largest size; the rest of --out is kept",
    )
    ap.add_argument("--cores-reps", type=int, help="repetitions of the all-cores section "
                    "(default: as many as the scan table's at the largest size)")
    ap.add_argument("--out", type=Path, default=RESULTS)
    raw = sys.argv[1:] if argv is None else argv
    args = ap.parse_args(raw)
    global CLOCK
    if args.clock == "cpu":
        if args.blas_threads not in (None, 1):
            raise SystemExit("--clock cpu times one thread: it needs --blas-threads 1")
        args.blas_threads = 1
        CLOCK = time.thread_time
    if args.blas_threads:
        set_blas_threads(args.blas_threads)
        # cdr's row blocks get as many threads as BLAS (with --clock cpu, one: thread_time
        # counts this thread only, and would miss the pool's work).
        os.environ[ROW_THREADS_ENV] = str(args.blas_threads)
    info = machine() | {"clock": "thread CPU time" if args.clock == "cpu" else "wall clock"}
    note = busy_note(os.getloadavg()[0], args.clock)
    rng = np.random.default_rng(args.seed)
    topics = make_topics(rng, 30)
    n_max = max(args.sizes)

    progress = Progress(
        TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed:,}"),
        TimeElapsedColumn(), console=console,
    )
    scan: list[ScanRow] = []
    refs: list[RefRow] = []
    all_cores = os.cpu_count() or 1
    with progress:
        gen = progress.add_task(f"generating {n_max:,} facts", total=n_max)
        facts = generate_facts(
            n_max, topics, rng, args.share, (0.40, 0.85), lambda m: progress.advance(gen, m)
        )
        importance = rng.uniform(0.5, 1.0, n_max).astype(np.float32)
        counts = np.where(rng.random(n_max) < 0.1, rng.integers(1, 4, n_max), 0).astype(np.int32)
        state = make_state(rng, topics, covered=10, per_topic=5, n_residual=20)
        per_call = max(n_max * D * 4 / 8e9, 2e-4)
        core_reps = args.cores_reps or max(
            int(np.clip(4.0 / per_call, 15, 300)) // (3 if args.quick else 1), 5)
        cores = bench_cores(facts, topics.query, state, importance, counts, core_reps,
                            sorted({all_cores, 1}, reverse=True), progress)
        cores_text = render_cores(cores, n_max, info, raw)
        if args.cores_only:
            progress.stop()
            _print_cores(cores)
            _write_cores(args.out, cores_text)
            return
        for n in args.sizes:
            per_call = max(n * D * 4 / 8e9, 2e-4)  # ≈ memory-bound mat-vec time
            reps = int(np.clip(4.0 / per_call, 15, 300)) // (3 if args.quick else 1)
            scan.append(
                bench_scan(facts, topics, state, importance, counts, n, max(reps, 5), progress)
            )
        parts = breakdown(
            facts, topics.query, state, importance, counts, 5 if args.quick else 15
        )
        del facts
        if not args.no_reference:
            task = progress.add_task(f"reference venv ({CRP_REQ})", total=None)
            try:
                py = crp_python()
            except (RuntimeError, OSError) as exc:
                console.print(f"[red]reference skipped: {exc}")
                py = None
            progress.update(task, total=1, completed=1)
            if py is not None:
                ref_rng = np.random.default_rng(args.seed + 1)
                ref_topics = make_topics(ref_rng, 20)
                ref_state = make_state(ref_rng, ref_topics, covered=10, per_topic=1, n_residual=10)
                scenarios = [
                    ((f"knowledge base ({args.share:.0%} near the query)", "KB scan"),
                     args.share, (0.40, 0.85)),
                    (("Phase 1 candidates (all pass the gate)", "candidates"), 1.0, (0.56, 0.90)),
                ]
                for label, share, cos_range in scenarios:
                    for n in (1_000, 10_000):
                        f = generate_facts(n, ref_topics, ref_rng, share, cos_range)
                        imp = ref_rng.uniform(0.5, 1.0, n).astype(np.float32)
                        reps = 1 if args.quick else (5 if n <= 1_000 or share < 1 else 3)
                        refs.append(
                            bench_reference(py, label, f, ref_topics, ref_state, imp, reps,
                                            progress)
                        )
    _print_tables(scan, refs)
    _print_cores(cores)
    text = render(scan, refs, parts, args.share, info, raw, note)
    text = text.rstrip("\n") + "\n\n" + cores_text
    if note:
        console.print(note)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    old = args.out.read_text() if args.out.exists() else ""
    # Sections other benchmarks keep in this file (bench/scale.py, bench/scan_paths.py) stay.
    for block in re.findall(r"<!-- ([a-z-]+) -->.*?<!-- /\1 -->", old, flags=re.S):
        if block == "cores":  # this run's own
            continue
        start, end = f"<!-- {block} -->", f"<!-- /{block} -->"
        keep = old[old.index(start) : old.index(end) + len(end)]
        text = text.rstrip("\n") + "\n\n" + keep + "\n"
    args.out.write_text(text)
    console.print(f"written to {args.out}")


if __name__ == "__main__":
    main()
