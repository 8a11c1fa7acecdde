"""Choose what the `focused` profile bundles, on the TUNE split of both retrieval corpora only.

Rounds 1–2 ran subject anchoring, BM25 fusion and the stale stop on `title-section` CKFs, and
varied the options inherited from `fresh` (fact memory, fitted envelopes, expanded sub-queries),
which were chosen on the Python-docs quality benchmark, not on a knowledge base of similar
documents. Round 3 runs the profile as it then was (fact memory, BM25, stale stop) on
`title-section-short` CKFs, with and without document support (`cdr.retrieval.doc_support`) at two
powers. The report split is never read here; `bench/retrieval.py` reports the chosen profile
on it.

Usage: python bench/tune_focused.py [--round N] — writes bench/results/tune_focused_roundN.md.
"""

from __future__ import annotations

import argparse
import math
import platform
from pathlib import Path

import numpy as np
from rich.progress import Progress

import _paths  # noqa: F401  (cdr importable from a checkout)
from quality_arms import CachingEmbedder
from retrieval import man_corpus, own_rows, pydocs_corpus, run_one
from retrieval_arms import RetrievalArm

BASE = {"lexical": "bm25", "stale": "stop", "memory": "facts"}
# Round 1 chose the spec's envelope and sub-queries over fresh's (with the subject anchored);
# round 2 asks whether anchoring the subject still helps once BM25 carries the subject's words.
ROUNDS = {
    1: {
        "anchor, expanded + fit (fresh's)": {"subject": "anchor", "queries": "expanded",
                                             "envelope": "fit"},
        "anchor, titles + fit": {"subject": "anchor", "queries": "titles", "envelope": "fit"},
        "anchor, titles + budget": {"subject": "anchor", "queries": "titles",
                                    "envelope": "budget"},
        "anchor, expanded + budget": {"subject": "anchor", "queries": "expanded",
                                      "envelope": "budget"},
    },
    2: {
        "anchor, titles + budget": {"subject": "anchor", "queries": "titles",
                                    "envelope": "budget"},
        "no anchor, titles + budget": {"subject": "off", "queries": "titles",
                                       "envelope": "budget"},
        "no anchor, titles + fit": {"subject": "off", "queries": "titles", "envelope": "fit"},
    },
    # Each at its gate from bench/results/calibration_lexical_title-section-short.md.
    3: {
        "no document support (gate 0.40)": {"min_relevance": 0.40},
        "document support, power 1 (gate 0.35)": {"documents": "support", "support_power": 1.0,
                                                  "min_relevance": 0.35},
        "document support, power 2 (gate 0.325)": {"documents": "support",
                                                   "support_power": 2.0,
                                                   "min_relevance": 0.325},
    },
}
# The CKF recipe each round ran on.
ROUND_RECIPE = {1: "title-section", 2: "title-section", 3: "title-section-short"}
OUT = Path(__file__).parent / "results" / "tune_focused.md"
MAX_WINDOWS, WORDS = 12, 9000


def mean(xs: list[float]) -> float:
    xs = [x for x in xs if not math.isnan(x)]
    return float(np.mean(xs)) if xs else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--round", type=int, choices=sorted(ROUNDS), default=max(ROUNDS))
    round_no = ap.parse_args().round
    VARIANTS = ROUNDS[round_no]
    recipe = ROUND_RECIPE[round_no]
    corpora = [man_corpus((recipe,)), pydocs_corpus((recipe,))]
    rows = []
    with Progress() as progress:
        total = sum(len(c.tasks["tune"]) for c in corpora) * len(VARIANTS)
        bar = progress.add_task("tune runs", total=total)
        for corpus in corpora:
            ckf = corpus.ckfs[recipe]
            emb = CachingEmbedder(ckf.embedder)
            own = own_rows(ckf, shared=True)
            for name, extra in VARIANTS.items():
                arm = RetrievalArm(name, name, recipe, {**BASE, **extra})
                runs = []
                for task in corpus.tasks["tune"]:
                    runs.append(run_one(ckf, emb, own.get(task.source, set()), task, arm,
                                        MAX_WINDOWS, WORDS))
                    progress.advance(bar)
                s = [r["summary"] for r in runs]
                rows.append((corpus.name, name, len(runs),
                             mean([x["w1_on_topic"] for x in s]),
                             mean([x["later_on_topic"] for x in s]),
                             mean([x["own_recall_end"] for x in s]),
                             mean([float(x["stale_windows"]) for x in s]),
                             sum(r["exit_timing"] == "on time" for r in runs),
                             sum(r.get("exit_timing_loop") == "on time" for r in runs)))
    lines = [f"## Round {round_no}", "",
             f"Command: `python bench/tune_focused.py --round {round_no}`; machine "
             f"{platform.machine()}, Python "
             f"{platform.python_version()}; extractive writer, at most {MAX_WINDOWS} windows, "
             f"{WORDS} words; recipe `{recipe}`; every variant has {BASE}; TUNE split only.",
             "",
             "| corpus | variant | runs | W1 on-topic | W2+ on-topic | own recall at end | "
             "stale windows / run | exit on time | exit on time (pool the loop can send) |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for c, n, k, w1, w2, rec, stale, on_time, on_time_loop in rows:
        lines.append(f"| {c} | {n} | {k} | {w1:.1%} | {w2:.1%} | {rec:.1%} | {stale:.2f} | "
                     f"{on_time} of {k} | {on_time_loop} of {k} |")
    out = OUT.with_name(f"tune_focused_round{round_no}.md")
    out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
