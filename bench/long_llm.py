"""Long documents written by the reference model (issue 22 §3–§5): `bench/long.py --writer
local`. Does a run deliver the words asked over 10–20 windows, and is Window 10 as fresh and as
grounded as Window 1?

**Tasks, fixed before any run** (`TASKS`): per corpus of the retrieval benchmark, the report
tasks whose own document holds the most words of text, so that their own material can ground a
long document — the Python-docs pages `library/datetime.html` (15,441 words of page text) and
`library/unittest.html` (13,950), and the man page `mbind` (1,702 words, the longest of the
man report split: no man page can ground 5,000 words, so its long runs test the contract's
other branch, `ckf-exhausted` with the words grounded).

**Arms**: the recommended profile (`--profile focused`, which includes the length contract)
and relevance-only ranking with the spec's options plus the length contract (so both stop on
the words asked and differ only in what they retrieve).

**Matrix**, in this order: 2,000 words (3 tasks × 2 arms), then 5,000, then 8,000; at most
20 windows; context and generation budget `CONTEXT_TOKENS` / `GENERATION_TOKENS` (docs/llm.md,
"Windows sized to the model"). Every window is checkpointed (`long-llm-partial/<key>.json`:
the session and the windows so far), so an interrupted run resumes at its next window; a
finished run is appended to `long-llm-runs.jsonl` with its measures.

**Per window**: words; seconds; prompt tokens evaluated and reused, prompt and generation
tokens/s (`cdr.writers.local.WindowTiming`, under whatever load the machine had), the process's
CPU seconds and the load average at the window's end (`bench/long_llm_speed.py` splits the
seconds into the work the window asked of the model and the per-token rate); semantic repetition
against earlier windows and the lexical restating measure; CWR6; grounding in the window's
envelope; the envelope's on-topic and fresh shares; sections planned again and sections written
twice. Thresholds are the quality benchmark's calibrated ones (bench/results/quality-llm.md:
repetition 0.607, grounding 0.508, restating Jaccard 0.5), fixed before these runs, not tuned on
them.

**Verdicts** (`verdicts`): per measure, the mean over a run's last third of windows minus its
baseline (Window 1; Windows 2–3 for the measures that are 0 at Window 1 by construction), with
a percentile bootstrap interval over tasks; seconds per window as last third / first third.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from _paths import BENCH, ROOT
from cdr.ngrams import NGRAM_SIZE, tokenize
from cdr.report import quality
from cdr.session import IN_PROGRESS, Session
from cdr.text.self_repeat import REPETITION
from cdr.window.length import length_score, within_tolerance
from cdr.window.loop import GenerationConfig, Generator
from quality_llm_metrics import grounding, lexical_restating
from retrieval_metrics import window_measures
from window_rows import nan_mean as _mean
from window_rows import window_means

RESULTS = BENCH / "results"
RUNS = RESULTS / "long-llm-runs.jsonl"
# Version 1's runs (11 of the matrix, library commits up to 7db4d65): packed before the
# envelope budget counted the whole prompt (prompts of up to 2,875 model tokens where C − G
# allows 2,048 cl100k tokens), so they are no run of today's loop. Kept apart, shown as
# superseded, counted in no verdict.
RUNS_V1 = RESULTS / "long-llm-runs-v1.jsonl"
# Bench version 2's first Python-docs runs (5, on library commits 518e007 and c3264ec): made on
# a cached CKF that re-ingests under earlier code had grown to 7,240 rows, where a fresh build
# of the same 53 pages gives 7,097 (both on c3264ec and on 88c3c02). Their keys name the old
# size and their records name rows of the old CKF, so they can be neither resumed nor rescored
# on the CKF a clean checkout builds: kept apart like version 1's.
RUNS_OLD_CKF = RESULTS / "long-llm-runs-ckf7240.jsonl"
# `focused` plus `resume: "prefill"` (library c441b4e, when the tuning runs had put it in the
# profile): not confirmed on these tasks, so not the profile; kept for the comparison
# (long_llm_resume.py).
RUNS_FOCUSED_PREFILL = RESULTS / "long-llm-runs-v2-focused-prefill.jsonl"
# Bench version 2's runs (library commits up to 2ac4f04): written before the writers stopped
# a model's loop (cdr.text.self_repeat), when a window that looped ran to its token limit and
# its loop counted as delivered words. The comparison of `resume: prefill` is with them (made on
# the same code); nothing else counts them.
RUNS_V2 = RESULTS / "long-llm-runs-v2.jsonl"
SUPERSEDED = (
    (RUNS_V1, "bench version 1 (before the whole-prompt budget)",
     "runs made before the envelope budget counted the whole prompt (prompts of up to 2,875 "
     "model tokens, where C − G allows 2,048 cl100k tokens; docs/length.md, \"The budget "
     "counts the whole prompt\")"),
    (RUNS_OLD_CKF, "bench version 2 on the earlier Python-docs CKF",
     "Python-docs runs made on a cached CKF that re-ingests under earlier code had grown to "
     "7,240 rows; a fresh build of the same pages, which a clean checkout makes, has 7,097, so "
     "their rows cannot be read on it (docs/length.md, \"Runs on the earlier CKF\")"),
    (RUNS_V2, "bench version 2 (before the writers stopped a model's loop)",
     "runs whose windows that looped ran to the token limit, the loop counted as delivered "
     "words (docs/length.md, \"Loops are stopped, not delivered\")"),
    (RUNS_FOCUSED_PREFILL, "`focused` with `resume: prefill` (tried, not adopted)",
     "runs of the recommended profile with begun sections resumed, which the tuning runs had "
     "chosen and these tasks did not confirm (the section \"`focused` with and without "
     "resuming begun sections\" compares them)"),
)
# When the runs' processes were stopped for another measurement (long_llm_speed.load_pauses):
# windows spanning a pause are marked, and the seconds measures also given without them.
PAUSES = RESULTS / "long-llm-pauses.json"
PARTIAL = RESULTS / "long-llm-partial"
REPORT = RESULTS / "long.md"
PLOT = RESULTS / "long-windows.png"
# Bump when a change here or in the loop changes what a run is (2: the whole-prompt budget,
# and each window's end time recorded; 3: the writers stop a model's loop).
BENCH_VERSION = 3

TASKS = (("pydocs", "library/datetime.html"), ("pydocs", "library/unittest.html"),
         ("man", "mbind"))
WORDS = (2000, 5000, 8000)
MAX_WINDOWS = 20
CONTEXT_TOKENS = 3072  # docs/llm.md, "Windows sized to the model"
GENERATION_TOKENS = 1024
REP_THRESHOLD = 0.607
GROUND_THRESHOLD = 0.508
RESTATE_JACCARD = 0.5
BOOTSTRAP = 2000


@dataclass(frozen=True)
class LlmArm:
    name: str
    label: str
    config: dict[str, Any]


ARMS = (
    LlmArm("focused", "recommended profile (`--profile focused`, length contract included)",
           {"profile": "focused"}),
    LlmArm("relevance", "relevance-only ranking, spec options plus the length contract",
           {"ranking": "relevance", "length": "contract"}),
)


def run_key(task: Any, arm: LlmArm, words: int, n_rows: int, context: int,
            generation: int) -> str:
    """What makes a run: not the library's code (a model run takes minutes to hours; the
    record keeps the commit it ran on, and the report names it). An arm that names a profile
    also names the options the profile stands for today, so a run made before the profile
    changed is not taken for one of it (an arm of single options is keyed as before)."""
    parts = [BENCH_VERSION, task.corpus, task.name, task.text, task.outline, arm.name,
             sorted(arm.config.items()), words, MAX_WINDOWS, "local", n_rows, context,
             generation]
    if "profile" in arm.config:
        parts.append(sorted(arm_options(arm).items()))
    return hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()[:32]


def arm_options(arm: LlmArm) -> dict[str, str]:
    """The session options an arm's runs are made with (`SessionOptions.to_dict`)."""
    return GenerationConfig(**arm.config).session_options().to_dict()


