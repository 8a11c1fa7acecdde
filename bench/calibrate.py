"""Calibrate the relevance gate and the DPE attribution threshold for an embedding model.

CRP-SPEC-024's 0.55 gate was written for large embedding models; MiniLM's cosines run lower.
This measures, on real documentation, how the gate separates a task's own material from the
rest of the corpus, and how well Stage 8 attributes a paragraph to its own section:

- tasks: documentation pages with at least `--min-sections` second-level sections; the task is
  "Write a guide to <page title>", the sub-queries are the section titles;
- relevance is measured against the same composite query the loop builds (topic + centroid of
  the sub-queries, normalised: `cdr.window.loop.Generator.start`);
- on-topic facts are the page's own facts; off-topic facts are every other page's.

Usage: python bench/calibrate.py --ckf PATH [--tasks 40] (the CKF of `bench/quality.py` or any
ingest of Debian's python3.11-doc). Writes bench/results/calibration.md.
"""

from __future__ import annotations

import argparse
import platform
from collections import defaultdict
from pathlib import Path

import numpy as np

from cdr.ckf import CKF
from cdr.retrieval.subject import task_topic
from cdr.vectors import normalize

GATES = (0.25, 0.30, 0.35, 0.40, 0.45, 0.50, 0.55)
THRESHOLDS = (0.15, 0.20, 0.25, 0.30, 0.35, 0.40)


def auc(pos: np.ndarray, neg: np.ndarray) -> float:
    """ROC AUC by ranks (Mann–Whitney U)."""
    scores = np.concatenate([pos, neg])
    ranks = scores.argsort().argsort() + 1.0
    return float((ranks[: len(pos)].sum() - len(pos) * (len(pos) + 1) / 2) / (len(pos) * len(neg)))


def pages(ckf: CKF, min_sections: int) -> dict[str, dict]:
    """source -> {title, sections: {name: [rows]}, rows} for pages with enough sections."""
    rows = np.flatnonzero(ckf.active)
    by_source: dict[str, dict] = {}
    for f in ckf.facts(rows):
        parts = [p.strip() for p in f.section.split(" > ")]
        page = by_source.setdefault(f.source, {"title": parts[0], "sections": defaultdict(list),
                                               "rows": []})
        page["rows"].append(f.row)
        if len(parts) >= 2:
            page["sections"][parts[1]].append(f.row)
    return {s: p for s, p in by_source.items()
            if sum(1 for rs in p["sections"].values() if len(rs) >= 2) >= min_sections}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ckf", type=Path, required=True)
    ap.add_argument("--tasks", type=int, default=40)
    ap.add_argument("--min-sections", type=int, default=5)
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" /
                    "calibration.md")
    args = ap.parse_args()
    ckf = CKF.open(args.ckf)
    emb = np.asarray(ckf.embeddings)
    active = np.flatnonzero(ckf.active)
    chosen = sorted(pages(ckf, args.min_sections).items(), key=lambda kv: kv[0])
    step = max(1, len(chosen) // args.tasks)
    chosen = chosen[::step][: args.tasks]
    on_all, off_all, aucs, per_gate = [], [], [], {g: [] for g in GATES}
    attr_sims_own, attr_correct = [], []
    for _source, page in chosen:
        names = [n for n, rs in page["sections"].items() if len(rs) >= 2]
        task = f"Write a guide to {page['title']}"
        vecs = ckf.embedder.encode([task_topic(task), *names])
        topic, sq = vecs[0], vecs[1:]
        q = normalize(topic + normalize(sq.mean(axis=0), "c"), "q")
        rel = emb[active] @ q
        own = np.isin(active, page["rows"])
        pos, neg = rel[own], rel[~own]
        on_all.append(pos)
        off_all.append(neg)
        aucs.append(auc(pos, neg))
        for g in GATES:
            passed_on, passed_off = int((pos >= g).sum()), int((neg >= g).sum())
            per_gate[g].append((passed_on / len(pos), passed_on, passed_off))
        # Stage 8: a section's own facts against all the page's sub-queries
        for j, name in enumerate(names):
            rows = np.asarray(page["sections"][name])
            sims = emb[rows] @ sq.T
            attr_sims_own.append(sims[:, j])
            attr_correct.append(np.argmax(sims, axis=1) == j)
    on, off = np.concatenate(on_all), np.concatenate(off_all)
    own_sims, correct = np.concatenate(attr_sims_own), np.concatenate(attr_correct)
    lines = [
        "# Calibration of the relevance gate and the DPE attribution threshold",
        "",
        f"Model `{ckf.model_id}`; CKF {ckf.n_rows} facts ({len(active)} active); "
        f"{len(chosen)} tasks (pages with ≥ {args.min_sections} sections of ≥ 2 facts); "
        f"machine {platform.machine()}, Python {platform.python_version()}.",
        f"Rerun: `python bench/calibrate.py --ckf {args.ckf}`",
        "",
        f"Query relevance, on-topic vs off-topic: ROC AUC mean {np.mean(aucs):.3f} "
        f"(min {np.min(aucs):.3f}); on-topic median {np.median(on):.3f}; off-topic 99th "
        f"percentile {np.percentile(off, 99):.3f}, 99.9th {np.percentile(off, 99.9):.3f}.",
        "",
        "| gate | on-topic facts passing (mean over tasks) | on-topic passing per task | "
        "off-topic passing per task | precision |",
        "|---|---|---|---|---|",
    ]
    for g in GATES:
        rec = np.mean([x[0] for x in per_gate[g]])
        n_on = np.mean([x[1] for x in per_gate[g]])
        n_off = np.mean([x[2] for x in per_gate[g]])
        prec = n_on / (n_on + n_off) if n_on + n_off else 0.0
        lines.append(f"| {g:.2f} | {rec:.1%} | {n_on:.1f} | {n_off:.1f} | {prec:.1%} |")
    lines += [
        "",
        f"Stage 8 attribution (a section's own facts vs all the page's sub-queries): argmax "
        f"correct {correct.mean():.1%}; similarity to the own sub-query: median "
        f"{np.median(own_sims):.3f}, 10th percentile {np.percentile(own_sims, 10):.3f}.",
        "",
        "| threshold | own-section facts at or above it |",
        "|---|---|",
    ]
    for t in THRESHOLDS:
        lines.append(f"| {t:.2f} | {(own_sims >= t).mean():.1%} |")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
