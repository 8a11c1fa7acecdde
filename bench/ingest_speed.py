"""Ingest speed of the embedding candidates, side by side on a real corpus: the PostgreSQL 15
HTML manual (Debian `postgresql-doc-15`, `corpus.pg_docs_dir`).

1. Whole ingest: the same pages (picked by sha1 of the name until they hold `--facts` facts)
   ingested into a fresh CKF with the numpy MiniLM (the default before) and with the default
   (its float32 network on onnxruntime, texts of one length batched), interleaved 10 pages at a
   time (the order alternating), so that both see the same load; facts/s of the whole pipeline
   (parse, chunk, embed, commit) and of its embedding.
2. Embedding only, every candidate on the same fact texts (as ingest embeds them: recipe
   `title-section-short`), in one run:
   facts/s per repetition, the median, and the median of the per-repetition ratios to the
   numpy path measured in the same repetition; each candidate's cosine to the numpy vectors.
   Each repetition is interleaved chunk by chunk (200 texts: every candidate runs a chunk
   before the next chunk, the order rotated), so that all candidates see the same load.
   Candidates: `numpy` (one text a pass), `numpy-padded` (the numpy path cut by
   `_length_batches`, texts padded in batches of 32: its vectors depend on their neighbours,
   so it is a measure only), `onnx-alone` (onnxruntime, one text a run), `onnx` (the
   default: one length a batch, up to 32 texts), `onnx-intra2` (the default's batches one at a
   time on 2 intra-op threads instead of 2 workers of 1), `int8` (the opt-in int8 path,
   `minilm-int8`, its own identity), `static` (a static embedding table distilled here from
   the packaged MiniLM: every word piece's vector, a text's the mean of its pieces';
   `bench/static_embed.py`, a measure, not a shipped embedder).
3. With `--recall`: retrieval recall of the default against the numpy path on the retrieval
   benchmark's man-page and Python-docs corpora (`bench/retrieval.py`), each corpus ingested by
   each path: the gate with the best F1 on the TUNE tasks for cosine, fused relevance (BM25
   0.6) and fused relevance weighed by document support (`bench/calibrate_lexical.py`'s
   measure, as `bench/embed_paths.py` calibrates the int8 path's gates), and own-fact recall
   and precision on the REPORT tasks at the gates in `cdr.retrieval.gates`; the static table
   with its own best TUNE gates.

The machine is shared: the CPU model, its SIMD flags and the load average are printed with the
figures. Usage: `python bench/ingest_speed.py [--facts 2000] [--repeats 3]
[--ingest-repeats 2] [--candidates a,b] [--recall] [--out bench/results/ingest_speed.md]`
(`make bench-ingest` runs it after `bench/ingest.py`).
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
import platform
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

import _paths  # noqa: F401  (cdr importable from a checkout)
from _machine import cpu_name
from cdr.ckf import CKF, ingest
from cdr.retrieval.embed import (
    MiniLMEmbedder,
    MiniLMOnnxEmbedder,
    default_embedder,
    get_embedder,
    numpy_embedder,
)
from cdr.retrieval.fact_recipe import DEFAULT_RECIPE, fact_text
from corpus import pages_holding

OUT = Path(__file__).parent / "results" / "ingest_speed.md"
CANDIDATES = ("numpy", "numpy-padded", "onnx-alone", "onnx", "onnx-intra2", "int8", "static")
BASELINE = "numpy"
# Texts each candidate encodes before the next one takes its turn (`embed_speed`).
CHUNK = 200
# Pages each path ingests before the other takes its turn (`whole_ingest`).
GROUP_PAGES = 10


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def cpu_flags() -> str:
    """The SIMD flags that decide the kernels: AVX2, AVX-512, VNNI."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                have = set(line.split(":", 1)[1].split())
                wanted = ("avx2", "fma", "avx512f", "avx512_vnni", "avx_vnni", "amx_int8")
                return " ".join(f for f in wanted if f in have) or "none of avx2/avx512/vnni"
    except OSError:
        pass
    return "unknown"