def _atomic_write(path: Any, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data), encoding="utf-8")
    os.replace(tmp, path)


def run_windows(ckf: Any, writer: Any, task: Any, arm: LlmArm, words: int, key: str,
                context: int, generation: int, partial_dir: Any = None,
                max_new_windows: int | None = None, stop_at: str | None = None,
                max_windows: int = MAX_WINDOWS) -> tuple[Session, list[dict[str, Any]]]:
    """Windows to the run's own exit (or `max_new_windows` more, or until `stop_at`, HH:MM
    UTC, when no window starts), each checkpointed in `partial_dir`; resumes from the
    checkpoint. A writer without reuse counting (the
    extractive one, in tests) records no timing."""
    cfg = GenerationConfig(max_windows=max_windows, words=words, context_tokens=context,
                           generation_tokens=generation, **arm.config)
    gen = Generator(ckf, writer, cfg)
    partial = (partial_dir or PARTIAL) / f"{key}.json"
    if partial.exists():
        state = json.loads(partial.read_text(encoding="utf-8"))
        session = Session.from_dict(state["session"], ckf.ngram_index)
        windows = state["windows"]
    else:
        session = gen.start(task.text, task.outline_text)
        windows = []
    by_id = {sq.id: sq.text for sq in session.sub_queries}
    reuse = getattr(writer, "reuse", None)
    new = 0
    while session.status == IN_PROGRESS and (max_new_windows is None or new < max_new_windows):
        if stop_at and time.strftime("%H:%M", time.gmtime()) >= stop_at:
            break
        finished_before = [by_id[i] for i in session.finished_ids]
        calls = reuse.calls if reuse is not None else 0
        cpu = time.process_time()
        ev = gen.step(session)
        cpu = time.process_time() - cpu
        new += 1
        timing = writer.last_timing if reuse is not None and reuse.calls > calls else None
        windows.append({
            "number": ev.number, "text": ev.output, "words": len(ev.output.split()),
            "seconds": round(ev.seconds, 2), "status": ev.status,
            "finish_reason": ev.finish_reason, "completeness": round(ev.completeness, 4),
            "rows": [int(r) for r in ev.prepared.rows], "written": bool(ev.output.strip()),
            "plan": [[p.title, p.target_words, p.whole] for p in ev.prepared.plan],
            "finished_before": finished_before,
            # what survives load (bench/long_llm_speed.py): the process's CPU seconds in the
            # window (the loop's and the model's: llama.cpp runs in this process) and the
            # 1-minute load average as it ended
            "cpu_s": round(cpu, 2), "load": round(os.getloadavg()[0], 2),
            # when it ended (UTC): a window whose seconds span a pause of the process (the
            # lead's SIGSTOP for a quiet timing) is found by it, and its wall seconds set aside
            "ended": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "timing": None if timing is None else {
                "prompt_tokens": timing.prompt_tokens, "reused": timing.reused_tokens,
                "prompt_s": round(timing.prompt_seconds, 3),
                "completion_tokens": timing.completion_tokens,
                "generation_s": round(timing.generation_seconds, 3)},
        })
        _atomic_write(partial, {"session": session.to_dict(), "windows": windows})
    return session, windows


