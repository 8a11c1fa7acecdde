"""Choosing a change to the long runs on tuning tasks, before the report tasks see it
(issue 22): `python bench/long_tune.py [--words 5000] [--stop-at HH:MM] [--report-only]`.

**Tasks, fixed before any run**: the two pages of the retrieval benchmark's TUNE split
(`retrieval.PYDOCS_TUNE`) whose own facts hold the most words; the report tasks of
`bench/long_llm.py` are not among them. **Arms**: `focused` (the recommended profile as it
stands) and each candidate on top of it (`CANDIDATES`). **Length**: 5,000 words asked, 20
windows at most, the long benchmark's context and generation budget; every window is
checkpointed (`long-tune-partial/`) and finished runs appended to `long-tune-runs.jsonl`.

**Decision rule, written before the runs**: a candidate joins `focused` when, over the
tuning runs' windows 2+, its mean lexical restating is lower than focused's, its mean
grounding in the envelope is not lower by more than 2 points, and every run of it delivers
0.85–1.15 of the words asked (or ends `ckf-exhausted`, as focused may). The report
(`bench/results/long-tune.md`) prints the means and the rule's outcome.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from typing import Any

from _paths import ROOT
from long_llm import (
    CONTEXT_TOKENS,
    GENERATION_TOKENS,
    RESULTS,
    LlmArm,
    run_and_record,
    run_key,
)
from long_llm_causes import Encoder, continued_split, enrich
from window_rows import nan_mean as _mean

RUNS = RESULTS / "long-tune-runs.jsonl"
PARTIAL = RESULTS / "long-tune-partial"
REPORT = RESULTS / "long-tune.md"
WORDS = 5000
N_TASKS = 2
BASE = LlmArm("focused", "recommended profile", {"profile": "focused"})
CANDIDATES = (
    LlmArm("focused+prefill", "focused with `resume: prefill` (cdr.window.resume)",
           {"profile": "focused", "resume": "prefill"}),
)
MEASURES = (("lexrep", "restating"), ("cwr6", "CWR6"), ("semrep_cal", "semantic repetition "
            "(recalibrated)"), ("grounding", "grounding (envelope)"),
            ("ground_page", "grounding in the page"))
GROUND_SLACK = 0.02


def tune_tasks() -> list[tuple[Any, set[int], Any]]:
    """(CKF, own rows, task) of the `N_TASKS` TUNE pages whose own facts hold the most words."""
    import numpy as np

    from cdr.retrieval.fact_recipe import DEFAULT_RECIPE
    from retrieval import own_rows, pydocs_corpus

    data = pydocs_corpus((DEFAULT_RECIPE,))
    ckf = data.ckfs[DEFAULT_RECIPE]
    owners = own_rows(ckf)
    tasks = [t for t in data.tasks["tune"]]
    sized = []
    for t in tasks:
        own = owners.get(t.source, set())
        words = sum(len(f.content.split()) for f in ckf.facts(
            np.asarray(sorted(own), dtype=np.int64))) if own else 0
        sized.append((words, t.name, t, own))
    sized.sort(key=lambda x: (-x[0], x[1]))
    return [(ckf, own, t) for _, _, t, own in sized[:N_TASKS]]


def _windows_2plus(run: dict[str, Any], key: str) -> list[float]:
    return [float(w[key]) for w in run["windows"][1:]
            if w.get("words") and w.get(key) is not None
            and not (isinstance(w[key], float) and math.isnan(w[key]))]


def decide(runs: Sequence[dict[str, Any]], arm: str) -> tuple[bool, str]:
    """The decision rule of the module doc for `arm` against focused."""
    def mean(a: str, key: str) -> float:
        return _mean([v for r in runs if r["arm"] == a for v in _windows_2plus(r, key)])

    mine = [r for r in runs if r["arm"] == arm]
    if not mine or not any(r["arm"] == BASE.name for r in runs):
        return False, "not measured"
    lex = mean(arm, "lexrep") < mean(BASE.name, "lexrep")
    ground = mean(arm, "grounding") >= mean(BASE.name, "grounding") - GROUND_SLACK
    length = all(0.85 <= r["ratio"] <= 1.15 or r["status"] == "ckf-exhausted" for r in mine)
    why = (f"restating lower: {'yes' if lex else 'no'}; grounding within "
           f"{GROUND_SLACK * 100:.0f} points: {'yes' if ground else 'no'}; length held: "
           f"{'yes' if length else 'no'}")
    return lex and ground and length, why


def render(runs: Sequence[dict[str, Any]], meta: dict[str, Any]) -> str:
    arms = [BASE.name] + [a.name for a in CANDIDATES]
    lines = ["# Long runs: choosing on the tuning tasks", "",
             f"Generated {meta['generated']} by `python bench/long_tune.py` (the reference model "
             f"on llama.cpp, context {CONTEXT_TOKENS}, generation {GENERATION_TOKENS}, "
             f"{WORDS:,} words asked). Tasks: {meta['tasks']} (the TUNE split's two pages with "
             "the most words of their own; no report task). The decision rule is the "
             "module doc's, written before the runs.", "",
             "| task | arm | words | ratio | windows | status | commit |",
             "|---|---|---:|---:|---:|---|---|"]
    for r in runs:
        lines.append(f"| `{r['task']}` | {r['arm']} | {r['delivered']:,} | {r['ratio']:.2f} | "
                     f"{len(r['windows'])} | {r['status']} | {r.get('commit', '')} |")
    lines += ["", "Means over windows 2+ that wrote words (all tuning runs of the arm), and "
              "over the windows continuing a begun section:", "",
              "| arm | windows | " + " | ".join(label for _, label in MEASURES) + " |",
              "|---|---|" + "---:|" * len(MEASURES)]
    for arm in arms:
        mine = [r for r in runs if r["arm"] == arm]
        if not mine:
            continue
        for label, pick in (("2+", lambda r: r["windows"][1:]),
                            ("continuing", lambda r: [w for c, w in continued_split(r) if c])):
            ws = [w for r in mine for w in pick(r) if w.get("words")]
            cells = [f"{_mean([w.get(k) for w in ws]) * 100:.1f}%" for k, _ in MEASURES]
            lines.append(f"| {arm} | {label} ({len(ws)}) | " + " | ".join(cells) + " |")
    lines += ["", "## Decision", ""]
    for a in CANDIDATES:
        ok, why = decide(runs, a.name)
        lines.append(f"- `{a.name}`: {'adopt' if ok else 'do not adopt'} ({why}).")
    lines += ["", "A decision here is checked on the long benchmark's report tasks before it "
              "stays: `focused+prefill` was adopted by this rule and then did not hold there "
              "(more windows where the model loops; bench/results/long.md, \"`focused` with "
              "and without resuming begun sections\"), so `focused` does not resume."]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    from long_llm_semrep import load_calibration
    from retrieval import load_runs

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--words", type=int, default=WORDS)
    ap.add_argument("--only", default=None, help="TASK:ARM pairs, comma-separated")
    ap.add_argument("--stop-at", default=None, help="HH:MM UTC: start no window after it")
    ap.add_argument("--report-only", action="store_true")
    args = ap.parse_args(argv)
    only = [tuple(x.split(":", 1)) for x in args.only.split(",")] if args.only else None
    tasks = tune_tasks()
    done = load_runs(RUNS)
    writer = None
    kept = []
    for ckf, own, task in tasks:
        for arm in (BASE, *CANDIDATES):
            key = run_key(task, arm, args.words, ckf.n_rows, CONTEXT_TOKENS, GENERATION_TOKENS)
            if key in done:
                kept.append(done[key])
                continue
            short = task.name.rsplit("/", 1)[-1]
            if args.report_only or (only and (short, arm.name) not in only
                                    and (task.name, arm.name) not in only):
                continue
            if writer is None:
                from cdr.writers.local import LocalWriter

                writer = LocalWriter(n_ctx=max(4096, round(CONTEXT_TOKENS * 1.3)))
            rec = run_and_record(ckf, own, task, arm, args.words, key, writer, CONTEXT_TOKENS,
                                 GENERATION_TOKENS, RUNS, PARTIAL, args.stop_at)
            if rec is None:
                continue
            kept.append(rec)
            print(f"{task.name} {arm.name}: {rec['delivered']}/{args.words} words, "
                  f"{len(rec['windows'])} windows, {rec['status']}, {rec['seconds']:.0f} s",
                  flush=True)
    # Every finished run of these tasks and arms at this length, the latest of each pair:
    # a key names the options the arm ran with, so a run stays reported after its profile
    # changed (the report names each run's commit).
    names = {t.name for _, _, t in tasks}
    arms = {a.name for a in (BASE, *CANDIDATES)}
    latest = {(r["task"], r["arm"]): r for r in [*load_runs(RUNS).values(), *kept]
              if r["task"] in names and r["arm"] in arms and r["words"] == args.words}
    kept = list(latest.values())
    if not kept:
        print("no finished runs to report")
        return 1
    cal = load_calibration()
    enc = Encoder(tasks[0][0].embedder.encode)
    by_name = {t.name: (ckf, own) for ckf, own, t in tasks}
    for r in kept:
        enrich(r, *by_name[r["task"]], enc, cal["threshold"] if cal else None)
    from datetime import UTC, datetime

    meta = {"generated": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M+00:00"),
            "tasks": ", ".join(f"`{t.name}`" for _, _, t in tasks)}
    REPORT.write_text(render(kept, meta), encoding="utf-8")
    print(f"report: {REPORT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
