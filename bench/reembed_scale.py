"""Re-embedding at scale (issue 26): `cdr ckf reembed` on Ray embedding actors, 2 workers
against 1, and on this machine's cores without Ray, on the same CKF.

The CKF holds `--facts` distinct real facts: the contents of the retrieval benchmark's two
CKFs (Python docs, then man pages), stored with placeholder vectors (re-embedding replaces
every vector, so what they were does not matter). Each arm re-embeds a fresh copy of it from
the plain recipe to `title-section-short` through `cdr.ckf.reembed.reembed`, the function
behind `cdr ckf reembed`, with its default chunking (the Ray arms queue the next chunk while one
is staged). Arms: `local` (the default embedder in this process, threads on every core), and
Ray with 1 and 2 actors (`cdr.cluster.ray_ingest.RayEmbedder`, one CPU and one BLAS thread
each) on a Ray head this script starts on 127.0.0.1 with 2 CPUs and stops at the end. The
arms alternate (local, 1, 2, 2, 1, local) so drifting load hits each alike; the actors load
their model before the clock starts.

Usage: `python bench/reembed_scale.py [--facts 2000]` — writes bench/results/reembed.md.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

import _paths  # noqa: F401  (cdr importable from a checkout)
from _machine import cpu_name
from cdr.ckf import CKF
from cdr.ckf.committer import CKFCommitter, create_ckf
from cdr.ckf.reembed import reembed
from cdr.retrieval.embed import MINILM_MODEL_ID, default_embedder
from cdr.retrieval.fact_recipe import TITLE_SECTION_SHORT
from retrieval import CKF_DIR

OUT = Path(__file__).parent / "results" / "reembed.md"
SOURCES = ("pydocs-title-section-short.ckf", "man-title-section-short.ckf")
PER_DOC = 200  # facts per stored document


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def real_facts(n: int) -> tuple[list[str], int]:
    """`n` fact contents from the retrieval benchmark's CKFs (built by `bench/retrieval.py`),
    and how many of them are distinct real facts. Past the ~8k distinct facts the corpora hold,
    the real facts come round again with a copy marker (" [2]", " [3]", ...) appended: every
    text stays distinct, as a CKF stores it, and nothing on the path caches by text, so a copy
    costs the embedder what the original did."""
    out: dict[str, None] = {}
    for name in SOURCES:
        with CKF.open(CKF_DIR / name) as ckf:
            for content, _t, _s in ckf.committer.fact_contexts(0, ckf.n_rows):
                out.setdefault(content)
                if len(out) == n:
                    return list(out), n
    real = list(out)
    if not real:
        raise SystemExit(f"no facts in {CKF_DIR}; run bench/retrieval.py first")
    facts = real + [f"{real[i % len(real)]} [{i // len(real) + 1}]"
                    for i in range(len(real), n)]
    return facts, len(real)


def build(root: Path, facts: list[str]) -> Path:
    rng = np.random.default_rng(0)
    vecs = rng.standard_normal((len(facts), 384)).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    w = CKFCommitter(create_ckf(root, MINILM_MODEL_ID, 384))
    for s in range(0, len(facts), PER_DOC):
        w.append_raw(facts[s : s + PER_DOC], vecs[s : s + PER_DOC], source=f"doc/{s // PER_DOC}")
    w.close()
    return root


def run_arm(base: Path, work: Path, arm: str) -> dict[str, float]:
    from cdr.cluster.ray_ingest import RayEmbedder

    path = work / f"kb-{arm}-{time.monotonic_ns()}"
    shutil.copytree(base, path)
    model = default_embedder() if arm == "local" else RayEmbedder(None, workers=int(arm))
    cpu0 = model.cpu_seconds() if arm != "local" else [time.process_time()]
    try:
        with CKF.open(path) as ckf:
            t0 = time.perf_counter()
            rep = reembed(ckf, TITLE_SECTION_SHORT, embedder=model)
            wall = time.perf_counter() - t0
        cpu1 = model.cpu_seconds() if arm != "local" else [time.process_time()]
    finally:
        if arm != "local":
            model.close()
        shutil.rmtree(path, ignore_errors=True)
    cpu = sum(cpu1) - sum(cpu0)
    print(f"  {arm:>5}: {rep.embedded} facts in {wall:.1f} s = {rep.embedded / wall:.1f} "
          f"facts/s, embedding CPU {cpu:.0f} s, load {load()}", flush=True)
    return {"facts": rep.embedded, "wall": wall, "cpu": cpu, "load": load()}  # type: ignore[dict-item]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--facts", type=int, default=2000)
    ap.add_argument("--arms", default="local,1,2,2,1,local",
                    help="arms in the order they run: local (this process, no Ray) or a "
                    "number of Ray actors; each arm at least once")
    args = ap.parse_args()
    from cdr import settings

    settings.export({"CDR_EMBED_CACHE": ""})  # time the model, never vectors kept by a run
    order = tuple(a.strip() for a in args.arms.split(",") if a.strip())
    if not order or any(a not in ("local", "1", "2") for a in order):
        raise SystemExit(f"--arms {args.arms!r}: give local, 1 or 2, comma-separated")
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    start_load = load()
    work = Path(tempfile.mkdtemp(prefix="cdr-reembed-"))
    import ray

    from cdr.cluster.ray_index import connect

    try:
        facts, n_real = real_facts(args.facts)
        base = build(work / "base", facts)
        connect(None, num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1")
        from cdr.cluster.ray_ingest import RayEmbedder

        warm = RayEmbedder(None, workers=2)  # the workers' processes and imports, untimed
        warm.encode(["warm up"] * 8)
        warm.close()
        default_embedder().encode(["warm up"])
        runs: dict[str, list[dict[str, float]]] = {a: [] for a in dict.fromkeys(order)}
        for arm in order:
            runs[arm].append(run_arm(base, work, arm))
    finally:
        ray.shutdown()
        shutil.rmtree(work, ignore_errors=True)
    fps = {a: [r["facts"] / r["wall"] for r in rs] for a, rs in runs.items()}
    n_pairs = min(len(fps.get("1", [])), len(fps.get("2", [])))
    pair = [fps["2"][i] / fps["1"][i] for i in range(n_pairs)]
    what = (f"{args.facts:,} distinct real facts" if n_real == args.facts else
            f"{args.facts:,} facts: the {n_real:,} distinct real facts, then the same again "
            "with a copy marker appended (` [2]`, ` [3]`, ...) so every text is distinct")
    lines = [
        "# Re-embedding at scale: `cdr ckf reembed` on Ray embedding actors", "",
        f"- {what} (Python-docs and man-page facts of the retrieval benchmark), re-embedded "
        "from the plain recipe to `title-section-short` by the default (float32) path.",
        f"- Machine: {cpu_name(platform.processor() or 'unknown')}, {os.cpu_count()} logical "
        f"CPUs, shared; load average at the start {start_load}, at the end {load()}.",
        f"- Date: {datetime.now(UTC):%Y-%m-%d %H:%M} UTC.",
        f"- Command: `python bench/reembed_scale.py --facts {args.facts} --arms {','.join(order)}`",
        "",
        "| arm | runs, facts/s | mean facts/s | embedding CPU s per run | facts per embedding "
        "CPU-s | load average after |",
        "|---|---|---:|---|---:|---|",
    ]
    names = {"local": "this process, every core (no Ray)", "1": "Ray, 1 actor",
             "2": "Ray, 2 actors"}
    for arm, rs in runs.items():
        speeds = ", ".join(f"{x:.1f}" for x in fps[arm])
        cpus = ", ".join(f"{r['cpu']:.0f}" for r in rs)
        loads = "; ".join(str(r["load"]) for r in rs)
        per_cpu = sum(r["facts"] for r in rs) / max(sum(r["cpu"] for r in rs), 1e-9)
        lines.append(f"| {names[arm]} | {speeds} | {np.mean(fps[arm]):.1f} | {cpus} | "
                     f"{per_cpu:.1f} | {loads} |")
    ratio = (f"2 actors over 1: **{np.mean(fps['2']) / np.mean(fps['1']):.2f}×** (means); "
             "per pair of runs in order: " + ", ".join(f"{p:.2f}×" for p in pair) + ". "
             if pair else "")
    lines += [
        "", f"{ratio}Embedding CPU: the actors' "
        "own process time on Ray, this process's for the local arm; facts per CPU-second is the "
        "work done per core-second each arm actually got, which other jobs on a shared machine "
        "move less than wall time.",
    ]
    OUT.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
