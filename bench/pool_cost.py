"""Phase 1's cost with the section pool (`pool: "sections"`) against the task's pool alone, on a
knowledge base of 100k facts: seconds Phase 1 takes per window over whole runs, side by side.

The knowledge base is the man-page CKF of `bench/shapes.py` (1,123 real facts) plus synthetic
rows up to `--rows` (unit vectors at random, text drawn from the man pages' own words so BM25
has postings to walk), built once under the cache folder through the store's own array path.
Each family task of `bench/shapes.py` runs with the extractive writer under `focused` with
`pool: "task"` and with `pool: "sections"`, interleaved, and the time spent in
`Generator.candidates` is summed per run (the lexical index and the document map, built once
per state for both, are built before the first timed run). The section pool scans once per
section in the session's first window and is reused after; the task's pool is scanned each
window. Printed: per-window Phase 1 seconds of each arm and their ratio, the CPU, and the
machine's load.

Usage: `python bench/pool_cost.py [--rows 100000] [--repeats 3]`.
"""

from __future__ import annotations

import argparse
import os
import shutil
import time
from pathlib import Path

import numpy as np

from _machine import cpu_name
from _paths import BENCH  # noqa: F401  (first: makes `cdr` importable)
from cdr.ckf import CKF
from cdr.retrieval.doc_support import document_codes
from cdr.retrieval.fact_recipe import DEFAULT_RECIPE
from cdr.retrieval.lexical import lexical_index
from cdr.window.loop import GenerationConfig, Generator
from cdr.writers import get_writer
from retrieval import CKF_DIR, man_corpus
from shapes import FAMILIES, family_task

CHUNK = 10_000


def build(rows: int) -> Path:
    """The man CKF copied and filled with synthetic rows up to `rows` (once; reused)."""
    path = CKF_DIR / f"pool-cost-{rows}.ckf"
    if path.exists():
        return path
    corpus = man_corpus((DEFAULT_RECIPE,))
    src = corpus.ckfs[DEFAULT_RECIPE]
    words = sorted({w for f in src.facts(np.flatnonzero(src.active)) for w in f.content.split()
                    if w.isalpha()})
    src.close()
    tmp = path.with_suffix(".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(CKF_DIR / f"man-{DEFAULT_RECIPE}.ckf", tmp)
    rng = np.random.default_rng(7)
    with CKF.open(tmp) as ckf:
        left, i = rows - ckf.n_rows, 0
        while left > 0:
            n = min(CHUNK, left)
            vec = rng.standard_normal((n, ckf.dim)).astype(np.float32)
            vec /= np.linalg.norm(vec, axis=1, keepdims=True)
            texts = [" ".join(rng.choice(words, 40)) for _ in range(n)]
            ckf.append_raw(texts, vec, source=f"synthetic-{i}.md")
            left -= n
            i += 1
            print(f"built {rows - left:,} of {rows:,} rows", flush=True)
    os.replace(tmp, path)
    return path


def timed_run(ckf: CKF, pool: str, task: str, outline: str) -> tuple[float, int]:
    """(seconds in Phase 1 over the run, windows) for one run."""
    gen = Generator(ckf, get_writer("extractive"),
                    GenerationConfig(max_windows=6, words=3000, profile="focused", pool=pool))
    spent = [0.0]
    inner = gen.candidates

    def candidates(session: object) -> object:
        t0 = time.perf_counter()
        try:
            return inner(session)  # type: ignore[arg-type]
        finally:
            spent[0] += time.perf_counter() - t0

    gen.candidates = candidates  # type: ignore[method-assign]
    session = gen.start(task, outline)
    windows = sum(1 for _ in gen.run(task, session=session))
    return spent[0], windows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    path = build(args.rows)
    md = Path(man_corpus((DEFAULT_RECIPE,)).tasks["tune"][0].source).parent
    with CKF.open(path) as ckf:
        lexical_index(ckf)
        document_codes(ckf)  # built once per state, for both arms
        per_window = {"task": [], "sections": []}
        for rep in range(args.repeats):
            for f in FAMILIES:
                t, _ = family_task(f, md)
                for pool in (("task", "sections") if rep % 2 == 0 else ("sections", "task")):
                    secs, windows = timed_run(ckf, pool, t.text, t.outline_text)
                    per_window[pool].append(secs / max(windows, 1))
        task_ms = 1000 * float(np.median(per_window["task"]))
        sec_ms = 1000 * float(np.median(per_window["sections"]))
        print(f"{ckf.n_rows:,} facts, {len(FAMILIES)} family tasks x {args.repeats}, "
              f"{cpu_name()}, load {os.getloadavg()[0]:.1f}")
        print(f"Phase 1 per window (median over runs): pool task {task_ms:.1f} ms, "
              f"pool sections {sec_ms:.1f} ms, ratio {sec_ms / task_ms:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
