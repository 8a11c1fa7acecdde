"""Long documents (issue 22 §3): does a run deliver the words asked, over up to 20 windows, and
does Window 10 hold up like Window 1?

Tasks come from both corpora of the retrieval benchmark (`bench/retrieval.py`: the Python-docs
pages and the system-call man pages, their `report` split, the first `--tasks` of each). Each
task runs in two arms: the recommended profile (`--profile focused`) and relevance-only
ranking with the spec's options; at 2,000, 5,000 and 8,000 words asked; with at most 20
windows, each run to its own exit. Per window it records the words, the seconds, the
envelope's on-topic share (facts of the task's own document) and fresh share (facts no earlier
window was sent), and CWR6 (6-grams of the window that an earlier window wrote); per run the
words delivered over asked and LongBench-Write's length score (`cdr.window.length`).

The writer is the extractive one unless `--writer local` names the reference model on
llama.cpp: that benchmark, with its own fixed tasks, per-window checkpoints, text measures,
plots and verdicts, is `bench/long_llm.py` (report `bench/results/long.md`); the extractive
one's report is `bench/results/long-extractive.md`.
Finished runs are appended to a JSONL checkpoint keyed by the library's code, the task, the arm,
the length and the writer, so an interrupted run resumes (`--restart` starts over).

Usage: `python bench/long.py [--words 2000,5000,8000] [--tasks 3] [--max-windows 20]
[--writer extractive|local] [--max-runs N] [--report-only]`; `make bench-long` runs it.
"""

from __future__ import annotations

import argparse
import hashlib
import inspect
import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from _paths import BENCH, ROOT
from cdr.ngrams import NGRAM_SIZE, tokenize
from cdr.report import quality
from cdr.retrieval.fact_recipe import DEFAULT_RECIPE
from cdr.window.length import length_score, within_tolerance
from cdr.window.loop import GenerationConfig, Generator
from cdr.writers import get_writer
from retrieval import RTask, append_run, library_commit, load_runs, own_rows
from retrieval_metrics import window_measures
from window_rows import nan_mean as _mean

RESULTS = BENCH / "results"
RUNS = RESULTS / "long-runs.jsonl"
REPORT = RESULTS / "long-extractive.md"
WORDS = (2000, 5000, 8000)
MAX_WINDOWS = 20
TASKS = 3


@dataclass(frozen=True)
class LongArm:
    name: str
    label: str
    config: dict[str, Any]


ARMS = (
    LongArm("focused", "recommended profile (`--profile focused`, length contract included)",
            {"profile": "focused"}),
    LongArm("relevance", "relevance-only ranking, spec options plus the length contract",
            {"ranking": "relevance", "length": "contract"}),
)


def code_hash() -> str:
    """The library and this benchmark's run code: a run made on other code is not reused."""
    h = hashlib.sha256()
    for p in sorted((ROOT / "src" / "cdr").rglob("*.py")):
        h.update(p.relative_to(ROOT).as_posix().encode())
        h.update(p.read_bytes())
    h.update((BENCH / "retrieval_metrics.py").read_bytes())
    h.update(inspect.getsource(run_one).encode())
    return h.hexdigest()[:16]


def run_key(code: str, task: RTask, arm: LongArm, words: int, max_windows: int, writer: str,
            n_rows: int) -> str:
    parts = [code, task.corpus, task.name, task.text, task.outline, arm.name,
             sorted(arm.config.items()), words, max_windows, writer, n_rows]
    return hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()[:32]


def _cwr6(texts: Sequence[str]) -> list[float]:
    """CWR6 per window; NaN for a window too short to hold a 6-gram (not a flattering 0)."""
    return [c if len(tokenize(t)) >= NGRAM_SIZE else math.nan
            for c, t in zip(quality.cwr6(list(texts)), texts, strict=True)]


def run_one(ckf: Any, own: set[int], task: RTask, arm: LongArm, words: int,
            max_windows: int, writer: str) -> dict[str, Any]:
    """One (task, arm, length) run to its own exit; its per-window measures."""
    cfg = GenerationConfig(max_windows=max_windows, words=words, **arm.config)
    gen = Generator(ckf, get_writer(writer), cfg)
    session = gen.start(task.text, task.outline_text)
    envelopes: list[list[int]] = []
    written: list[bool] = []
    rows: list[dict[str, Any]] = []
    texts: list[str] = []
    for ev in gen.run(task.text, session=session):
        envelopes.append([int(r) for r in ev.prepared.rows])
        written.append(bool(ev.output.strip()))
        texts.append(ev.output)
        rows.append({"words": len(ev.output.split()), "seconds": round(ev.seconds, 3),
                     "status": ev.status, "finish_reason": ev.finish_reason,
                     "completeness": round(ev.completeness, 4)})
    measures = window_measures(envelopes, written, own)
    for row, m, c in zip(rows, measures, _cwr6(texts), strict=True):
        row.update(on_topic=_r(m.on_topic), fresh=_r(m.fresh), cwr6=_r(c),
                   envelope=m.envelope)
    delivered = sum(r["words"] for r in rows)
    return {"corpus": task.corpus, "task": task.name, "arm": arm.name, "words": words,
            "writer": writer, "max_windows": max_windows, "delivered": delivered,
            "ratio": round(delivered / words, 4),
            "length_score": round(length_score(words, delivered), 2),
            "within_tolerance": within_tolerance(words, delivered),
            "status": session.status, "windows": rows}