def pick_pages(root: Path, target_facts: int) -> tuple[list[Path], int]:
    """Manual pages in sha1 order of their names until they hold about `target_facts` facts
    (a spread over the manual, not its first chapters)."""
    order = sorted(root.glob("*.html"), key=lambda p: hashlib.sha1(p.name.encode()).digest())
    return pages_holding(order, target_facts)


class Timed:
    """An embedder with the seconds it spent encoding recorded."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.model_id, self.dim = inner.model_id, inner.dim
        self.seconds = 0.0

    def encode(self, texts: Sequence[str], *, batch_size: int = 32, progress: Any = None
               ) -> np.ndarray:
        t = time.perf_counter()
        out = self.inner.encode(texts, batch_size=batch_size, progress=progress)
        self.seconds += time.perf_counter() - t
        return np.asarray(out)


def whole_ingest(pages: list[Path], work: Path, repeats: int,
                 group: int = GROUP_PAGES) -> dict[str, Any]:
    """The two paths' whole ingest of the same pages into a fresh CKF each, interleaved
    `group` pages at a time (each path ingests a group, the order alternating, before the
    next group), so that both see the same load."""
    groups = []
    for k in range(0, len(pages), group):
        d = work / "pages" / f"{k // group:03d}"
        d.mkdir(parents=True)
        for p in pages[k:k + group]:
            shutil.copyfile(p, d / p.name)
        groups.append(d)
    models = {"numpy": numpy_embedder(), "onnx": default_embedder()}
    runs: dict[str, list[tuple[float, float, int]]] = {k: [] for k in models}
    loads: list[str] = []
    texts: list[str] = []
    for r in range(repeats):
        timers = {n: Timed(m) for n, m in models.items()}
        stores = {n: CKF.create(work / f"{n}-{r}.ckf", timers[n]) for n in models}
        spent = dict.fromkeys(models, 0.0)
        for g, d in enumerate(groups):
            for name in (list(models) if (g + r) % 2 == 0 else list(models)[::-1]):
                t0 = time.perf_counter()
                ingest(stores[name], [d], source_type="official")
                spent[name] += time.perf_counter() - t0
        for name, ckf in stores.items():
            runs[name].append((spent[name], timers[name].seconds, ckf.n_rows))
            if not texts:
                rows = ckf.committer.fact_contexts(0, ckf.n_rows)
                texts = [fact_text(DEFAULT_RECIPE, c, t, s) for c, t, s in rows]
            ckf.close()
            shutil.rmtree(work / f"{name}-{r}.ckf")
            total, emb, n = runs[name][-1]
            print(f"ingest {r + 1} {name}: {n / total:.1f} facts/s (embedding {n / emb:.1f})",
                  flush=True)
        loads.append(load())
    return {"runs": runs, "loads": loads, "texts": texts}


def _numpy_padded(model: MiniLMEmbedder) -> Callable[[list[str]], np.ndarray]:
    return lambda texts: model._run_model(texts, 32, None)


def _onnx_alone(model: MiniLMOnnxEmbedder) -> Callable[[list[str]], np.ndarray]:
    return lambda texts: model._run_model(texts, 1, None)


def _onnx_intra2() -> Callable[[list[str]], np.ndarray]:
    import onnxruntime as ort

    from cdr.retrieval.embed_onnx import float32_model

    model = MiniLMOnnxEmbedder(threads=1)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 2
    opts.inter_op_num_threads = 1
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    graph = float32_model(model._root, {}, {})  # built by the default already: cached
    model._session = ort.InferenceSession(str(graph), opts, providers=["CPUExecutionProvider"])
    return lambda texts: model.encode(texts)


def candidates(names: Sequence[str]) -> dict[str, Callable[[list[str]], np.ndarray]]:
    out: dict[str, Callable[[list[str]], np.ndarray]] = {}
    for name in names:
        if name == "numpy":
            out[name] = numpy_embedder().encode
        elif name == "numpy-padded":
            out[name] = _numpy_padded(numpy_embedder())
        elif name == "onnx-alone":
            out[name] = _onnx_alone(default_embedder())  # type: ignore[arg-type]
        elif name == "onnx":
            out[name] = default_embedder().encode
        elif name == "onnx-intra2":
            out[name] = _onnx_intra2()
        elif name == "int8":
            out[name] = get_embedder("minilm-int8").encode
        elif name == "static":
            from static_embed import static_embedder

            out[name] = static_embedder().encode
        else:
            raise SystemExit(f"unknown candidate {name!r}; known: {', '.join(CANDIDATES)}")
    return out


def embed_speed(texts: list[str], fns: dict[str, Callable[[list[str]], np.ndarray]],
                repeats: int, chunk: int = CHUNK) -> dict[str, Any]:
    """Every candidate on the same texts, interleaved chunk by chunk (`chunk` texts: every
    candidate runs a chunk, the order rotated, before the next chunk), so that all of them
    see the same load on a shared machine; each repetition covers every text. Seconds per
    candidate and repetition, the load after each, cosines to the baseline's vectors."""
    for fn in fns.values():
        fn(texts[:64])  # warm: graphs built, sessions loaded, pages touched
    names = list(fns)
    seconds: dict[str, list[float]] = {n: [] for n in fns}
    parts: dict[str, list[np.ndarray]] = {n: [] for n in fns}
    loads = []
    turn = 0
    for r in range(repeats):
        spent = dict.fromkeys(names, 0.0)
        for lo in range(0, len(texts), chunk):
            part = texts[lo:lo + chunk]
            for name in names[turn % len(names):] + names[:turn % len(names)]:
                t0 = time.perf_counter()
                vecs = np.asarray(fns[name](part))
                spent[name] += time.perf_counter() - t0
                if r == 0:
                    parts[name].append(vecs)
            turn += 1
        for name in names:
            seconds[name].append(spent[name])
        loads.append(load())
        print(f"repetition {r + 1}: " + ", ".join(
            f"{n} {len(texts) / seconds[n][-1]:.1f}" for n in fns) + f" facts/s; load {loads[-1]}",
            flush=True)
    vecs = {n: np.concatenate(p) for n, p in parts.items() if p}
    base = vecs.get(BASELINE)
    cos = {n: (np.sum(v * base, axis=1) if base is not None else None) for n, v in vecs.items()}
    return {"seconds": seconds, "loads": loads, "cos": cos}