# ---------------------------------------------------------------------------------- measures


def replanned(windows: Sequence[dict[str, Any]]) -> tuple[float, float]:
    """(sections planned again, sections written twice), as shares of the sections planned
    in windows 2+. *Planned again*: planned by an earlier window too (the quality benchmark's
    measure, continuations of cut sections included). *Written twice*: planned although an
    earlier window had written it whole (the length contract's `finished_ids`)."""
    seen: set[str] = set()
    planned = again = twice = 0
    for i, w in enumerate(windows):
        titles = [p[0] for p in w["plan"]]
        if i and titles:
            planned += len(titles)
            again += sum(t in seen for t in titles)
            twice += sum(t in set(w.get("finished_before", ())) for t in titles)
        seen.update(titles)
    return (again / planned, twice / planned) if planned else (math.nan, math.nan)


def text_measures(ckf: Any, windows: Sequence[dict[str, Any]]) -> dict[str, list[float]]:
    """Semantic repetition, lexical restating, CWR6 and grounding per window."""
    texts = [w["text"] for w in windows]
    sents = [quality.sentences(t) for t in texts]
    enc = ckf.embedder.encode
    dim = ckf.dim
    vecs = [enc(s) if s else np.zeros((0, dim), np.float32) for s in sents]
    semrep = quality.semantic_repetition(vecs, REP_THRESHOLD)
    lexrep = lexical_restating(sents, RESTATE_JACCARD)
    cwr = [c if len(tokenize(t)) >= NGRAM_SIZE else math.nan
           for c, t in zip(quality.cwr6(texts), texts, strict=True)]
    ground = []
    for w, v in zip(windows, vecs, strict=True):
        if not len(v):
            ground.append(math.nan)
            continue
        facts = [f.content for f in ckf.facts(np.asarray(w["rows"], dtype=np.int64))]
        fv = enc(facts) if facts else np.zeros((0, dim), np.float32)
        ground.append(grounding(v, fv, GROUND_THRESHOLD))
    return {"semrep": semrep, "lexrep": lexrep, "cwr6": cwr, "grounding": ground}


def _r(x: float | None, nd: int = 5) -> float | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else round(x, nd)


def finish_record(ckf: Any, own: set[int], task: Any, arm: LlmArm, words: int,
                  session: Session, windows: list[dict[str, Any]]) -> dict[str, Any]:
    """The run's record: per-window measures, length and re-planning."""
    ms = window_measures([w["rows"] for w in windows], [w["written"] for w in windows], own)
    tm = text_measures(ckf, windows)
    rows = []
    for i, (w, m) in enumerate(zip(windows, ms, strict=True)):
        t = w.get("timing") or {}
        evaluated = max(0, t.get("prompt_tokens", 0) - t.get("reused", 0))
        rows.append({
            "words": w["words"], "seconds": w["seconds"], "status": w["status"],
            "finish_reason": w["finish_reason"], "completeness": w["completeness"],
            "envelope": m.envelope, "on_topic": _r(m.on_topic), "fresh": _r(m.fresh),
            "semrep": _r(tm["semrep"][i]), "lexrep": _r(tm["lexrep"][i]),
            "cwr6": _r(tm["cwr6"][i]), "grounding": _r(tm["grounding"][i]),
            "prompt_tokens": t.get("prompt_tokens"), "reused_tokens": t.get("reused"),
            "prompt_tps": _r(evaluated / t["prompt_s"], 2) if t.get("prompt_s") and evaluated
            else None,
            "gen_tps": _r(t["completion_tokens"] / t["generation_s"], 2)
            if t.get("generation_s") and t.get("completion_tokens") else None,
            "completion_tokens": t.get("completion_tokens"),
            "prompt_s": t.get("prompt_s"), "generation_s": t.get("generation_s"),
            "cpu_s": w.get("cpu_s"), "load": w.get("load"), "ended": w.get("ended"),
            "plan": w["plan"], "text": w["text"], "rows": w["rows"],
        })
    delivered = sum(w["words"] for w in windows)
    again, twice = replanned(windows)
    return {"corpus": task.corpus, "task": task.name, "arm": arm.name, "words": words,
            "writer": "local", "delivered": delivered, "ratio": round(delivered / words, 4),
            "length_score": round(length_score(words, delivered), 2),
            "within_tolerance": within_tolerance(words, delivered), "status": session.status,
            "replanned": _r(again), "written_twice": _r(twice), "windows": rows}


def page_floor(ckf: Any, own: set[int], n_windows: int) -> list[float]:
    """Semantic repetition of text no model wrote: the task document's own facts, in document
    order, cut into `n_windows` windows of equal words. The page repeats nothing on purpose,
    so what it scores is the measure's floor on this topic (sentences about one module
    resemble each other at the threshold): the model's restating is what lies above it."""
    if n_windows < 2 or not own:
        return []
    facts = ckf.facts(np.asarray(sorted(own), dtype=np.int64))
    words = " ".join(f.content for f in facts).split()
    size = math.ceil(len(words) / n_windows)
    chunks = [" ".join(words[i * size:(i + 1) * size]) for i in range(n_windows)]
    sents = [quality.sentences(c) for c in chunks]
    vecs = [ckf.embedder.encode(s) if s else np.zeros((0, ckf.dim), np.float32)
            for s in sents]
    return quality.semantic_repetition(vecs, REP_THRESHOLD)


