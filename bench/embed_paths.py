"""The two embedding paths of the default model side by side (issue 26): float32 on numpy (the
default) and int8 on onnxruntime (`cdr.retrieval.embed_int8`, opt-in, its own identity).

One run, in this order, each step resumable (the int8 CKFs are kept in the retrieval
benchmark's cache and re-embedding resumes where a kill left it):

1. Speed on the same texts: the first `--facts` facts of the Python-docs retrieval CKF, as the
   ingest embeds them (recipe `title-section-short`: title and heading before the fact). The
   two paths alternate, `--repeats` times; facts/s and word pieces/s per run, the median of the
   per-pair ratios, and the load average after each pair.
2. Agreement: cosine of every int8 vector to the float32 vector of the same text.
3. The int8 path's own gate: the retrieval benchmark's two CKFs (man pages, Python docs)
   re-embedded by the int8 path, and `bench/calibrate_lexical.py`'s measure on their TUNE
   tasks only: the gate with the best mean F1 of own-fact recall and precision, for plain
   cosine, fused relevance (BM25 weight 0.6) and fused relevance weighed by document support
   (power 2) — the three gates `cdr.retrieval.gates` holds per identity.
4. Recall on the REPORT tasks (fixed before any tuning, `bench/retrieval.py`): own-fact recall
   and precision of each path at its own calibrated gates.

Usage: `python bench/embed_paths.py [--facts 1000] [--repeats 3]` — writes
bench/results/embed_paths.md.
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import re
import shutil
import time
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

import _paths  # noqa: F401  (cdr importable from a checkout)
from _machine import cpu_name
from calibrate_lexical import GATES, f1, measure
from cdr.ckf import CKF
from cdr.ckf.reembed import reembed
from cdr.retrieval.embed import MINILM_INT8_MODEL_ID, get_embedder
from cdr.retrieval.fact_recipe import TITLE_SECTION_SHORT, fact_text, identity
from cdr.retrieval.gates import calibrated_gate
from retrieval import CKF_DIR, man_corpus, pydocs_corpus

OUT = Path(__file__).parent / "results" / "embed_paths.md"
RECIPE = TITLE_SECTION_SHORT
KINDS = {"cosine": "spec", "fused (BM25 0.6)": "spec+bm25 0.6",
         "fused, document support 2": "spec+bm25 0.6 support 2"}


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def fact_texts(ckf: CKF, n: int) -> list[str]:
    rows = ckf.committer.fact_contexts(0, min(n, ckf.n_rows))
    return [fact_text(RECIPE, c, t, s) for c, t, s in rows]


@dataclass
class Speed:
    fp32_s: list[float]
    int8_s: list[float]
    loads: list[str]


def speed(texts: list[str], repeats: int) -> tuple[Speed, np.ndarray, np.ndarray, int]:
    fp32, int8 = get_embedder("minilm"), get_embedder("minilm-int8")
    pieces = sum(len(x) for x in fp32.token_ids(texts))
    fp32.encode(texts[:64])
    int8.encode(texts[:64])  # warm both (and build the int8 graph once)
    out = Speed([], [], [])
    vecs: dict[str, np.ndarray] = {}
    for r in range(repeats):
        order = (("fp32", fp32), ("int8", int8)) if r % 2 == 0 else (("int8", int8),
                                                                       ("fp32", fp32))
        for name, model in order:
            t0 = time.perf_counter()
            vecs[name] = model.encode(texts)
            (out.fp32_s if name == "fp32" else out.int8_s).append(time.perf_counter() - t0)
        out.loads.append(load())
        print(f"repeat {r + 1}: fp32 {len(texts) / out.fp32_s[-1]:.1f} facts/s, int8 "
              f"{len(texts) / out.int8_s[-1]:.1f} facts/s, load {out.loads[-1]}", flush=True)
    return out, vecs["fp32"], vecs["int8"], pieces


def int8_copy(src: CKF, name: str) -> CKF:
    """`src` re-embedded by the int8 path, in its own folder (kept; a killed run resumes)."""
    dst = CKF_DIR / f"{name}-int8-{RECIPE}.ckf"
    if not dst.exists():
        tmp = dst.with_name(dst.name + ".copying")
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(src.path, tmp)
        tmp.rename(dst)
    ckf = CKF.open(dst)
    t0 = time.perf_counter()
    rep = reembed(ckf, RECIPE, embedder=get_embedder("minilm-int8"))
    if rep.embedded:
        print(f"{name}: {rep.embedded} facts re-embedded by the int8 path in "
              f"{time.perf_counter() - t0:.0f} s", flush=True)
    ckf.refresh()
    return ckf


def best_gates(results: dict[str, dict]) -> dict[str, tuple[float, float]]:
    out = {}
    for label, kind in KINDS.items():
        def score(g: float, kind: str = kind) -> float:
            return float(np.mean([f1(a / max(n, 1), a / max(p, 1))
                                  for a, n, p in (r[kind][g] for r in results.values())]))
        g = max(GATES, key=score)
        out[label] = (g, score(g))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--facts", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    from cdr import settings

    settings.export({"CDR_EMBED_CACHE": ""})  # time the model, never vectors kept by a run
    logging.getLogger().setLevel(logging.ERROR)  # onnxruntime's advice while it quantises
    start_load = load()
    man, py = man_corpus((RECIPE,)), pydocs_corpus((RECIPE,))
    texts = fact_texts(py.ckfs[RECIPE], args.facts)
    sp, v32, v8, pieces = speed(texts, args.repeats)
    cos = np.sum(v32 * v8, axis=1)
    ratios = np.asarray(sp.fp32_s) / np.asarray(sp.int8_s)

    corpora = {}
    for c in (man, py):
        c8 = int8_copy(c.ckfs[RECIPE], c.name)
        corpora[c.name] = (c, replace(c, ckfs={RECIPE: c8}))
    tune = {path: {n: measure(pair[i], RECIPE) for n, pair in corpora.items()}
            for i, path in enumerate(("float32", "int8"))}
    gates = {p: best_gates(r) for p, r in tune.items()}
    report = {path: {n: measure(replace(pair[i], tasks={"tune": pair[i].tasks["report"]}),
                                RECIPE) for n, pair in corpora.items()}
              for i, path in enumerate(("float32", "int8"))}

    fp32_ident = identity("sentence-transformers/all-MiniLM-L6-v2", RECIPE)
    lines = [
        "# The two embedding paths of all-MiniLM-L6-v2: float32 (numpy) and int8 (onnxruntime)",
        "",
        f"- Machine: {cpu_name(platform.processor() or 'unknown')}, {os.cpu_count()} logical "
        f"CPUs, shared; load average at the start {start_load}, at the end {load()}.",
        f"- Date: {datetime.now(UTC):%Y-%m-%d %H:%M} UTC.",
        f"- Command: `python bench/embed_paths.py --facts {args.facts} --repeats {args.repeats}`",
        "",
        f"## Speed, the same {len(texts):,} fact texts ({pieces:,} word pieces, recipe "
        f"`{RECIPE}`, Python-docs CKF)",
        "",
        "| repeat | float32 facts/s | int8 facts/s | float32 pieces/s | int8 pieces/s | "
        "int8 / float32 | load average after |",
        "|---:|---:|---:|---:|---:|---:|---|",
    ]
    for i, (a, b) in enumerate(zip(sp.fp32_s, sp.int8_s, strict=True)):
        lines.append(f"| {i + 1} | {len(texts) / a:.1f} | {len(texts) / b:.1f} | "
                     f"{pieces / a:,.0f} | {pieces / b:,.0f} | {a / b:.2f} | {sp.loads[i]} |")
    lines += [
        "", f"Median of the paired ratios: **{np.median(ratios):.2f}×** facts/s (the same texts "
        "both ways, so pieces/s has the same ratio). The paths alternate, which goes first "
        "too; each uses every core (threads over batches; the int8 path runs one text per "
        "batch, so a text's vector never depends on its neighbours).", "",
        "## Agreement with the float32 vectors", "",
        f"Cosine of each int8 vector to the float32 vector of the same text, {len(texts):,} "
        f"texts: min {cos.min():.4f}, 1st percentile {np.percentile(cos, 1):.4f}, median "
        f"{np.median(cos):.4f}, mean {cos.mean():.4f}.", "",
        "## Gates, calibrated on the TUNE tasks of each path's own CKFs", "",
        "Mean over the two corpora of F1 (own-fact recall, pooled precision); "
        "`cdr.retrieval.gates` holds each identity's.", "",
        "| relevance | float32 gate (F1) | in `cdr.retrieval.gates` | int8 gate (F1) | in "
        "`cdr.retrieval.gates` |",
        "|---|---:|---:|---:|---:|",
    ]
    held = {"cosine": ("off", "off"), "fused (BM25 0.6)": ("bm25", "off"),
            "fused, document support 2": ("bm25", "support")}
    for label in KINDS:
        lx, docs = held[label]
        lines.append(
            f"| {label} | {gates['float32'][label][0]} ({gates['float32'][label][1]:.3f}) | "
            f"{calibrated_gate(fp32_ident, lx, docs)} | {gates['int8'][label][0]} "
            f"({gates['int8'][label][1]:.3f}) | "
            f"{calibrated_gate(f'{MINILM_INT8_MODEL_ID}#{RECIPE}', lx, docs)} |")
    lines += ["", "## Recall on the REPORT tasks, each path at its own calibrated gate", "",
              "| relevance | corpus | tasks | float32 recall | int8 recall | float32 precision "
              "| int8 precision |", "|---|---|---:|---:|---:|---:|---:|"]
    for label, kind in KINDS.items():
        for name, pair in corpora.items():
            cells = []
            for path in ("float32", "int8"):
                a, n, p = report[path][name][kind][gates[path][label][0]]
                cells.append((a / max(n, 1), a / max(p, 1)))
            lines.append(f"| {label} | {name} | {len(pair[0].tasks['report'])} | "
                         f"{cells[0][0]:.1%} | {cells[1][0]:.1%} | {cells[0][1]:.1%} | "
                         f"{cells[1][1]:.1%} |")
    text = "\n".join(lines) + "\n"
    old = OUT.read_text(encoding="utf-8") if OUT.exists() else ""
    # The quality section comes from `bench/quality.py` runs (its commands are in it): kept.
    m = re.search(r"<!-- quality -->.*?<!-- /quality -->\n?", old, flags=re.S)
    OUT.write_text(text + ("\n" + m.group(0) if m else ""), encoding="utf-8")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