def recall(static: bool) -> list[str]:
    """Gates on TUNE and recall on REPORT, numpy path vs the default (and the static table)."""
    from calibrate_lexical import GATES, f1, measure
    from cdr.retrieval.fact_recipe import TITLE_SECTION_SHORT, identity
    from cdr.retrieval.gates import calibrated_gate
    from embed_paths import KINDS
    from retrieval import CKF_DIR, man_corpus, pydocs_corpus

    recipe = TITLE_SECTION_SHORT
    held = {"cosine": ("off", "off"), "fused (BM25 0.6)": ("bm25", "off"),
            "fused, document support 2": ("bm25", "support")}
    ident = identity(default_embedder().model_id, recipe)
    paths: dict[str, dict[str, Any]] = {"numpy": {}, "onnx": {}}
    ingest_s: dict[str, dict[str, tuple[float, int]]] = {"numpy": {}, "onnx": {}}
    for c in (man_corpus((recipe,)), pydocs_corpus((recipe,))):
        docs_ckf = {}
        for path, model in (("numpy", numpy_embedder()), ("onnx", default_embedder())):
            dst = CKF_DIR / f"{c.name}-speed-{path}-{recipe}.ckf"
            ckf = CKF.open_or_create(dst, model, recipe=recipe)
            t0 = time.perf_counter()
            rep = ingest(ckf, [_docs_root(c.name)], source_type="official",
                         include=_includes(c.name), exclude=_excludes(c.name))
            ingest_s[path][c.name] = (time.perf_counter() - t0, rep.embedded)
            ckf.refresh()
            docs_ckf[path] = ckf
        for path in paths:
            paths[path][c.name] = replace(c, ckfs={recipe: docs_ckf[path]})
    if static:
        from static_embed import static_copy

        paths["static"] = {n: replace(c, ckfs={recipe: static_copy(c.ckfs[recipe], n)})
                           for n, c in paths["numpy"].items()}
    tune = {p: {n: measure(c, recipe) for n, c in cs.items()} for p, cs in paths.items()}
    report = {p: {n: measure(replace(c, tasks={"tune": c.tasks["report"]}), recipe)
                  for n, c in cs.items()} for p, cs in paths.items()}

    def best(results: dict[str, Any], kind: str) -> tuple[float, float]:
        def score(g: float) -> float:
            return float(np.mean([f1(a / max(n, 1), a / max(p, 1))
                                  for a, n, p in (r[kind][g] for r in results.values())]))
        g = max(GATES, key=score)
        return g, score(g)

    lines = ["## Recall: the retrieval benchmark's corpora, each ingested by each path", "",
             "Facts per corpus: " + ", ".join(
                 f"{n} {c.ckfs[recipe].n_rows:,}" for n, c in paths["onnx"].items())
             + ". This run's ingest (whole pipeline, not interleaved; 0 embedded: built by "
             "an earlier run): " + "; ".join(
                 f"{p} " + ", ".join(f"{n} {e:,} embedded in {s:.0f} s" for n, (s, e) in d.items())
                 for p, d in ingest_s.items()) + ".", "",
             "Gates: the best mean F1 (own-fact recall, pooled precision) on the TUNE tasks.",
             "", "| relevance | " + " | ".join(f"{p} best gate (F1)" for p in paths)
             + " | in `cdr.retrieval.gates` |",
             "|---|" + "---:|" * (len(paths) + 1)]
    gates = {}
    for label, kind in KINDS.items():
        row = []
        for p in paths:
            g, s = best(tune[p], kind)
            gates[(p, label)] = g
            row.append(f"{g} ({s:.3f})")
        held_gate = calibrated_gate(ident, *held[label])
        lines.append(f"| {label} | " + " | ".join(row) + f" | {held_gate} |")
    lines += ["", "Recall on the REPORT tasks: the numpy path and the default at the gates in "
              "`cdr.retrieval.gates` (one model id, one set of gates); the static table at "
              "its own best TUNE gate.", "",
              "| relevance | corpus | tasks | " + " | ".join(f"{p} recall" for p in paths)
              + " | " + " | ".join(f"{p} precision" for p in paths) + " |",
              "|---|---|---:|" + "---:|" * (2 * len(paths))]
    for label, kind in KINDS.items():
        for name in paths["numpy"]:
            rec, prec = [], []
            for p in paths:
                g = calibrated_gate(ident, *held[label]) if p != "static" else gates[(p, label)]
                a, n, q = report[p][name][kind][g]
                rec.append(f"{a / max(n, 1):.1%}")
                prec.append(f"{a / max(q, 1):.1%}")
            tasks = len(paths["numpy"][name].tasks["report"])
            lines.append(f"| {label} | {name} | {tasks} | " + " | ".join(rec) + " | "
                         + " | ".join(prec) + " |")
    return lines


