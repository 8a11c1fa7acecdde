"""What a Qdrant collection costs as the knowledge base, beside a CKF of the same facts.

The benchmark's PostgreSQL-manual CKF (`bench/shapes.py --corpus pg`; its facts and vectors)
is written into a collection of Qdrant's local mode with the official client, then, side by
side in one process: opening the CKF; reading the collection (scroll with vectors and
payloads) and building its in-memory index (`cdr.stores.array_index`: token counts, 6-gram
hashes); and preparing the first window of a chapter task on each (`Generator.prepare`, the
default profile). The identity check is timed apart (it embeds a sample of 8 texts again; the
CKF's vectors embed each fact with its title and section, so the check is skipped here by
reading the points directly). Medians of `--reps` runs.

Usage: `python bench/store_open.py [--reps 3]`.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np

from _paths import BENCH  # noqa: F401  (first: makes `cdr` importable)
from cdr.ckf import CKF
from cdr.errors import InvalidInputError
from cdr.stores.array_index import ArrayFactIndex
from cdr.stores.collection import verify_identity
from cdr.stores.qdrant import parse_address, read_points
from cdr.window.loop import GenerationConfig, Generator
from cdr.writers import get_writer
from shapes import pg_tasks


def _median_seconds(fn, reps: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(reps):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), out


def main(argv: list[str] | None = None) -> int:
    from qdrant_client import QdrantClient, models

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args(argv)
    ckf, tasks = pg_tasks("report", "indexes")
    _, task, _ = tasks[0]
    n = ckf.n_rows
    facts = ckf.facts(np.arange(n))
    vectors = np.asarray(ckf.embeddings, np.float32)
    with tempfile.TemporaryDirectory() as tmp:
        storage = Path(tmp) / "storage"
        client = QdrantClient(path=str(storage))
        client.create_collection("pg", vectors_config=models.VectorParams(
            size=ckf.dim, distance=models.Distance.COSINE))
        for lo in range(0, n, 1000):
            client.upsert("pg", points=[
                models.PointStruct(id=str(uuid.UUID(int=i + 1)), vector=vectors[i].tolist(),
                                   payload={"page_content": facts[i].content,
                                            "metadata": {"source": facts[i].source,
                                                         "section": facts[i].section}})
                for i in range(lo, min(n, lo + 1000))])
        client.close()
        addr = parse_address(f"qdrant:{storage}?collection=pg")

        def open_ckf() -> CKF:
            return CKF.open(ckf.path)

        def read() -> object:
            c = QdrantClient(path=str(storage))
            try:
                return read_points(c, addr, ckf.dim)
            finally:
                c.close()

        t_ckf, fresh = _median_seconds(open_ckf, args.reps)
        t_read, pts = _median_seconds(read, args.reps)
        t_build, index = _median_seconds(lambda: ArrayFactIndex(
            np.vstack(pts.vectors), pts.texts, pts.sources, pts.sections,
            model_id=ckf.model_id, embedder=ckf.embedder, path=addr.shown), args.reps)
        vecs = np.vstack(pts.vectors)
        t_verify = _median_seconds(lambda: _try_verify(addr, ckf.embedder, vecs, pts.texts),
                                   args.reps)[0]

        def first_window(ix: object) -> float:
            gen = Generator(ix, get_writer("extractive"),
                            GenerationConfig(profile="focused", max_windows=4, words=3000))
            s = gen.start(task.text, task.outline_text)
            gen.prepare(s)  # warms the per-state caches (BM25, document codes, navigation)
            t = time.perf_counter()
            gen.prepare(gen.start(task.text, task.outline_text))
            return time.perf_counter() - t

        w_ckf = statistics.median(first_window(fresh) for _ in range(args.reps))
        w_store = statistics.median(first_window(index) for _ in range(args.reps))
    print(f"{n:,} facts, {ckf.dim}-d; medians of {args.reps} runs")
    print(f"open the CKF                           {t_ckf * 1e3:9.1f} ms")
    print(f"read the collection (scroll)           {t_read * 1e3:9.1f} ms")
    print(f"build its index (tokens, 6-grams)      {t_build * 1e3:9.1f} ms")
    print(f"identity check (8 texts embedded)      {t_verify * 1e3:9.1f} ms")
    print(f"first window, CKF / store              {w_ckf * 1e3:9.1f} / {w_store * 1e3:.1f} ms "
          f"({w_store / w_ckf:.2f}x)")
    return 0


def _try_verify(addr, embedder, vectors, texts) -> None:
    # the recipe's vectors are not the texts' own, so the check refuses: its cost is the same
    with contextlib.suppress(InvalidInputError):
        verify_identity(addr.shown, embedder, vectors, texts)


if __name__ == "__main__":
    raise SystemExit(main())