def _r(x: float) -> float | None:
    return None if math.isnan(x) else round(float(x), 5)


# ------------------------------------------------------------------------------------ report


def _pct(x: float) -> str:
    return "–" if math.isnan(x) else f"{100 * x:.1f}%"


def _num(x: float, fmt: str = ".0f") -> str:
    return "–" if math.isnan(x) else format(x, fmt)


def render(runs: Sequence[dict[str, Any]], meta: dict[str, Any]) -> str:
    """The Markdown report: length per arm and length, then the per-window curves."""
    writers = sorted({r["writer"] for r in runs})
    lines = [
        "# Long documents: the words asked, and every window at length",
        "",
        f"Generated {meta['generated']} by `make bench-long` (`python bench/long.py`), library "
        f"commit {meta['commit']}, from the checkpoint `bench/results/long-runs.jsonl`.",
        "",
        f"**Writer: {', '.join(writers)}.** "
        + ("The extractive writer pastes the envelope's facts under the plan's headings: "
           "these figures measure the loop's planning, retrieval and exits at length, not a "
           "language model's writing. The reference model's runs, with the text measures, "
           "plots and verdicts, are in `bench/results/long.md` (`--writer local`)."
           if writers == ["extractive"] else ""),
        "",
        f"- Tasks: {meta['tasks']}.",
        "- Arms: " + "; ".join(f"`{a.name}` = {a.label}" for a in ARMS) + ".",
        f"- Words asked: {', '.join(str(w) for w in meta['words'])}; at most "
        f"{meta['max_windows']} windows, each run to its own exit; context and generation "
        "budget the CLI's defaults (4,096 and 1,024 tokens).",
        "- Per window: words written; seconds; the envelope's on-topic share (facts of the "
        "task's own document) and fresh share (facts no earlier window was sent); CWR6 (the "
        "window's 6-grams an earlier window wrote).",
        "",
        "## Words delivered against words asked",
        "",
        "Means over tasks; the length contract is ±15% of the words asked (LongBench-Write "
        "length score ≥ 91.2 at 0.85·N).",
        "",
        "| arm | asked | runs | delivered (mean) | delivered / asked (min–max) | length score "
        "(mean, min) | within ±15% | windows (mean) | exits |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for arm in ARMS:
        for w in meta["words"]:
            rs = [r for r in runs if r["arm"] == arm.name and r["words"] == w]
            if not rs:
                continue
            ratios = [r["ratio"] for r in rs]
            scores = [r["length_score"] for r in rs]
            exits: dict[str, int] = {}
            for r in rs:
                exits[r["status"]] = exits.get(r["status"], 0) + 1
            lines.append(
                f"| {arm.name} | {w:,} | {len(rs)} | {_mean([r['delivered'] for r in rs]):,.0f}"
                f" | {min(ratios):.2f}–{max(ratios):.2f} | {_mean(scores):.1f}, "
                f"{min(scores):.1f} | {sum(r['within_tolerance'] for r in rs)}/{len(rs)} | "
                f"{_mean([len(r['windows']) for r in rs]):.1f} | "
                + ", ".join(f"{k} {v}" for k, v in sorted(exits.items())) + " |")
    lines += ["", "Per run:", "",
              "| corpus | task | arm | asked | delivered | ratio | score | windows | exit |",
              "|---|---|---|---:|---:|---:|---:|---:|---|"]
    for r in sorted(runs, key=lambda r: (r["corpus"], r["task"], r["arm"], r["words"])):
        lines.append(f"| {r['corpus']} | {r['task']} | {r['arm']} | {r['words']:,} | "
                     f"{r['delivered']:,} | {r['ratio']:.2f} | {r['length_score']:.1f} | "
                     f"{len(r['windows'])} | {r['status']} |")
    top = max(meta["words"])
    lines += ["", f"## Per window at {top:,} words asked", "",
              "Means over the tasks that reached the window (n); a window closed unwritten "
              "counts 0 words and has no CWR6. Seconds are the window's `WindowEvent.seconds`: "
              "prepare (select, rank, pack, plan) and write, not Stage 8's verification.", "",
              "| window | arm | n | words | seconds | on-topic | fresh | CWR6 |",
              "|---:|---|---:|---:|---:|---:|---:|---:|"]
    deepest = max((len(r["windows"]) for r in runs if r["words"] == top), default=0)
    for i in range(deepest):
        for arm in ARMS:
            ws = [r["windows"][i] for r in runs
                  if r["words"] == top and r["arm"] == arm.name and len(r["windows"]) > i]
            if not ws:
                continue
            lines.append(
                f"| {i + 1} | {arm.name} | {len(ws)} | {_mean([w['words'] for w in ws]):.0f} | "
                f"{_num(_mean([w['seconds'] for w in ws]), '.2f')} | "
                f"{_pct(_mean([w['on_topic'] for w in ws]))} | "
                f"{_pct(_mean([w['fresh'] for w in ws]))} | "
                f"{_pct(_mean([w['cwr6'] for w in ws]))} |")
    lines += ["", "## Not measured here", "",
              "- Semantic repetition, restating, grounding, tokens/s, the plots and the "
              "verdicts need generated text: `bench/results/long.md` (`--writer local`).", ""]
    return "\n".join(lines)


# -------------------------------------------------------------------------------------- main


def load_tasks(n: int) -> list[tuple[Any, dict[str, set[int]], RTask]]:
    """(CKF, own rows by source, task) for the first `n` report tasks of each corpus."""
    from retrieval import man_corpus, pydocs_corpus

    out = []
    for load in (pydocs_corpus, man_corpus):
        data = load()
        ckf = data.ckfs[DEFAULT_RECIPE]
        owners = own_rows(ckf)
        out += [(ckf, owners, t) for t in data.tasks["report"][:n]]
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--words", default=",".join(str(w) for w in WORDS),
                    help="words asked, comma-separated")
    ap.add_argument("--tasks", type=int, default=TASKS, help="report tasks per corpus")
    ap.add_argument("--max-windows", type=int, default=MAX_WINDOWS)
    ap.add_argument("--writer", default="extractive")
    ap.add_argument("--restart", action="store_true", help="ignore the checkpoint")
    ap.add_argument("--max-runs", type=int, default=None,
                    help="stop after this many new runs (--writer local: one run at a time)")
    ap.add_argument("--context-tokens", type=int, default=None)
    ap.add_argument("--generation-tokens", type=int, default=None)
    ap.add_argument("--report-only", action="store_true")
    ap.add_argument("--only", default=None,
                    help="--writer local: run only these TASK:ARM pairs, comma-separated "
                         "(e.g. mbind:focused); the report still covers every finished run")
    ap.add_argument("--stop-at", default=None,
                    help="--writer local: HH:MM (UTC), start no run and no window after it "
                         "(a run stopped between windows resumes from its checkpoint)")
    args = ap.parse_args(argv)
    try:
        words = tuple(int(w) for w in args.words.split(","))
    except ValueError:
        ap.error(f"--words must be integers separated by commas, got {args.words!r}")
    if any(w < 1 for w in words) or args.tasks < 1 or not 1 <= args.max_windows <= 20:
        ap.error("--words and --tasks must be positive and --max-windows within 1..20")
    if args.writer == "local":
        import long_llm

        only = None
        if args.only:
            only = [tuple(x.strip().split(":", 1)) for x in args.only.split(",") if x.strip()]
            if any(len(x) != 2 for x in only):
                ap.error(f"--only takes TASK:ARM pairs, got {args.only!r}")
        return long_llm.main(words, args.max_runs, args.report_only,
                             args.context_tokens or long_llm.CONTEXT_TOKENS,
                             args.generation_tokens or long_llm.GENERATION_TOKENS,
                             only=only, stop_at=args.stop_at)
    if args.restart and RUNS.exists():
        RUNS.unlink()
    done = load_runs(RUNS)
    tasks = load_tasks(args.tasks)
    code = code_hash()
    plan = [(ckf, owners, t, a, w) for ckf, owners, t in tasks for a in ARMS for w in words]
    kept: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    for i, (ckf, owners, task, arm, w) in enumerate(plan, 1):
        key = run_key(code, task, arm, w, args.max_windows, args.writer, ckf.n_rows)
        if key in done:
            kept.append(done[key])
            continue
        if args.report_only:
            continue
        started = time.perf_counter()
        rec = run_one(ckf, owners.get(task.source, set()), task, arm, w, args.max_windows,
                      args.writer)
        rec["key"] = key
        rec["seconds"] = round(time.perf_counter() - started, 2)
        append_run(RUNS, rec)
        kept.append(rec)
        print(f"[{i}/{len(plan)}] {task.corpus} {task.name} {arm.name} {w}: "
              f"{rec['delivered']}/{w} words ({rec['ratio']:.2f}), score "
              f"{rec['length_score']:.1f}, {len(rec['windows'])} windows, {rec['status']}, "
              f"{rec['seconds']:.0f} s (total {time.perf_counter() - t0:.0f} s)", flush=True)
    if not kept:
        print("no finished runs to report")
        return 1
    meta = {"generated": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M+00:00"),
            "commit": library_commit(), "words": words, "max_windows": args.max_windows,
            "tasks": "; ".join(f"{t.corpus} `{t.name}`" for _, _, t in tasks)}
    REPORT.write_text(render(kept, meta), encoding="utf-8")
    print(f"report: {REPORT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