def _docs_root(name: str) -> Path:
    """The folder `bench/retrieval.py` ingests corpus `name` from."""
    if name == "man":
        import corpus_man

        return Path(corpus_man.corpus_dir()[0])
    from corpus import python_docs_dir

    return python_docs_dir()


def _includes(name: str) -> list[str]:
    if name == "man":
        return ["*.md"]
    from quality import RELATED

    return list(RELATED)


def _excludes(name: str) -> list[str]:
    if name == "man":
        return []
    from quality import EXCLUDE

    return list(EXCLUDE)


def markdown(args: argparse.Namespace, start_load: str, pages: int, ing: dict[str, Any],
             sp: dict[str, Any], texts: list[str], pieces: int, rec: list[str]) -> str:
    import onnxruntime

    words = np.mean([len(t.split()) for t in texts])
    lines = [
        "# Ingest speed: the embedding candidates side by side", "",
        f"- Machine: {cpu_name(platform.processor() or 'unknown')} ({cpu_flags()}), "
        f"{os.cpu_count()} logical CPUs, shared; load average at the start {start_load}, "
        f"at the end {load()}.",
        f"- Software: Python {platform.python_version()}, numpy {np.__version__}, "
        f"onnxruntime {onnxruntime.__version__}.",
        f"- Date: {datetime.now(UTC):%Y-%m-%d %H:%M} UTC.",
        f"- Command: `python bench/ingest_speed.py --facts {args.facts} --repeats "
        f"{args.repeats} --ingest-repeats {args.ingest_repeats}"
        + (f" --candidates {args.candidates}" if args.candidates != ",".join(CANDIDATES)
           else "") + (" --recall" if args.recall else "") + "`",
        f"- Data: {pages} pages of the PostgreSQL 15 HTML manual (Debian postgresql-doc-15, "
        f"picked by sha1 of the name), {len(texts):,} facts, mean {words:.0f} words and "
        f"{pieces / len(texts):.0f} word pieces per fact text (recipe `{DEFAULT_RECIPE}`).", "",
        f"## Whole ingest (parse, chunk, embed, commit), the two paths interleaved {GROUP_PAGES} "
        "pages at a time", "",
        "| run | path | facts/s | embedding facts/s | ratio to numpy (same repetition) |",
        "|---:|---|---:|---:|---:|",
    ]
    runs = ing["runs"]
    for r in range(len(runs["numpy"])):
        for name in runs:
            total, emb, n = runs[name][r]
            ratio = runs["numpy"][r][0] / total
            lines.append(f"| {r + 1} | {name} | {n / total:.1f} | {n / emb:.1f} | "
                         f"{ratio:.2f}× |")
    med = {n: statistics.median(x[2] / x[0] for x in v) for n, v in runs.items()}
    ratios = [a[0] / b[0] for a, b in zip(runs["numpy"], runs["onnx"], strict=True)]
    lines += ["", f"Median: numpy {med['numpy']:.1f}, onnx {med['onnx']:.1f} facts/s; median "
              f"ratio **{statistics.median(ratios):.2f}×**; load average after each "
              f"repetition: {'; '.join(ing['loads'])}.", "",
              f"## Embedding only, the same {len(texts):,} fact texts ({pieces:,} word pieces), "
              f"interleaved {CHUNK} texts at a time, {args.repeats} repetitions", "",
              "| candidate | facts/s, each repetition | median facts/s | median ratio to numpy "
              "| cosine to numpy: min / mean |", "|---|---|---:|---:|---|"]
    secs = sp["seconds"]
    for name, ss in secs.items():
        each = ", ".join(f"{len(texts) / s:.1f}" for s in ss)
        ratio = statistics.median(b / s for b, s in zip(secs[BASELINE], ss, strict=True)) \
            if BASELINE in secs else float("nan")
        c = sp["cos"].get(name)
        cos = "—" if c is None else f"{c.min():.6f} / {c.mean():.6f}"
        lines.append(f"| {name} | {each} | {statistics.median(len(texts) / s for s in ss):.1f} "
                     f"| {ratio:.2f}× | {cos} |")
    lines += ["", f"Load average after each repetition: {'; '.join(sp['loads'])}.", ""]
    return "\n".join(lines + rec) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--facts", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--ingest-repeats", type=int, default=2)
    ap.add_argument("--candidates", default=",".join(CANDIDATES))
    ap.add_argument("--recall", action="store_true")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    from cdr import settings
    from corpus import pg_docs_dir

    settings.export({"CDR_EMBED_CACHE": ""})  # time the models, never vectors kept by a run
    logging.getLogger().setLevel(logging.ERROR)  # onnxruntime's advice while it quantises
    start_load = load()
    print(f"{cpu_name()} ({cpu_flags()}), {os.cpu_count()} CPUs, load {start_load}", flush=True)
    pages, _ = pick_pages(pg_docs_dir(), args.facts)
    with tempfile.TemporaryDirectory(prefix="cdr-bench-ingest-speed-") as tmp:
        ing = whole_ingest(pages, Path(tmp), args.ingest_repeats)
    texts = ing["texts"]
    pieces = sum(len(x) for x in numpy_embedder().token_ids(texts))
    names = [n.strip() for n in args.candidates.split(",") if n.strip()]
    sp = embed_speed(texts, candidates(names), args.repeats)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    md = markdown(args, start_load, len(pages), ing, sp, texts, pieces, [])
    args.out.write_text(md, encoding="utf-8")  # the speed figures, before the long part
    if args.recall:
        md = markdown(args, start_load, len(pages), ing, sp, texts, pieces,
                      recall("static" in names))
        args.out.write_text(md, encoding="utf-8")
    print(md)
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
