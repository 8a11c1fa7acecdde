"""The embedding cache's hit path against the model (`CDR_EMBED_CACHE`,
`cdr.retrieval.embed_cache`): what a text costs when its vector is read back instead of
computed, and what the cache adds to a text it has to compute.

The texts are paragraphs of the Python language reference (`pydoc_data.topics`, in the
standard library: nothing to download), cut as ingest would see them (at most 120 words). Each
repeat, in this order, on the default (float32) model:

1. `model`: the cache off, `encode` of all the texts in one call (ingest's pattern);
2. `miss`: a new, empty cache: the model runs on every text and the cache stores them;
3. `hit`: the same call again: every vector read back;
4. `model, one text per call` and `hit, one text per call`: `--singles` texts one `encode`
   each (a gateway's queries and windows).

CPU seconds are this process's (every thread) and wall seconds are measured around each step;
the median over `--repeats` is reported, with the load average before and after.

Usage: `python bench/embed_cache.py [--texts 1000] [--singles 200] [--repeats 3]` — writes
bench/results/embed_cache.md.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

import _paths  # noqa: F401  (cdr importable from a checkout)
from _machine import cpu_name
from cdr import settings
from cdr.retrieval.embed import default_embedder

OUT = Path(__file__).parent / "results" / "embed_cache.md"


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def paragraphs(n: int) -> list[str]:
    """The first `n` distinct paragraphs of 8 words or more of the language reference, each
    cut to its first 120 words."""
    from pydoc_data.topics import topics

    out: dict[str, None] = {}
    for name in sorted(topics):
        for para in topics[name].split("\n\n"):
            words = para.split()
            if len(words) >= 8:
                out.setdefault(" ".join(words[:120]))
            if len(out) == n:
                return list(out)
    return list(out)


def timed(step: Callable[[], np.ndarray]) -> tuple[float, float, np.ndarray]:
    """(wall seconds, CPU seconds of this process, the result) of `step()`."""
    wall, cpu = time.perf_counter(), time.process_time()
    out = step()
    return time.perf_counter() - wall, time.process_time() - cpu, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--texts", type=int, default=1000)
    ap.add_argument("--singles", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    model = default_embedder()
    texts = paragraphs(args.texts)
    singles = texts[:args.singles]
    start_load = load()
    runs: dict[str, list[tuple[float, float]]] = {}

    def record(name: str, wall: float, cpu: float) -> None:
        runs.setdefault(name, []).append((wall, cpu))

    for _ in range(args.repeats):
        settings.export({"CDR_EMBED_CACHE": ""})
        wall, cpu, want = timed(lambda: model.encode(texts))
        record("model", wall, cpu)
        wall, cpu, _ = timed(lambda: np.stack([model.encode([t])[0] for t in singles]))
        record("model, one text per call", wall, cpu)
        with tempfile.TemporaryDirectory(prefix="cdr-bench-cache-") as directory:
            settings.export({"CDR_EMBED_CACHE": directory})
            wall, cpu, got = timed(lambda: model.encode(texts))
            record("miss (model + store)", wall, cpu)
            assert np.array_equal(got, want)
            wall, cpu, got = timed(lambda: model.encode(texts))
            record("hit", wall, cpu)
            assert np.array_equal(got, want)  # the stored bytes, bit for bit
            wall, cpu, _ = timed(lambda: np.stack([model.encode([t])[0] for t in singles]))
            record("hit, one text per call", wall, cpu)
    settings.export({"CDR_EMBED_CACHE": ""})

    per_text = {name: (statistics.median(w for w, _ in r), statistics.median(c for _, c in r))
                for name, r in runs.items()}
    words = sum(len(t.split()) for t in texts)
    lines = [
        "# The embedding cache's hit path against the model",
        "",
        f"- Machine: {cpu_name(platform.processor() or 'unknown')}, {os.cpu_count()} logical "
        f"CPUs, shared; load average at the start {start_load}, at the end {load()}.",
        f"- Date: {datetime.now(UTC):%Y-%m-%d %H:%M} UTC.",
        f"- Command: `python bench/embed_cache.py --texts {args.texts} --singles "
        f"{args.singles} --repeats {args.repeats}`",
        f"- Texts: {len(texts):,} paragraphs of the Python language reference "
        f"({words:,} words); one text per call: the first {len(singles):,}. Default model "
        "(float32), median of the repeats.",
        "",
        "| step | texts | wall s | CPU s | CPU ms per text | × the model's CPU |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, (wall, cpu) in per_text.items():
        n = len(singles) if "one text" in name else len(texts)
        base = per_text["model, one text per call" if "one text" in name else "model"][1]
        lines.append(f"| {name} | {n:,} | {wall:.2f} | {cpu:.2f} | {1000 * cpu / n:.3f} | "
                     f"{cpu / base:.3f} |")
    text = "\n".join(lines) + "\n"
    OUT.write_text(text, encoding="utf-8")
    print(text)


if __name__ == "__main__":
    main()