def words_per_token(runs: Sequence[dict[str, Any]], arm: str) -> tuple[float, int]:
    """(words kept / completion tokens generated, windows counted) over an arm's windows."""
    words = tokens = n = 0
    for r in runs:
        if r["arm"] != arm:
            continue
        for w in r["windows"]:
            if w.get("completion_tokens"):
                words += w["words"]
                tokens += w["completion_tokens"]
                n += 1
    return (words / tokens if tokens else math.nan), n


# ---------------------------------------------------------------------------------- verdicts

# measure → baseline windows (1-based, inclusive): repetition measures are 0 at Window 1
BASELINE = {"semrep": (2, 3), "semrep_cal": (2, 3), "semrep_excess": (2, 3), "lexrep": (2, 3),
            "cwr6": (2, 3),
            "grounding": (1, 1), "ground_page": (1, 1), "ground_rest": (1, 1),
            "sent_off_page": (1, 1), "invented_ungrounded": (1, 1),
            "on_topic": (1, 1), "fresh": (1, 1)}
MEASURES = ("semrep", "lexrep", "cwr6", "grounding", "on_topic", "fresh", "words", "seconds",
            "prompt_tps", "gen_tps")
LABELS = {"semrep": "semantic repetition (0.607, old)",
          "semrep_cal": "semantic repetition (recalibrated)",
          "semrep_excess": "semantic repetition above the page's floor (recalibrated)",
          "ground_rest": "grounding, sentences naming no name outside the envelope",
          "sent_off_page": "sentences naming a name not on the page",
          "ground_page": "grounding in the task's whole page",
          "invented_ungrounded": "sentences grounded nowhere in the page naming a name not on it",
          "lexrep": "lexical restating", "cwr6": "CWR6",
          "grounding": "grounding", "on_topic": "on-topic share", "fresh": "fresh share",
          "words": "words", "seconds": "seconds", "prompt_tps": "prompt tokens/s",
          "gen_tps": "generation tokens/s"}


RATIO_LABELS = {
    "seconds_ratio": "seconds per window (ratio)",
    "seconds_ratio_unpaused": "seconds per window (ratio), windows spanning a pause left out",
    "work_ratio": "… of which work: the last third's tokens at the first third's speed",
    "rate_ratio": "… of which rate: seconds per token, last third / first third"}


def _vals(run: dict[str, Any], measure: str, lo: int, hi: int) -> list[float]:
    """The measure over windows lo..hi that were written: a window closed unwritten (the
    stale stop's, an empty envelope's) ends the run and is no window of the document."""
    out = []
    for w in run["windows"][lo - 1:hi]:
        if not w.get("words"):
            continue
        v = w.get(measure)
        if v is not None and not (isinstance(v, float) and math.isnan(v)):
            out.append(float(v))
    return out


