"""The retrieval benchmark's report: `bench/results/retrieval.md` and its PNGs, made from the
runs file (`bench/results/retrieval-runs.jsonl`) alone, so it can be rebuilt without running
anything: `python bench/retrieval_report.py`.

The report split comes first: its numbers are the final ones. The tune split is the set the
settings were chosen on, shown after it and labelled as such."""

from __future__ import annotations

import json
import math
import os
import platform
import sys
from collections import Counter
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from _machine import cpu_name
from _paths import BENCH

RESULTS = BENCH / "results"
SPLITS = ("report", "tune")
CORPORA = ("man", "pydocs")
CORPUS_TITLE = {"man": "Linux system-call man pages", "pydocs": "Python 3.11 docs"}
# The recommended profile on the default recipe, then on the longer one, or fresh before it.
TARGET_ARMS = ("focused short", "focused ts", "fresh ts")
# What `--profile focused` bundled on the library commits these runs were made on (the profile
# was being tuned while the benchmark ran; later runs record it themselves).
FOCUSED_AT = {
    "6d36eac": "memory=facts, subject=anchor, lexical=bm25, stale=stop (spec envelope and "
               "sub-queries); the current profile is the `focused ts subject-off bm25-on` row",
    "8ad0c0f": "memory=facts, lexical=bm25, stale=stop (subject anchoring dropped)",
}
# Commits of a branch later rebased onto main: the same library change under another hash.
COMMIT_NOTES = {
    "edb7cef": "document support, the short recipe and the stale stop's tail, before its rebase "
               "onto main (landed as f058a8c)",
    "3ebd866": "the same library as `edb7cef` (a documentation commit on top; landed as c03d14c)",
    "4559920": "`3ebd866` plus the tail's novelty floor (landed as 629cccc on a main whose HTML "
               "extractor changed, which would have re-chunked the Python-docs CKF the other "
               "runs used: these runs were made on the earlier checkout)",
}
TIMINGS = ("on time", "late", "before pool ran out", "window limit after pool ran out",
           "window limit")


def load(path: Path) -> list[dict[str, Any]]:
    """The latest run of each (corpus, split, arm, task): runs made on an earlier library stay
    in the file but a rerun replaces them here."""
    runs: dict[tuple[str, ...], dict[str, Any]] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rec = json.loads(line)
            runs[(rec["corpus"], rec["split"], rec["arm"], rec["task"])] = rec
        except (ValueError, KeyError, TypeError):
            continue
    return list(runs.values())


def compact(path: Path) -> int:
    """Rewrite the runs file with only the runs the report uses (`load`); returns how many
    superseded lines went. Run it when no benchmark is appending to the file."""
    lines = [ln for ln in path.read_text(encoding="utf-8").splitlines() if ln.strip()]
    keep = load(path)
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in keep), encoding="utf-8")
    os.replace(tmp, path)
    return len(lines) - len(keep)


def _nanmean(values: Sequence[float]) -> float:
    vals = [v for v in values if v is not None and not math.isnan(v)]
    return float(np.mean(vals)) if vals else math.nan


def pct(v: float) -> str:
    return "–" if v is None or math.isnan(v) else f"{100 * v:.1f}%"


def arm_order(runs: Sequence[dict[str, Any]]) -> list[str]:
    """Core arms first (relevance, spec, fresh, focused; plain before ts), then the grid."""
    from retrieval_arms import all_arms

    canon = [a.name for a in all_arms()]
    names = {r["arm"] for r in runs}
    return [a for a in canon if a in names] + sorted(names - set(canon))


def per_window(runs: Sequence[dict[str, Any]], field: str, windows: int,
               written_only: bool = True) -> tuple[list[float], list[int]]:
    """Mean of `field` per window over the runs that got that far (and wrote it)."""
    means, counts = [], []
    for w in range(windows):
        vals = [r["windows"][w][field] for r in runs if len(r["windows"]) > w
                and (r["windows"][w]["written"] or not written_only)]
        vals = [v for v in vals if v is not None and not math.isnan(v)]
        means.append(float(np.mean(vals)) if vals else math.nan)
        counts.append(len(vals))
    return means, counts


