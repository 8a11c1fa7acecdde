"""Task shapes with the reference model: does the default write a multi-document task out, on
its own material, without restating itself?

`bench/shapes.py` measures what reaches the envelopes with the extractive writer; this runs the
reference model (Qwen2.5-Coder-1.5B-Instruct Q4_K_M on llama.cpp, in-process) on three tasks of
the PostgreSQL-manual knowledge base whose material spans several pages, chosen from the
report split of `bench/corpus_pg.py` before any run: the indexes chapter (12 pages, 3,000
words asked, as the measurement that opened the work), the GIN chapter (7 pages) and the
survey of views (5 reference pages), 2,000 words each. Arms: the default (`focused`),
`--profile spec` with the length contract (so a spec run ends on the words asked rather than at
the window limit) and relevance-only ranking under the default's options. At most 12 windows,
context 3,072 tokens, 1,024 generated a window, temperature 0.

Per run: words delivered / asked, windows and exit, share of the task's material sent, on-topic
share of the written envelopes, grounding (share of sentences whose best cosine to a fact of
their window reaches 0.508) and semantic repetition of windows 2+ (share of sentences at cosine
≥ 0.607 to an earlier window's; both thresholds are the ones the quality benchmark calibrated
on Python-docs outputs, `bench/long_llm.py`). Runs are checkpointed after every window and
resumed (`~/.cache/cdr/bench/shapes-llm/`); the report is `bench/results/shapes-llm.md`.

Usage: `python bench/shapes_llm.py [--only indexes,gin,views] [--arms focused,spec,relevance]
[--report-only]`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
from typing import Any

from _paths import BENCH
from long_llm import CONTEXT_TOKENS, GENERATION_TOKENS, LlmArm, arm_options, run_and_record
from retrieval import CKF_DIR, load_runs, own_rows
from shapes import measures, pg_tasks

RESULTS = BENCH / "results"
REPORT = RESULTS / "shapes-llm.md"
RUNS = CKF_DIR.parent / "shapes-llm" / "runs.jsonl"
PARTIAL = CKF_DIR.parent / "shapes-llm" / "partial"
MAX_WINDOWS = 12
# Chosen from the report split before any run: (task, words asked).
TASKS = (("indexes", 3000), ("gin", 2000), ("views", 2000))
ARMS = (
    LlmArm("focused", "the default (`--profile focused`)", {"profile": "focused"}),
    LlmArm("spec", "`--profile spec` with the length contract",
           {"profile": "spec", "length": "contract"}),
    LlmArm("relevance", "relevance-only ranking, the default's options",
           {"profile": "focused", "ranking": "relevance"}),
)


def key_of(task: Any, arm: LlmArm, words: int, n_rows: int) -> str:
    parts = ["shapes-llm-1", task.name, task.text, task.outline, arm.name,
             sorted(arm_options(arm).items()), words, MAX_WINDOWS, n_rows, CONTEXT_TOKENS,
             GENERATION_TOKENS]
    return hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()[:32]


def summary(rec: dict[str, Any], docs: dict[str, set[int]]) -> dict[str, Any]:
    """A finished run's shape measures (bench/shapes.py's) and text measures."""
    ws = rec["windows"]
    shape = measures({"envelopes": [w["rows"] for w in ws],
                      "written": [bool(w["text"].strip()) for w in ws],
                      "statuses": [w["status"] for w in ws],
                      "summary": {"stale_windows": 0},
                      "words": rec["delivered"]}, docs)

    def mean(key: str, start: int = 0) -> float:
        xs = [w[key] for w in ws[start:] if w.get(key) is not None]
        return sum(xs) / len(xs) if xs else math.nan

    return {"task": rec["task"], "arm": rec["arm"], "asked": rec["words"],
            "delivered": rec["delivered"], "ratio": rec["ratio"], "windows": len(ws),
            "status": rec["status"], "sent": shape["sent_share"],
            "docs_half": shape["docs_half"], "on_topic": shape["on_topic"],
            "grounding": mean("grounding"), "semrep": mean("semrep", 1)}


def render(rows: list[dict[str, Any]]) -> str:
    out = ["# Task shapes with the reference model", "",
           "`python bench/shapes_llm.py`: the PostgreSQL-manual knowledge base of "
           "`bench/shapes.py --corpus pg`, three report-split tasks, the reference model "
           f"(at most {MAX_WINDOWS} windows, context {CONTEXT_TOKENS}, {GENERATION_TOKENS} "
           "tokens a window). Grounding: share of sentences at cosine ≥ 0.508 to a fact of "
           "their window; semantic repetition: windows 2+, cosine ≥ 0.607 to an earlier "
           "window's sentence.", "",
           "| task | arm | words / asked | windows | exit | material sent | documents ≥ ½ "
           "sent | on-topic | grounding | semantic repetition W2+ |",
           "|---|---|---:|---:|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        out.append(f"| {r['task']} | {r['arm']} | {r['delivered']:,} / {r['asked']:,} "
                   f"({r['ratio']:.2f}) | {r['windows']} | {r['status']} | {r['sent']:.0%} "
                   f"| {r['docs_half']:.0%} | {r['on_topic']:.0%} | {r['grounding']:.0%} "
                   f"| {r['semrep']:.1%} |")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default="", help="comma-separated task names")
    ap.add_argument("--arms", default=",".join(a.name for a in ARMS))
    ap.add_argument("--report-only", action="store_true")
    args = ap.parse_args(argv)
    arms = [a for a in ARMS if a.name in args.arms.split(",")]
    wanted = {n for n, _ in TASKS if not args.only or n in args.only.split(",")}
    ckf, tasks = pg_tasks("report", ",".join(n for n, _ in TASKS))
    by_name = {t.name: (t, sources) for _, t, sources in tasks}
    owned = own_rows(ckf, shared=True)
    done = load_runs(RUNS)
    writer = None
    rows = []
    for name, words in TASKS:
        task, sources = by_name[name]
        docs = {s: owned.get(s, set()) for s in sources}
        own = set().union(*docs.values())
        for arm in arms:
            key = key_of(task, arm, words, ckf.n_rows)
            rec = done.get(key)
            if rec is None and not args.report_only and name in wanted:
                if writer is None:
                    from cdr.writers.local import LocalWriter

                    writer = LocalWriter(n_ctx=max(4096, round(CONTEXT_TOKENS * 1.3)))
                PARTIAL.mkdir(parents=True, exist_ok=True)
                rec = run_and_record(ckf, own, task, arm, words, key, writer, CONTEXT_TOKENS,
                                     GENERATION_TOKENS, RUNS, PARTIAL, None, MAX_WINDOWS)
            if rec is None:
                continue
            row = summary(rec, docs)
            rows.append(row)
            print(f"{name} {arm.name}: {row['delivered']}/{words} words, {row['windows']} "
                  f"windows, {row['status']}, sent {row['sent']:.0%}, on-topic "
                  f"{row['on_topic']:.0%}, grounding {row['grounding']:.0%}, semrep W2+ "
                  f"{row['semrep']:.1%}", flush=True)
    if rows:
        RESULTS.mkdir(exist_ok=True)
        REPORT.write_text(render(rows), encoding="utf-8")
        print(render(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