def last_third_delta(run: dict[str, Any], measure: str) -> float | None:
    """Mean of the run's last third of windows minus its baseline windows' mean; None when the
    run is too short to have both apart (fewer than 3 windows, or a last third inside the
    baseline)."""
    n = len(run["windows"])
    lo, hi = BASELINE[measure]
    start = n - max(1, n // 3) + 1  # first window of the last third, 1-based
    if n < 3 or start <= hi:
        return None
    base, last = _vals(run, measure, lo, hi), _vals(run, measure, start, n)
    if not base or not last:
        return None
    return statistics.fmean(last) - statistics.fmean(base)


def seconds_ratio(run: dict[str, Any]) -> float | None:
    """Seconds per written window, last third / first third (None below 3 written windows)."""
    secs = [w["seconds"] for w in run["windows"] if w["words"] > 0]
    k = len(secs) // 3
    if k < 1:
        return None
    return statistics.fmean(secs[-k:]) / statistics.fmean(secs[:k])


def bootstrap(values: Sequence[float], reps: int = BOOTSTRAP, seed: int = 0
              ) -> tuple[float, float, float]:
    """(mean, 2.5th, 97.5th percentile) of the mean over resampled values (tasks)."""
    v = np.asarray(values, dtype=np.float64)
    if v.size == 0:
        return (math.nan, math.nan, math.nan)
    rng = np.random.default_rng(seed)
    means = v[rng.integers(0, v.size, size=(reps, v.size))].mean(axis=1)
    return float(v.mean()), float(np.quantile(means, 0.025)), float(np.quantile(means, 0.975))


def verdicts(runs: Sequence[dict[str, Any]], arm: str) -> dict[str, tuple[float, float, float,
                                                                          int]]:
    """measure → (mean delta, low, high, runs counted): each task's runs averaged first, so
    the interval is over tasks."""
    out = {}
    for m in BASELINE:
        by_task: dict[str, list[float]] = {}
        for r in runs:
            if r["arm"] == arm and (d := last_third_delta(r, m)) is not None:
                by_task.setdefault(r["task"], []).append(d)
        vals = [statistics.fmean(v) for v in by_task.values()]
        out[m] = (*bootstrap(vals), sum(len(v) for v in by_task.values()))
    by_task = {}
    for r in runs:
        if r["arm"] == arm and (q := seconds_ratio(r)) is not None:
            by_task.setdefault(r["task"], []).append(q)
    out["seconds_ratio"] = (*bootstrap([statistics.fmean(v) for v in by_task.values()]),
                            sum(len(v) for v in by_task.values()))
    from long_llm_speed import decompose, paused_windows, without_paused

    if any(paused_windows(r) for r in runs if r["arm"] == arm):
        by_task = {}
        for r in runs:
            if r["arm"] == arm and (q := seconds_ratio(without_paused(r))) is not None:
                by_task.setdefault(r["task"], []).append(q)
        out["seconds_ratio_unpaused"] = (
            *bootstrap([statistics.fmean(v) for v in by_task.values()]),
            sum(len(v) for v in by_task.values()))

    for part in ("work", "rate"):  # seconds ratio = work × rate (long_llm_speed.py)
        by_task = {}
        for r in runs:
            if r["arm"] == arm and seconds_ratio(r) is not None \
                    and (d := decompose(r)) is not None:
                by_task.setdefault(r["task"], []).append(d[part])
        out[f"{part}_ratio"] = (*bootstrap([statistics.fmean(v) for v in by_task.values()]),
                                sum(len(v) for v in by_task.values()))
    return out


# ------------------------------------------------------------------------------------ report


def _f(x: float, fmt: str = ".1f", pct: bool = False) -> str:
    if x is None or math.isnan(x):
        return "–"
    return format(100 * x, fmt) + "%" if pct else format(x, fmt)


def _options(run: dict[str, Any]) -> str:
    """The options the run resolved (`focused` gained document support while the matrix ran:
    a run recorded before options were recorded says so)."""
    opts = run.get("options")
    if opts is None:
        return "not recorded (focused then: memory, bm25, stale stop, length contract)" \
            if run["arm"] == "focused" else "not recorded (length contract)"
    return ", ".join(f"{k} {v}" for k, v in sorted(opts.items())) or "spec"


def _nan(x: float | None) -> float:
    return math.nan if x is None else float(x)


PCT = {"semrep", "semrep_cal", "semrep_excess", "lexrep", "cwr6", "grounding", "ground_rest",
       "sent_off_page", "ground_page", "invented_ungrounded", "on_topic", "fresh"}


# Panel titles where the report's label is too long for a panel.
PLOT_TITLES = {"invented_ungrounded": "invented names, grounded nowhere in the page",
               "semrep_cal": "semantic repetition (recalibrated)"}


def per_window(runs: Sequence[dict[str, Any]], arm: str, measure: str) -> list[tuple[int, float]]:
    """(window, mean over the runs that reached it) for one arm."""
    deepest = max((len(r["windows"]) for r in runs if r["arm"] == arm), default=0)
    out = []
    for i in range(deepest):
        ws = [r["windows"][i].get(measure) for r in runs
              if r["arm"] == arm and len(r["windows"]) > i]
        out.append((i + 1, _mean(ws)))
    return out


def plot(runs: Sequence[dict[str, Any]], path: Any = PLOT) -> bool:
    """One panel per measure against window number, both arms overlaid."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    ms = [m for m in MEASURES if m not in ("prompt_tps",)]
    ms[1:1] = ["semrep_cal"]
    ms[5:5] = ["ground_page", "invented_ungrounded"]
    fig, axes = plt.subplots(3, 4, figsize=(16, 10))
    for ax, m in zip(axes.flat, ms, strict=False):
        for arm, style in (("focused", "o-"), ("relevance", "s--")):
            pts = [(w, v) for w, v in per_window(runs, arm, m) if not math.isnan(v)]
            if pts:
                xs, ys = zip(*pts, strict=True)
                ys = [100 * y for y in ys] if m in PCT else ys
                ax.plot(xs, ys, style, label=arm, markersize=4)
        ax.set_title(PLOT_TITLES.get(m, LABELS[m]) + (" (%)" if m in PCT else ""))
        ax.set_xlabel("window")
        ax.grid(alpha=0.3)
    axes.flat[0].legend()
    for ax in list(axes.flat)[len(ms):]:
        ax.axis("off")
    fig.suptitle("Long documents, reference model: per window, means over runs")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return True


def render_superseded(groups: Sequence[tuple[str, str, str, list[dict[str, Any]]]]
                      ) -> list[str]:
    """Superseded runs (`SUPERSEDED`: heading, why, file, runs), words only: a reader
    comparing with an earlier report finds them here, labelled, and in no other table, mean or
    verdict."""
    lines: list[str] = []
    for heading, why, file, old in groups:
        if not old:
            continue
        lines += ["", f"### Superseded: {heading}", "",
                  f"{len(old)} {why}. Not runs of today's loop on today's data: listed for "
                  "comparison only, and counted in no per-window mean, verdict, speed figure "
                  f"or curve of this report (`bench/results/{file}`).", "",
                  "| corpus | task | arm | asked | delivered | ratio | length score | windows "
                  "| exit | commit |",
                  "|---|---|---|---:|---:|---:|---:|---:|---|---|"]
        for r in sorted(old, key=lambda r: (r["words"], r["corpus"], r["task"], r["arm"])):
            lines.append(
                f"| {r['corpus']} | {r['task']} | {r['arm']} | {r['words']:,} | "
                f"{r['delivered']:,} | {r['ratio']:.2f} | {r['length_score']:.1f} | "
                f"{len(r['windows'])} | {r['status']} | {r.get('commit', '?')} |")
    return lines


def render(runs: Sequence[dict[str, Any]], meta: dict[str, Any]) -> str:
    lines = [
        "# Long documents written by the reference model: the words asked, every window",
        "",
        f"Generated {meta['generated']} by `make bench-long ARGS=\"--writer local\"` "
        "(`python bench/long.py --writer local`) from the checkpoint "
        f"`bench/results/long-llm-runs.jsonl` (bench version {BENCH_VERSION}); runs made on "
        "library commits "
        f"{', '.join(sorted({r.get('commit', '?') for r in runs}))}.",
        "",
        "**Writer: the reference model** (Qwen2.5-Coder-1.5B-Instruct Q4_K_M on llama.cpp, "
        f"temperature 0), context {meta['context']:,} and {meta['generation']:,} generated "
        "tokens a window, at most 20 windows. Tasks and thresholds were fixed before the runs "
        "(bench/long_llm.py); nothing here was tuned on them.",
        "",
        f"- Tasks: {meta['tasks']}.",
        "- Arms: " + "; ".join(f"`{a.name}` = {a.label}" for a in ARMS) + ".",
        f"- Machine: 2 cores shared with other work; load average (1, 5, 15 min) when this "
        f"report was written: {meta['load']}. Seconds and tokens/s are under that load.",
        f"- Finished runs: {len(runs)} of the matrix's {meta['matrix']} "
        f"({meta['matrix_desc']}); the rest resume from the checkpoint.",
        "",
        "## Words delivered against words asked",
        "",
        "*Outside loops*: the words delivered less what the model's loops repeated (a window "
        "of 100+ words under 20% distinct, cut where its first 8 words recur; "
        "`long_llm_resume.outside_loop`), with the ratio and length score they give: the "
        "length contract counts a loop's words as written. *Loops stopped*: windows the "
        "writer stopped where the model began to repeat itself (`finish_reason` "
        "`repetition`, bench version 3 on), whose loop is neither kept nor counted.",
        "",
        "| corpus | task | arm | asked | delivered | ratio | length score | outside loops "
        "(ratio, score) | windows | loops stopped | exit | planned again W2+ | "
        "written twice W2+ | commit | options |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---|---|",
    ]
    from long_llm_resume import words_outside_loops

    for r in sorted(runs, key=lambda r: (r["words"], r["corpus"], r["task"], r["arm"])):
        kept = words_outside_loops(r)
        lines.append(
            f"| {r['corpus']} | {r['task']} | {r['arm']} | {r['words']:,} | {r['delivered']:,}"
            f" | {r['ratio']:.2f} | {r['length_score']:.1f} | {kept:,} ({kept / r['words']:.2f}, "
            f"{length_score(r['words'], kept):.1f}) | {len(r['windows'])} | "
            f"{sum(w.get('finish_reason') == REPETITION for w in r['windows'])} | "
            f"{r['status']} | {_f(_nan(r['replanned']), '.1f', True)} | "
            f"{_f(_nan(r['written_twice']), '.1f', True)} | {r.get('commit', '?')} | "
            f"{_options(r)} |")
    lines += render_superseded(meta.get("superseded") or [])
    lines += ["", "## Per window", "",
              "Means over the runs (all lengths) that reached the window (n). Semantic "
              "repetition, restating and CWR6 compare a window with the earlier windows of its "
              "run (0 at Window 1); grounding is the share of its sentences that reach a fact "
              "of its own envelope. Prompt tokens/s counts the tokens llama.cpp evaluated "
              "(the prompt less the prefix it kept from the previous window)."
              + (f" {meta['paused']} window(s) spanned a pause of their process (stopped for "
                 "another measurement's quiet timing): their seconds include it (\"Speed at "
                 "length\" gives the ratios without them)." if meta.get("paused") else ""),
              "",
              "| window | arm | n | words | seconds | prompt tok/s | gen tok/s | semrep | "
              "restating | CWR6 | grounding | on-topic | fresh |",
              "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for n, arm_name, count, m in window_means(runs, [a.name for a in ARMS]):
        lines.append(
            f"| {n} | {arm_name} | {count} | {_f(m('words'), '.0f')} | "
            f"{_f(m('seconds'), '.0f')} | {_f(m('prompt_tps'))} | {_f(m('gen_tps'))} | "
            f"{_f(m('semrep'), '.1f', True)} | {_f(m('lexrep'), '.1f', True)} | "
            f"{_f(m('cwr6'), '.1f', True)} | {_f(m('grounding'), '.1f', True)} | "
            f"{_f(m('on_topic'), '.1f', True)} | {_f(m('fresh'), '.1f', True)} |")
    lines += ["", "## Verdicts: last third of a run against its first windows", "",
              "Per run: mean of its last third of windows minus the mean of its baseline "
              "(Window 1; Windows 2–3 for repetition, restating and CWR6, which are 0 at "
              "Window 1); per task the runs' mean; the mean over tasks with a 95% percentile "
              "bootstrap interval over tasks (2,000 resamples). Runs under 3 windows (or whose "
              "last third falls inside the baseline) have no verdict. Seconds: last third / "
              "first third of the written windows, split into work × rate (per task the "
              "runs' mean of each; \"Speed at length\" below).", "",
              "| measure | arm | runs | change (mean) | 95% interval |",
              "|---|---|---:|---:|---:|"]
    for arm in ARMS:
        v = verdicts(runs, arm.name)
        for mname, (mean, lo, hi, n) in v.items():
            pct = mname in PCT
            label = RATIO_LABELS.get(mname) or LABELS[mname]
            fmt = ".2f" if mname in RATIO_LABELS else "+.1f"
            scale = 100 if pct else 1
            lines.append(f"| {label} | {arm.name} | {n} | "
                         f"{_f(mean * scale, fmt)}{' pts' if pct else '×' if fmt == '.2f' else ''}"
                         f" | {_f(lo * scale, fmt)} to {_f(hi * scale, fmt)} |")
    from long_llm_speed import render_speed

    lines += render_speed(runs, [a.name for a in ARMS])
    lines += ["", "## Words per completion token", "",
              "What the length contract plans a window's words with (`cdr.window.length`: "
              "0.577 for the reference model, measured on the quality benchmark's windows): "
              "words kept "
              "over tokens generated, per arm (a window cut at its limit drops its unfinished "
              "tail, so this is below the model's raw rate).", ""]
    for arm in ARMS:
        wpt, n = words_per_token(runs, arm.name)
        lines.append(f"- `{arm.name}`: {_f(wpt, '.3f')} over {n} windows.")
    floors = meta.get("floors") or {}
    if floors:
        lines += ["", "## The semantic-repetition floor of the task's own page", "",
                  "The same measure on text no model wrote: each task document's own facts in "
                  "document order, cut into as many windows as its longest run here, windows 2+ "
                  "against the earlier ones. The page repeats nothing on purpose; what it scores "
                  "is how alike one topic's sentences are at the 0.607 threshold.", "",
                  "| task | windows | floor, windows 2+ (mean) | floor, last third |",
                  "|---|---:|---:|---:|"]
        for name, reps in floors.items():
            k = max(1, len(reps) // 3)
            lines.append(f"| {name} | {len(reps)} | {_f(_mean(reps[1:]), '.1f', True)} | "
                         f"{_f(_mean(reps[-k:]), '.1f', True)} |")
    from long_llm_causes import render_continued, render_sections

    lines += render_sections(runs, [a.name for a in ARMS], meta.get("calibration"),
                             meta.get("floors2") or {})
    lines += render_continued(runs, [a.name for a in ARMS])
    from long_llm_resume import render_before_after

    lines += render_before_after(meta.get("prefill_base") or [],
                                 meta.get("prefill") or [],
                                 lambda rs: verdicts(rs, "focused"))
    if meta.get("plot"):
        lines += ["", "## Curves", "", "![per-window measures, both arms](long-windows.png)", ""]
    return "\n".join(lines) + "\n"


# -------------------------------------------------------------------------------------- main


def load_fixed_tasks() -> list[tuple[Any, set[int], Any]]:
    """(CKF, own rows, task) for `TASKS`, in order."""
    from cdr.retrieval.fact_recipe import DEFAULT_RECIPE
    from retrieval import man_corpus, own_rows, pydocs_corpus

    out = []
    for corpus, load in (("pydocs", pydocs_corpus), ("man", man_corpus)):
        data = load((DEFAULT_RECIPE,))
        ckf = data.ckfs[DEFAULT_RECIPE]
        owners = own_rows(ckf)
        tasks = {t.name: t for split in data.tasks.values() for t in split}
        out += [(ckf, owners.get(tasks[n].source, set()), tasks[n]) for c, n in TASKS
                if c == corpus]
    order = {n: i for i, (_, n) in enumerate(TASKS)}
    return sorted(out, key=lambda x: order[x[2].name])


def add_causes(kept: Sequence[dict[str, Any]], tasks: Sequence[tuple[Any, set[int], Any]],
               meta: dict[str, Any]) -> None:
    """The recalibrated repetition and grounding's cause (long_llm_causes.py), added to the
    runs' windows and `meta` for the report (the pages' floors computed on the first call
    and reused by later ones with the same `meta`)."""
    from long_llm_causes import Encoder, add_excess, enrich, page_floor_at
    from long_llm_semrep import load_calibration

    cal = load_calibration()
    meta["calibration"] = cal
    by_name = {t.name: (ckf, own) for ckf, own, t in tasks}
    if not tasks:
        return
    enc = Encoder(tasks[0][0].embedder.encode)  # one embedding model for both corpora
    for r in kept:
        ckf, own = by_name[r["task"]]
        enrich(r, ckf, own, enc, cal["threshold"] if cal else None)
    if cal and "floors2" not in meta:  # the pages' floors: once, whichever runs come next
        meta["floors2"] = {
            name: (meta["floors"][name],
                   page_floor_at(*by_name[name], len(meta["floors"][name]), enc,
                                 cal["threshold"])) for name in meta["floors"]}
    if cal:
        for r in kept:
            add_excess(r, meta["floors2"].get(r["task"], ([], []))[1])


def selected(task: Any, arm: LlmArm, only: Sequence[tuple[str, str]] | None) -> bool:
    """Whether `--only` lets (task, arm) run: its name (or the name's last path part) and arm
    are listed; no list lets every run."""
    return only is None or any(arm.name == a and t in (task.name, task.name.rsplit("/", 1)[-1])
                               for t, a in only)


def _whole_matrix(tasks: Sequence[tuple[Any, set[int], Any]], context: int, generation: int,
                  kept: list[dict[str, Any]], plan: list[Any]
                  ) -> tuple[list[dict[str, Any]], list[Any]]:
    """The finished runs and the plan of the whole matrix (`WORDS`), in matrix order."""
    from retrieval import load_runs

    done = load_runs(RUNS)
    done.update({r["key"]: r for r in kept if "key" in r})
    whole = [(ckf, own, t, a, w) for w in WORDS for ckf, own, t in tasks for a in ARMS]
    out = []
    for ckf, _own, t, a, w in whole:
        key = run_key(t, a, w, ckf.n_rows, context, generation)
        if key in done:
            out.append(done[key])
    return out, whole if len(whole) >= len(plan) else plan


def run_and_record(ckf: Any, own: set[int], task: Any, arm: LlmArm, words: int, key: str,
                   writer: Any, context: int, generation: int, runs: Any, partial_dir: Any,
                   stop_at: str | None, max_windows: int = MAX_WINDOWS) -> dict[str, Any] | None:
    """One run to its exit (resumed from its checkpoint in `partial_dir`), recorded in `runs`
    with its commit, options, seconds and load; None when `stop_at` stopped it first."""
    from retrieval import append_run, library_commit

    started = time.perf_counter()
    session, windows = run_windows(ckf, writer, task, arm, words, key, context, generation,
                                   partial_dir=partial_dir, stop_at=stop_at,
                                   max_windows=max_windows)
    if session.status == IN_PROGRESS:  # stopped at `stop_at`: the checkpoint resumes it
        print(f"stop-at {stop_at}: {task.name} {arm.name} {words} checkpointed after "
              f"{len(windows)} windows", flush=True)
        return None
    rec = finish_record(ckf, own, task, arm, words, session, windows)
    rec.update(key=key, commit=library_commit(), options=arm_options(arm),
               seconds=round(time.perf_counter() - started, 1),
               load=[round(x, 2) for x in os.getloadavg()])
    append_run(runs, rec)
    (partial_dir / f"{key}.json").unlink(missing_ok=True)
    return rec


def main(words: Sequence[int], max_runs: int | None, report_only: bool,
         context: int = CONTEXT_TOKENS, generation: int = GENERATION_TOKENS,
         only: Sequence[tuple[str, str]] | None = None, stop_at: str | None = None) -> int:
    from retrieval import load_runs

    done = load_runs(RUNS)
    tasks = load_fixed_tasks()
    plan = [(ckf, own, t, a, w) for w in words for ckf, own, t in tasks for a in ARMS]
    kept: list[dict[str, Any]] = []
    writer = None
    ran = 0
    for i, (ckf, own, task, arm, w) in enumerate(plan, 1):
        key = run_key(task, arm, w, ckf.n_rows, context, generation)
        if key in done:
            kept.append(done[key])
            continue
        if report_only or (max_runs is not None and ran >= max_runs) \
                or not selected(task, arm, only):
            continue
        if stop_at and time.strftime("%H:%M", time.gmtime()) >= stop_at:
            print(f"stop-at {stop_at}: {task.name} {arm.name} {w} not started", flush=True)
            continue
        if writer is None:
            from cdr.writers.local import LocalWriter

            # the model's tokenizer counts ~20–30% more than cl100k on this text
            writer = LocalWriter(n_ctx=max(4096, round(context * 1.3)))
        rec = run_and_record(ckf, own, task, arm, w, key, writer, context, generation, RUNS,
                             PARTIAL, stop_at)
        if rec is None:
            continue
        kept.append(rec)
        ran += 1
        print(f"[{i}/{len(plan)}] {task.corpus} {task.name} {arm.name} {w}: "
              f"{rec['delivered']}/{w} words ({rec['ratio']:.2f}), score "
              f"{rec['length_score']:.1f}, {len(rec['windows'])} windows, {rec['status']}, "
              f"{rec['seconds']:.0f} s", flush=True)
    # The report covers every finished run of the whole matrix, whatever `words` ran now.
    kept, plan = _whole_matrix(tasks, context, generation, kept, plan)
    if not kept:
        print("no finished runs to report")
        return 1
    from datetime import UTC, datetime

    meta = {"generated": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M+00:00"),
            "context": context, "generation": generation,
            "tasks": "; ".join(f"{t.corpus} `{t.name}`" for _, _, t in tasks),
            "load": ", ".join(f"{x:.1f}" for x in os.getloadavg()),
            "matrix": len(plan),
            "matrix_desc": f"{len(tasks)} tasks × {len(ARMS)} arms × "
                           f"{', '.join(f'{w:,}' for w in WORDS)} words",
            "superseded": [(heading, why, f.name, list(load_runs(f).values()))
                           for f, heading, why in SUPERSEDED]}
    from long_llm_speed import load_pauses, mark_paused

    meta["paused"] = mark_paused(kept, load_pauses(PAUSES))
    deepest: dict[str, int] = {}
    for r in kept:
        deepest[r["task"]] = max(deepest.get(r["task"], 0), len(r["windows"]))
    meta["floors"] = {t.name: page_floor(ckf, own, deepest[t.name]) for ckf, own, t in tasks
                      if deepest.get(t.name, 0) >= 2}
    add_causes(kept, tasks, meta)
    prefill = list(load_runs(RUNS_FOCUSED_PREFILL).values())
    if prefill:  # compared with focused runs of the same code (version 2), not today's
        base = [r for r in load_runs(RUNS_V2).values() if r["arm"] == "focused"]
        add_causes(prefill, tasks, dict(meta))
        add_causes(base, tasks, dict(meta))
        meta["prefill"], meta["prefill_base"] = prefill, base
    meta["plot"] = plot(kept)
    REPORT.write_text(render(kept, meta), encoding="utf-8")
    print(f"report: {REPORT.relative_to(ROOT)}")
    return 0