def arm_row(rs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    s = [r["summary"] for r in rs]
    stale = [x["stale_windows"] for x in s]
    timing = Counter(r["exit_timing"] for r in rs)
    # runs made before the loop-pool measure existed have no entry: counted as unknown
    timing_loop = Counter(r.get("exit_timing_loop", "unmeasured") for r in rs)
    reasons = Counter(x["exit_reason"] for x in s)
    return {
        "runs": len(rs),
        "w1": _nanmean([x["w1_on_topic"] for x in s]),
        "later_on": _nanmean([x["later_on_topic"] for x in s]),
        "later_n": sum(1 for x in s if not math.isnan(x["later_on_topic"])),
        "later_fresh": _nanmean([x["later_fresh"] for x in s]),
        "recall": _nanmean([x["own_recall_end"] for x in s]),
        "pool_recall": _nanmean([x["pool_recall_end"] for x in s]),
        "past_gate": _nanmean([r["own_pool"] / r["own"] if r["own"] else math.nan for r in rs]),
        "stale": float(np.mean(stale)), "stale_runs": sum(1 for v in stale if v),
        "written": float(np.mean([x["written_windows"] for x in s])),
        "timing": timing, "timing_loop": timing_loop, "reasons": reasons,
        "below_floor": _nanmean([r["below_floor"] / r["own_pool"] if r.get("own_pool")
                                 and "below_floor" in r else math.nan for r in rs]),
        "slope": _nanmean([x["on_topic_slope"] for x in s]),
        "seconds": float(np.mean([r["seconds"] for r in rs])),
    }


def summary_table(runs: Sequence[dict[str, Any]], arms: Sequence[str]) -> list[str]:
    """One row per arm; an arm whose runs come from another library commit than most of the
    section's is marked with it (an arm skipped as a duplicate on a later commit keeps its
    earlier runs)."""
    main_commit = Counter(r.get("commit", "?") for r in runs).most_common(1)[0][0]
    lines = ["| arm | runs | W1 on-topic | W2+ on-topic (runs) | W2+ fresh | own recall at end | "
             "own facts past the gate | gated own recall at end | stale windows / run (runs "
             "with any) | windows written | on-topic slope W2+ / window | exit | exit vs own "
             "pool running out | exit vs the pool the loop can still send |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---|"]
    for a in arms:
        rs = [r for r in runs if r["arm"] == a]
        if not rs:
            continue
        x = arm_row(rs)
        noop = sorted({k for r in rs for k in r.get("inert", [])})
        shown = f"{a} ({', '.join(noop)} not in the library yet: off)" if noop else a
        other = sorted({r.get("commit", "?") for r in rs} - {main_commit})
        if other:
            shown += f" (runs on {', '.join(other)})"
        reasons = ", ".join(f"{k} {v}" for k, v in x["reasons"].most_common())
        timing = ", ".join(f"{k} {x['timing'][k]}" for k in TIMINGS if x["timing"][k])
        timing_loop = ", ".join(f"{k} {v}" for k, v in x["timing_loop"].most_common())
        slope = "–" if math.isnan(x["slope"]) else f"{100 * x['slope']:+.1f} pt"
        lines.append(
            f"| {shown} | {x['runs']} | {pct(x['w1'])} | {pct(x['later_on'])} ({x['later_n']}) | "
            f"{pct(x['later_fresh'])} | {pct(x['recall'])} | {pct(x['past_gate'])} | "
            f"{pct(x['pool_recall'])} | {x['stale']:.1f} ({x['stale_runs']}) | "
            f"{x['written']:.1f} | {slope} | {reasons} | {timing} | {timing_loop} |")
    return lines


def window_table(runs: Sequence[dict[str, Any]], arms: Sequence[str], field: str,
                 windows: int) -> list[str]:
    lines = ["| arm | " + " | ".join(f"W{w + 1}" for w in range(windows)) + " |",
             "|---|" + "---:|" * windows]
    for a in arms:
        rs = [r for r in runs if r["arm"] == a]
        if not rs:
            continue
        means, counts = per_window(rs, field, windows)
        cells = [f"{pct(m)} ({n})" if n else "–" for m, n in zip(means, counts, strict=True)]
        lines.append(f"| {a} | " + " | ".join(cells) + " |")
    return lines


def target_lines(runs: Sequence[dict[str, Any]]) -> list[str]:
    arm = next((a for a in TARGET_ARMS if any(r["arm"] == a for r in runs)), None)
    if arm is None:
        return []
    x = arm_row([r for r in runs if r["arm"] == arm])

    def v(ok: bool) -> str:
        return "**met**" if ok else "**missed**"

    on_time = x["timing"]["on time"]
    slope = "–" if math.isnan(x["slope"]) else f"{100 * x['slope']:+.1f} points/window"
    return [
        f"Targets (issue 21) for `{arm}`:", "",
        f"- Window 1 envelope on-topic ≥ 90%: {pct(x['w1'])} — {v(x['w1'] >= 0.90)}",
        f"- Windows 2+ on-topic ≥ 85%, no falling trend: {pct(x['later_on'])} over "
        f"{x['later_n']} runs that wrote a second window, slope {slope} — "
        + ("no run wrote a second window" if x["later_n"] == 0 else
           v(x["later_on"] >= 0.85 and not x["slope"] < -0.01)),
        f"- own-fact recall at the end ≥ 80%: {pct(x['recall'])} — {v(x['recall'] >= 0.80)}",
        f"- stale windows written: {x['stale']:.2f} per run ({x['stale_runs']} runs with any) — "
        f"{v(x['stale_runs'] == 0)}",
        f"- exit within one window after the own pool runs out: {on_time} of {x['runs']} runs — "
        f"{v(on_time == x['runs'])}",
        f"- the same against the pool the loop can still send (the own pool less the facts never "
        f"sent whose novelty ratio fell below Exit 3's floor, {pct(x['below_floor'])} of the "
        f"pool): {x['timing_loop']['on time']} of {x['runs']} runs — "
        f"{v(x['timing_loop']['on time'] == x['runs'])}",
        "",
    ]


def task_table(runs: Sequence[dict[str, Any]]) -> list[str]:
    """Per task, for the target arm: where each document's own material went."""
    arm = next((a for a in TARGET_ARMS if any(r["arm"] == a for r in runs)), None)
    if arm is None:
        return []
    lines = [f"Per task, `{arm}`:", "",
             "| task | own facts | past the gate | windows written | W1 on-topic | own recall "
             "at end | exit | exit vs pool | below Exit 3's floor | exit vs the pool the loop "
             "can send |", "|---|---:|---:|---:|---:|---:|---|---|---:|---|"]
    for r in sorted((r for r in runs if r["arm"] == arm), key=lambda r: r["task"]):
        s = r["summary"]
        lines.append(f"| {r['task']} | {r['own']} | {r['own_pool']} | {s['written_windows']} | "
                     f"{pct(s['w1_on_topic'])} | {pct(s['own_recall_end'])} | "
                     f"{s['exit_reason']} at W{s['exit_window'] or len(r['windows'])} | "
                     f"{r['exit_timing']} | {r.get('below_floor', '–')} | "
                     f"{r.get('exit_timing_loop', '–')} |")
    return [*lines, ""]


def plot(runs: Sequence[dict[str, Any]], arms: Sequence[str], windows: int, title: str,
         path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(19, 5.2))
    x = np.arange(1, windows + 1)
    for a in arms:
        rs = [r for r in runs if r["arm"] == a]
        if not rs:
            continue
        style: dict[str, Any] = ({"linewidth": 2.4, "marker": "o"} if a in TARGET_ARMS
                                 else {"marker": "."})
        if "subject-" in a:  # the ablation grid: dashed, so ten colours tell 14 arms apart
            style["linestyle"] = "--"
        for ax, field in ((axes[0], "on_topic"), (axes[1], "fresh")):
            means, _ = per_window(rs, field, windows)
            ax.plot(x, 100 * np.asarray(means), label=a, **style)
    names = [a for a in arms if any(r["arm"] == a for r in runs)]
    recall = [100 * _nanmean([r["summary"]["own_recall_end"] for r in runs if r["arm"] == a])
              for a in names]
    axes[2].barh(np.arange(len(names)), recall, color="steelblue")
    axes[2].set_yticks(np.arange(len(names)), names, fontsize=7)
    axes[2].invert_yaxis()
    axes[2].axvline(80, color="crimson", linestyle="--", linewidth=1)
    axes[2].set_xlim(0, 100)
    axes[2].set_title("own-fact recall at the end (%; target 80)", fontsize=10)
    axes[0].set_title("on-topic share of the envelope, per written window (%)", fontsize=10)
    axes[1].set_title("fresh share of the envelope, per written window (%)", fontsize=10)
    axes[1].axhline(25, color="crimson", linestyle="--", linewidth=1)
    for ax in axes[:2]:
        ax.set_xlabel("window")
        ax.set_xticks(x)
        ax.set_ylim(-3, 103)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7, loc="lower left")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=85)
    plt.close(fig)


