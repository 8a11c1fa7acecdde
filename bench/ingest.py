"""CKF benchmark: ingest throughput, size on disk, and Phase 1 `select` latency.

1. Ingest (real corpus): pages of the Python 3.11 HTML documentation (Debian python3.11-doc,
   fetched once into ~/.cache/cdr) through the whole pipeline — parse, chunk, embed with the
   default model, commit — in facts/s; then a re-ingest of the unchanged pages.
2. Embedders side by side: the same fact texts through our numpy MiniLM and through
   sentence-transformers (same weights, PyTorch, its own venv) via
   `bench/embedders.py:run_embedder_comparison`, each in a fresh process.
3. Size on disk per 100k facts, from the real ingest (SQLite, vectors, 6-gram hashes).
4. `select` latency at 100k and 1M facts: synthetic unit vectors appended through the store's
   own array path (`CKF.append_raw`), then the CKF re-opened (open time and memory measured:
   nothing per fact is loaded) and queried.

Usage: `python bench/ingest.py [--facts 2000] [--sizes 100000,1000000] [--no-st]
[--out bench/results/ingest.md]`.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import os
import platform
import statistics
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent / "src"))

from cdr.ckf import CKF, ingest  # noqa: E402
from cdr.retrieval.embed import default_embedder  # noqa: E402
from corpus import pages_holding, python_docs_dir  # noqa: E402  (bench/, the script's own directory)

RESULTS = BENCH / "results" / "ingest.md"


class TimedEmbedder:
    """The default model, with the time spent encoding recorded (to split ingest time)."""

    def __init__(self) -> None:
        self.inner = default_embedder()
        self.model_id, self.dim = self.inner.model_id, self.inner.dim
        self.seconds = 0.0
        self.texts = 0

    def encode(self, texts: Sequence[str], *, batch_size: int = 32, progress: Any = None
               ) -> np.ndarray:
        t = time.perf_counter()
        out = self.inner.encode(texts, batch_size=batch_size, progress=progress)
        self.seconds += time.perf_counter() - t
        self.texts += len(texts)
        return out


def pick_pages(root: Path, target_facts: int) -> tuple[list[Path], int]:
    """Library reference pages in name order until they hold about `target_facts` facts."""
    return pages_holding(sorted((root / "library").glob("*.html")), target_facts)


def dir_sizes(path: Path) -> dict[str, int]:
    sizes: dict[str, int] = {}
    for p in path.iterdir():
        if not p.is_file():
            continue
        key = ("sqlite" if p.name.startswith("ckf.sqlite") else p.name.split(".")[0])
        sizes[key] = sizes.get(key, 0) + p.stat().st_size
    return sizes


def bench_ingest(work: Path, target_facts: int) -> dict[str, Any]:
    docs_root = python_docs_dir()
    pages, _ = pick_pages(docs_root, target_facts)
    staged = work / "pages"
    staged.mkdir()
    for p in pages:  # a directory of just these pages, ingested the way a user would
        (staged / p.name).write_bytes(p.read_bytes())
    emb = TimedEmbedder()
    t0 = time.perf_counter()
    ckf = CKF.create(work / "docs.ckf", emb)
    rep = ingest(ckf, [staged], source_type="official")
    total = time.perf_counter() - t0
    t1 = time.perf_counter()
    again = ingest(ckf, [staged], source_type="official")
    reingest = time.perf_counter() - t1
    texts = [f.content for f in ckf.facts(range(ckf.n_rows))]
    problems = ckf.check(deep=False)
    ckf.close()  # sizes after close: SQLite's write-ahead log is folded back in
    sizes = dir_sizes(work / "docs.ckf")
    out = {
        "pages": len(pages),
        "documents": rep.documents,
        "facts": ckf.n_rows,
        "tokens_mean": float(np.mean(ckf.token_counts)),
        "total_s": total,
        "embed_s": emb.seconds,
        "other_s": total - emb.seconds,
        "facts_per_s": ckf.n_rows / total,
        "embed_facts_per_s": emb.texts / emb.seconds,
        "reingest_s": reingest,
        "reingest_embedded": again.embedded,
        "sizes": sizes,
        "bytes_per_fact": sum(sizes.values()) / ckf.n_rows,
        "texts": texts,
        "check": problems,
    }
    return out


def bench_embedders(texts: list[str], n: int) -> dict[str, Any] | str:
    spec = importlib.util.spec_from_file_location("bench_embedders", BENCH / "embedders.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    try:
        return mod.run_embedder_comparison(texts[:n], batch_size=32)
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"


def _unit_rows(rng: np.random.Generator, n: int, dim: int) -> np.ndarray:
    v = rng.standard_normal((n, dim), dtype=np.float32)
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    return v


def _time_ms(fn: Any, repeats: int) -> tuple[float, float]:
    fn()  # warm
    ts = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        ts.append((time.perf_counter() - t) * 1e3)
    ts.sort()
    return statistics.median(ts), ts[min(len(ts) - 1, int(0.95 * len(ts)))]


def _near(rng: np.random.Generator, centre: np.ndarray, n: int, cos: float) -> np.ndarray:
    """Unit rows whose expected cosine to `centre` is `cos`."""
    noise = _unit_rows(rng, n, len(centre))
    noise -= (noise @ centre)[:, None] * centre  # orthogonal part only
    noise /= np.linalg.norm(noise, axis=1, keepdims=True)
    return (cos * centre + np.sqrt(1 - cos * cos) * noise).astype(np.float32)


def bench_select(work: Path, n: int, dtype: str, seed: int = 7,
                 planted: float = 0.01) -> dict[str, Any]:
    """`planted` of the rows sit around the query topic (cosine 0.3-0.7 to it), the rest are
    random, so the 0.4 gate passes a realistic share, as Phase 1 sees on a real CKF."""
    rng = np.random.default_rng(seed)
    dim = default_embedder().dim
    topic = _unit_rows(rng, 1, dim)[0]
    queries = list(_near(rng, topic, 20, 0.95))
    path = work / f"syn-{n}-{dtype}.ckf"
    ckf = CKF.create(path, default_embedder(), dtype=dtype)
    chunk = 100_000
    t0 = time.perf_counter()
    empty = np.zeros(0, dtype=np.uint64)
    for start in range(0, n, chunk):
        k = min(chunk, n - start)
        vecs = _unit_rows(rng, k, dim)
        hot = rng.choice(k, size=int(k * planted), replace=False)
        for cos, part in zip((0.3, 0.5, 0.7), np.array_split(hot, 3), strict=True):
            vecs[part] = _near(rng, topic, len(part), cos)
        ckf.append_raw([f"synthetic fact {start + i}" for i in range(k)], vecs,
                       tokens=np.full(k, 40, np.int32), ngram_lists=[empty] * k,
                       source=f"synthetic-{start}")
    build_s = time.perf_counter() - t0
    ckf.close()
    gc.collect()
    tracemalloc.start()
    t1 = time.perf_counter()
    ckf = CKF.open(path, default_embedder())
    open_ms = (time.perf_counter() - t1) * 1e3
    _, open_peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    qi = iter(range(10**9))

    def gated() -> int:
        return len(ckf.select(queries[next(qi) % len(queries)], 0.4, None))

    def topk_all() -> int:
        return len(ckf.select(queries[next(qi) % len(queries)], -1.0, 1000))

    passing = int(np.median([len(ckf.select(q, 0.4)) for q in queries]))
    g_med, g_p95 = _time_ms(gated, 15)
    t_med, t_p95 = _time_ms(topk_all, 15)
    rows = ckf.select(queries[0], -1.0, 64).indices
    f_med, _ = _time_ms(lambda: ckf.facts(rows), 15)
    out = {
        "n": n, "dtype": dtype, "build_s": build_s, "open_ms": open_ms,
        "open_peak_mb": open_peak / 1e6, "gate": 0.4, "passing": passing,
        "planted": planted,
        "gated_ms": g_med, "gated_p95_ms": g_p95, "top1000_ms": t_med, "top1000_p95_ms": t_p95,
        "facts64_ms": f_med, "size_mb": sum(dir_sizes(path).values()) / 1e6,
    }
    ckf.close()
    for p in path.iterdir():
        p.unlink()
    path.rmdir()
    return out


def markdown(ing: dict[str, Any] | None, cmp: dict[str, Any] | str,
             sel: list[dict[str, Any]]) -> str:
    lines = [] if ing is None else _ingest_markdown(ing, cmp)
    lines += _select_markdown(sel)
    return "\n".join(lines) + "\n"


def _ingest_markdown(ing: dict[str, Any], cmp: dict[str, Any] | str) -> list[str]:
    lines = ["### Ingest throughput (Python 3.11 HTML docs, default model, whole pipeline)", ""]
    lines += [
        "| pages | facts | mean tokens/fact | total s | embedding s | parse+chunk+store s "
        "| **facts/s** | embedding only, facts/s | re-ingest unchanged |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        f"| {ing['pages']} | {ing['facts']:,} | {ing['tokens_mean']:.0f} | {ing['total_s']:.1f}"
        f" | {ing['embed_s']:.1f} | {ing['other_s']:.1f} | **{ing['facts_per_s']:.1f}** | "
        f"{ing['embed_facts_per_s']:.1f} | {ing['reingest_s']:.2f} s, "
        f"{ing['reingest_embedded']} embedded |",
        "",
    ]
    lines += ["### Same fact texts, both embedders (fresh process each, batch 32)", ""]
    if isinstance(cmp, str):
        lines += [f"sentence-transformers side not run: {cmp}", ""]
    else:
        o, s, a = cmp["ours"], cmp["sentence_transformers"], cmp["agreement"]
        other_per_fact = ing["other_s"] / ing["facts"]
        st_ingest = 1.0 / (other_per_fact + 1.0 / s["sentences_per_s"])
        our_ingest = 1.0 / (other_per_fact + 1.0 / o["sentences_per_s"])
        lines += [
            "| embedder | cold load s | facts/s (encode) | ingest facts/s (derived) "
            "| peak RSS MB |",
            "|---|---:|---:|---:|---:|",
            f"| numpy MiniLM (`cdr.retrieval.embed`, default) | {o['cold_load_s']:.2f} | "
            f"{o['sentences_per_s']:.1f} | {our_ingest:.1f} | {o['max_rss_mb']:.0f} |",
            f"| sentence-transformers {s.get('sentence_transformers', '')} + torch | "
            f"{s['cold_load_s']:.2f} | {s['sentences_per_s']:.1f} | {st_ingest:.1f} | "
            f"{s['max_rss_mb']:.0f} |",
            "",
            f"{cmp['n_texts']} fact texts (mean {cmp['mean_chars']:.0f} chars). Agreement: min "
            f"cosine {a['min_cosine']:.6f}, top-1 neighbour agreement "
            f"{a['top1_neighbour_agreement']:.3f}. Derived ingest rate = 1 / (measured "
            f"non-embedding time per fact + 1 / encode rate).",
            "",
        ]
    sz = ing["sizes"]
    per100k = {k: v / ing["facts"] * 1e5 / 1e6 for k, v in sz.items()}
    lines += ["### Size on disk per 100k facts (from the real ingest, float32)", "",
              "| SQLite (text, metadata) | embeddings | 6-gram hashes + offsets | token counts "
              "| **total** |", "|---:|---:|---:|---:|---:|",
              f"| {per100k.get('sqlite', 0):.1f} MB | {per100k.get('embeddings', 0):.1f} MB | "
              f"{per100k.get('ngram_hashes', 0) + per100k.get('ngram_offsets', 0):.1f} MB | "
              f"{per100k.get('tokens', 0):.1f} MB | **{sum(per100k.values()):.1f} MB** |", ""]
    return lines


def _select_markdown(sel: list[dict[str, Any]]) -> list[str]:
    lines = ["### Phase 1 `select` (exact numpy over the memory-mapped matrix, d = 384)", "",
              "| facts | dtype | open, ms | open, Python heap MB | gate 0.4: passing | "
              "gate 0.4, ms (p95) | top-1000 of all, ms (p95) | facts() of 64 rows, ms |",
              "|---:|---|---:|---:|---:|---:|---:|---:|"]
    for r in sel:
        lines.append(
            f"| {r['n']:,} | {r['dtype']} | {r['open_ms']:.1f} | {r['open_peak_mb']:.1f} | "
            f"{r['passing']:,} | {r['gated_ms']:.1f} ({r['gated_p95_ms']:.1f}) | "
            f"{r['top1000_ms']:.1f} ({r['top1000_p95_ms']:.1f}) | {r['facts64_ms']:.2f} |")
    lines += ["", "Synthetic unit vectors appended with `CKF.append_raw` (the store's array "
              "path), 1% of them planted around the query topic; the CKF is closed and "
              "re-opened before timing; medians of 15 queries. Open heap: tracemalloc peak "
              "while opening (the row-state blobs; the matrix is mapped, not read).", "",
              f"Machine: {platform.machine()}, {os.cpu_count()} CPUs, Python "
              f"{platform.python_version()}, numpy {np.__version__}, load average "
              f"{os.getloadavg()[0]:.2f} at the end."]
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--facts", type=int, default=2000,
                    help="real facts to ingest (0: only the select benchmark)")
    ap.add_argument("--compare", type=int, default=1000, help="texts for the embedder duel")
    ap.add_argument("--sizes", default="100000,1000000")
    ap.add_argument("--float16", action="store_true", help="also time float16 stores")
    ap.add_argument("--no-st", action="store_true", help="skip sentence-transformers")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    from cdr import settings

    settings.export({"CDR_EMBED_CACHE": ""})  # time the model, never vectors kept by a run
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    with tempfile.TemporaryDirectory(prefix="cdr-bench-ingest-") as tmp:
        work = Path(tmp)
        ing = None
        if args.facts > 0:
            print(f"ingesting ~{args.facts} facts of the Python docs ...", flush=True)
            ing = bench_ingest(work, args.facts)
            print(f"  {ing['facts']} facts in {ing['total_s']:.1f} s "
                  f"({ing['facts_per_s']:.1f} facts/s); check: {ing['check'] or 'ok'}",
                  flush=True)
        cmp: dict[str, Any] | str = "skipped (--no-st)"
        if ing is not None and not args.no_st:
            print(f"embedder comparison on {args.compare} fact texts ...", flush=True)
            cmp = bench_embedders(ing["texts"], args.compare)
        sel = []
        for n in sizes:
            for dtype in ("float32", "float16") if args.float16 else ("float32",):
                print(f"select at {n:,} facts ({dtype}) ...", flush=True)
                sel.append(bench_select(work, n, dtype))
    md = markdown(ing, cmp, sel)
    print()
    print(md)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(md, encoding="utf-8")
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