def machine() -> str:
    return (f"{platform.machine()}, {os.cpu_count()} CPUs ({cpu_name()}), "
            f"{platform.system()} {platform.release()}, Python {platform.python_version()}, "
            f"numpy {np.__version__}")


def ingest_lines() -> list[str]:
    p = RESULTS / "retrieval-ingest.json"
    if not p.exists():
        return []
    every = json.loads(p.read_text(encoding="utf-8"))
    if "facts_per_s" in every:  # the file's first layout: one corpus
        every = {every.get("corpus", "man"): every}
    L = ["## Ingest speed: each recipe against plain", "",
         "The same facts embedded as each recipe's texts, rounds interleaved chunk by chunk "
         "(A B C then C B A, so load changes hit all alike); the target is the default recipe "
         "(`title-section-short`) at ≥ 80% of plain's facts/s.", "",
         "| corpus | facts timed | rounds × chunk | load average | plain facts/s | "
         "recipe | facts/s | ratio to plain | mean words per fact (plain / recipe) |",
         "|---|---:|---:|---:|---:|---|---:|---:|---|"]
    notes = []
    for name, s in every.items():
        fps = s["facts_per_s"]
        plain = fps["plain"]
        for recipe, rate in fps.items():
            if recipe == "plain":
                continue
            ratio = rate / plain
            verdict = (" (met)" if ratio >= 0.8 else " (missed)") \
                if recipe == "title-section-short" else ""
            L.append(f"| {name} ({s['corpus_version']}) | {s['facts']} | {s['rounds']} × "
                     f"{s['chunk']} | {s['load']:.1f} | {plain:.1f} | {recipe} | {rate:.1f} | "
                     f"{100 * ratio:.1f}%{verdict} | "
                     f"{s['mean_words']['plain']:.1f} / {s['mean_words'][recipe]:.1f} |")
        notes.append(f"{name}: {_whole_ingest(s)}")
    return [*L, "", *notes, ""]


def _whole_ingest(s: dict[str, Any]) -> str:
    """The whole ingest (parse, embed, store) of the run, when it built the CKFs."""
    secs, emb = s.get("ingest_seconds", {}), s.get("ingest_embedded", {})
    if not emb or not all(emb.values()):
        return ("The whole ingest was not timed in this run: its CKFs were already built "
                "(pages already ingested are not embedded again).")
    return "Whole ingest (parse, embed, store) in this run: " + ", ".join(
        f"{k} {emb[k]} facts in {secs[k]:.1f} s ({emb[k] / secs[k]:.1f} facts/s)"
        for k in secs) + "."


def write(runs_path: Path = RESULTS / "retrieval-runs.jsonl",
          out: Path = RESULTS / "retrieval.md") -> Path:
    runs = load(runs_path)
    meta_p = RESULTS / "retrieval-meta.json"
    meta = json.loads(meta_p.read_text(encoding="utf-8")) if meta_p.exists() else {}
    commits = Counter(r.get("commit", "?") for r in runs)
    L = ["# Retrieval benchmark: the task's own material on a knowledge base of similar "
         "documents (issue 21)", "",
         f"Generated {datetime.now(UTC).strftime('%Y-%m-%d %H:%M UTC')} by "
         "`python bench/retrieval_report.py` from `bench/results/retrieval-runs.jsonl`; the "
         "runs were made with `python bench/retrieval.py --corpus man|pydocs --split "
         "tune|report` (`make bench-retrieval` does all four).", "",
         f"- Machine: {machine()}",
         "- Library commits the runs were made on: "
         + ", ".join(f"`{c}` ({n} runs)" for c, n in commits.most_common()),
         *[f"- `{c}`: {COMMIT_NOTES[c]}" for c, _ in commits.most_common()
           if c in COMMIT_NOTES],
         "- Writer: extractive (no language model); each run goes to the arm's own exit, at "
         "most 12 windows, 9,000 words; model all-MiniLM-L6-v2; each arm at its calibrated "
         "gate (`cdr.retrieval.gates`: 0.40 for plain facts, 0.325 for `focused` on short "
         "facts, …) unless it sets one."]
    for c in CORPORA:
        if c in meta:
            m = meta[c]
            sizes = Counter((r["recipe"], r.get("n_facts")) for r in runs if r["corpus"] == c)
            L.append(f"- Corpus `{c}`: {m['version']}; {m['documents']} documents; facts per "
                     "CKF in the runs: " + ", ".join(f"{rc} {n:,} ({k} runs)" for (rc, n), k
                                                    in sorted(sizes.items()) if n))
    L += ["", "Measures, per window of each run (`bench/retrieval_metrics.py`): **on-topic** "
          "= envelope facts from the task's own document; **fresh** = envelope facts not sent "
          "in an earlier window; **own recall** = the document's facts sent so far; a **stale "
          "window** is a written window with fresh < 25%; the **own pool** is the document's "
          "facts past the arm's gate, and it *ran out* at the window after which all were "
          "sent. An exit is *on time* when it comes in the window the pool ran out or the "
          "next. W2+ figures average the runs that wrote a second window.", ""]
    seen = [c for c, _ in commits.most_common()]
    focused = [f"- `{c}`: {FOCUSED_AT[c]}" for c in seen if c in FOCUSED_AT]
    profiles = {(r.get("commit"), json.dumps(r["options"], sort_keys=True)) for r in runs
                if r["arm"] == "focused ts"
                and "options" in r}
    focused += [f"- `{c}`: {o}" for c, o in sorted(profiles) if c not in FOCUSED_AT]
    if focused:
        L += ["`--profile focused` on the library commits of these runs:", "", *focused, ""]
    skipped = {tuple(x) for m in meta.values() for x in m.get("skipped_arms", [])}
    if skipped:
        L += ["Arms left out on the last run's checkout (an option the library did not have, "
              "or the same run as another arm; an option that lands lights its arm up):", ""]
        L += [f"- `{a}`: {why}" for a, why in sorted(skipped)]
        L.append("")
    for split in SPLITS:
        head = ("Report split (the final numbers)" if split == "report"
                else "Tune split (settings were chosen on these tasks; not the final numbers)")
        L += [f"## {head}", ""]
        for c in CORPORA:
            rs = [r for r in runs if r["split"] == split and r["corpus"] == c]
            if not rs:
                continue
            arms = arm_order(rs)
            tasks = len({r["task"] for r in rs})
            windows = max(len(r["windows"]) for r in rs)
            png = out.parent / f"retrieval_{c}_{split}.png"
            plot(rs, arms, windows, f"{CORPUS_TITLE[c]}, {split} split ({tasks} tasks)", png)
            made = Counter(r.get("commit", "?") for r in rs)
            L += [f"### {CORPUS_TITLE[c]} — {split} split, {tasks} tasks", "",
                  "Runs made on library commit " + ", ".join(
                      f"`{k}` ({v} runs)" for k, v in made.most_common()) + ".", "",
                  *summary_table(rs, arms), "", *target_lines(rs),
                  f"![{c} {split}]({png.name})", "",
                  "On-topic share per window (runs that wrote the window):", "",
                  *window_table(rs, arms, "on_topic", windows), "",
                  "Fresh share per window:", "",
                  *window_table(rs, arms, "fresh", windows), "", *task_table(rs)]
    L += ingest_lines()
    out.write_text("\n".join(L).rstrip() + "\n", encoding="utf-8")
    return out


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--compact"]
    path = Path(args[0]) if args else RESULTS / "retrieval-runs.jsonl"
    if "--compact" in sys.argv:
        print(f"{compact(path)} superseded runs dropped from {path}")
    print(write(path))
