"""The report of the LLM quality benchmark, computed from its checkpoints alone.

Reads every checkpointed (task, arm) run, embeds the sentences the model wrote with the CKF's
embedding model (all-MiniLM-L6-v2), calibrates the two cosine thresholds on pairs drawn from
those outputs (or, given fixed thresholds, shows that calibration as a check), scores each
window against its envelope's facts as the checkpoint holds them (texts, not CKF rows),
computes the per-window measures (quality_llm_metrics.py) and writes
`bench/results/quality-llm.md` plus `quality-llm-curves.png`. Headline figures compare arms on
the tasks every arm finished, so each arm is judged on the same pages.
"""

from __future__ import annotations

import functools
import json
import math
import platform
import random
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from cdr.ngrams import NGRAM_SIZE, tokenize
from cdr.report import quality
from quality import Corpus, task_labels
from quality_llm_metrics import (
    Calibration,
    calibrate,
    containment,
    content_words,
    grounding,
    jaccard,
    lexical_restating,
    mean_over,
    repetition_split,
    section_sentences,
    semantic_repetition,
    semantic_repetition_split,
    sentences,
    subtopic_coverage,
)
from quality_llm_runs import finished
from quality_tasks import Task

PARAPHRASE_JACCARD = 0.5  # cross-window sentence pairs at least this alike in content words…
DIFFERENT_JACCARD = 0.15  # …and same-task pairs at most this alike: the two calibration sets
DERIVED_CONTAINMENT = 0.6  # a sentence whose content words mostly come from one fact
TARGET_SEMREP_RATIO = 0.5
TARGET_CWR6 = 0.03
TARGET_CUMREP = 0.0208
TARGET_GROUNDING_GAP = 0.05
SERIES = ("semrep", "lexrep", "cwr6", "cumrep", "grounding", "coverage", "words", "dropped",
          "seconds")
SERIES_LABELS = {
    "semrep": "semantic repetition (share of sentences)",
    "lexrep": "lexical restating (share of sentences; no embedding model)",
    "dropped": "taken out by the repeat guard (share of the words the model wrote)",
    "cwr6": "CWR6",
    "cumrep": "cumulative 6-gram repetition",
    "grounding": "grounding (share of sentences)",
    "coverage": "sub-topic coverage of the text so far",
    "words": "words written",
    "seconds": "seconds per window",
}


class Embeddings:
    """Sentence vectors, each distinct sentence encoded once."""

    def __init__(self, encode: Any) -> None:
        self.encode = encode
        self.cache: dict[str, np.ndarray] = {}

    def add(self, texts: Sequence[str]) -> None:
        new = list(dict.fromkeys(t for t in texts if t not in self.cache))
        for i in range(0, len(new), 256):
            chunk = new[i:i + 256]
            for t, v in zip(chunk, np.asarray(self.encode(chunk)), strict=True):
                self.cache[t] = v.astype(np.float32)

    def of(self, texts: Sequence[str], dim: int) -> np.ndarray:
        if not texts:
            return np.zeros((0, dim), np.float32)
        return np.stack([self.cache[t] for t in texts])


def _cwr(texts: Sequence[str]) -> list[float]:
    return [c if len(tokenize(t)) >= NGRAM_SIZE else math.nan
            for c, t in zip(quality.cwr6(texts), texts, strict=True)]


MIN_PAIRS = 20  # fewer positive pairs than this at a bar: the bar is lowered one step


def _cos(emb: Embeddings, pairs: list[tuple[str, str]], dim: int) -> list[float]:
    if not pairs:
        return []
    a = emb.of([p[0] for p in pairs], dim)
    b = emb.of([p[1] for p in pairs], dim)
    return list(np.einsum("ij,ij->i", a, b) / (
        np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)))


def calibrations(runs: Sequence[dict[str, Any]], sents: dict[tuple[str, str], list[list[str]]],
                 emb: Embeddings, wvec: Any, dim: int,
                 other_pages: dict[str, list[np.ndarray]], seed: int = 0
                 ) -> tuple[Calibration, Calibration, float, float]:
    """(repetition, grounding) calibrations and the lexical bars their positives met.

    Repetition pairs: two sentences written for the same task (any arms and windows, never
    the same window of the same run), paraphrase if they share ≥ the bar of content words
    (verbatim copies left out), different if ≤ DIFFERENT_JACCARD. Grounding: a sentence most
    of whose content words come from one fact of its envelope (positive: its best cosine to
    that envelope), and the same sentence against as many facts drawn from another task's
    page (`other_pages[task]`: facts it cannot be grounded in)."""
    rng = random.Random(seed)
    by_task: dict[str, list[tuple[int, str, set[str]]]] = {}
    for k, run in enumerate(runs):
        for j, ss in enumerate(sents[(run["task"], run["arm"])]):
            for s in ss:
                by_task.setdefault(run["task"], []).append((k * 100 + j, s, content_words(s)))
    scored: list[tuple[float, tuple[str, str]]] = []
    neg: list[tuple[str, str]] = []
    for items in by_task.values():
        for a in range(len(items)):
            wa, sa, ca = items[a]
            for b in range(a + 1, len(items)):
                wb, sb, cb = items[b]
                if wa == wb or sa == sb:
                    continue
                jac = jaccard(ca, cb)
                if jac <= DIFFERENT_JACCARD:
                    neg.append((sa, sb))
                elif jac >= 0.3:
                    scored.append((jac, (sa, sb)))
    bar = PARAPHRASE_JACCARD
    while True:
        pos = [p for jac, p in scored if jac >= bar]
        if len(pos) >= MIN_PAIRS or bar <= 0.3:
            break
        bar = round(bar - 0.1, 2)
    neg = rng.sample(neg, min(len(neg), 4000))
    rep = calibrate(_cos(emb, pos, dim), _cos(emb, neg, dim))
    derived: list[tuple[float, float]] = []  # (containment, best cosine to the envelope)
    gneg: list[float] = []
    for run in runs:
        pool = other_pages.get(run["task"], [])
        for w, ss in zip(run["windows"], sents[(run["task"], run["arm"])], strict=True):
            if not ss or not w["fact_rows"]:
                continue
            words = [content_words(t) for t in w["fact_texts"]]
            sv = emb.of(ss, dim)
            best = (sv @ wvec(w).T).max(axis=1)
            for i, s in enumerate(ss):
                cw = content_words(s)
                derived.append((max(containment(cw, fw) for fw in words), float(best[i])))
            if pool:
                page = pool[rng.randrange(len(pool))]
                k = min(len(w["fact_rows"]), len(page))
                pick = page[rng.sample(range(len(page)), k)]
                gneg.extend(float(x) for x in (sv @ pick.T).max(axis=1))
    gbar = DERIVED_CONTAINMENT
    while True:
        gpos = [c for share, c in derived if share >= gbar]
        if len(gpos) >= MIN_PAIRS or gbar <= 0.3:
            break
        gbar = round(gbar - 0.1, 2)
    return rep, calibrate(gpos, gneg), bar, gbar


def envelope_vectors(window: Mapping[str, Any], *, emb: Embeddings, dim: int,
                     by_rows: Any) -> np.ndarray:
    """A window's envelope facts as vectors of their own text, embedded alone.

    From the texts the checkpoint holds, not from its row numbers: rows are positions in the
    CKF the run was made on, and a knowledge base built again (another fact recipe, or the
    same pages after an extraction change) numbers its facts differently — a report written
    against it would score runs against other facts. On a plain CKF a fact's stored vector
    is its text embedded alone, so old runs score as they did. `by_rows` serves checkpoints
    without texts."""
    texts = window.get("fact_texts")
    if not texts:
        return by_rows(window["fact_rows"]) if window["fact_rows"] else np.zeros((0, dim))
    emb.add(texts)
    return emb.of(texts, dim)


def run_series(run: dict[str, Any], ss: list[list[str]], emb: Embeddings, wvec: Any, dim: int,
               page: tuple[np.ndarray, list[str], int], rep_t: float, ground_t: float
               ) -> dict[str, list[float]]:
    """Per-window series of one run (`wvec`: a window's envelope as vectors,
    `envelope_vectors`)."""
    texts = [w["text"] for w in run["windows"]]
    vecs = [emb.of(s, dim) for s in ss]
    page_vecs, page_topics, n_topics = page
    cov = []
    for i in range(len(vecs)):
        so_far = np.concatenate(vecs[: i + 1]) if vecs else np.zeros((0, dim))
        cov.append(subtopic_coverage(so_far, page_vecs, page_topics, n_topics, ground_t))
    return {
        "semrep": semantic_repetition(vecs, rep_t),
        "lexrep": lexical_restating(ss, PARAPHRASE_JACCARD),
        "cwr6": _cwr(texts),
        "cumrep": quality.cumulative_repetition(texts),
        "grounding": [grounding(v, wvec(w) if w["fact_rows"] else
                                np.zeros((0, dim)), ground_t)
                      for v, w in zip(vecs, run["windows"], strict=True)],
        "coverage": cov,
        "words": [float(len(t.split())) for t in texts],
        "dropped": [_dropped_share(w) for w in run["windows"]],
        "seconds": [float(w["seconds"]) for w in run["windows"]],
    }


def _dropped_words(window: dict[str, Any]) -> int:
    """Words the repeat guard took out of a window (0 for an unguarded arm)."""
    return sum(len(u.split()) for u in window.get("dropped", []))


def _dropped_share(window: dict[str, Any]) -> float:
    """Share of the words the model wrote in a window that the repeat guard took out."""
    dropped = _dropped_words(window)
    total = dropped + len(window["text"].split())
    return dropped / total if total else math.nan


def _fmt(x: float, pct: bool = True, digits: int = 1) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    return f"{100 * x:.{digits}f}%" if pct else f"{x:.{digits}f}"


def _reuse(run: dict[str, Any]) -> float:
    """Share of the envelope facts of windows 2+ already in an earlier envelope."""
    seen: set[str] = set()
    shares = []
    for i, w in enumerate(run["windows"]):
        ids = w["fact_ids"]
        if i and ids:
            shares.append(sum(1 for f in ids if f in seen) / len(ids))
        seen.update(ids)
    return float(np.mean(shares)) if shares else math.nan


def _replanned(run: dict[str, Any]) -> float:
    """Share of the sections planned in windows 2+ that an earlier window planned too."""
    seen: set[str] = set()
    shares = []
    for i, w in enumerate(run["windows"]):
        titles = [p[0] for p in w["plan"]]
        if i and titles:
            shares.append(sum(1 for t in titles if t in seen) / len(titles))
        seen.update(titles)
    return float(np.mean(shares)) if shares else math.nan


def write_report(ckf: Any, corpus: Corpus, tasks: Sequence[Task], arms: Sequence[str],
                 settings: Any, key: str | Mapping[str, str], runs_dir: Path, out: Path,
                 seconds: float,
                 corpus_name: str = "pydocs",
                 thresholds: tuple[float, float] | None = None,
                 threshold_source: str = "the Python-docs outputs calibrated "
                                         "(`bench/results/quality-llm.md`), fixed before "
                                         "these runs and not tuned on them",
                 unrecorded_kb: str = "not recorded") -> None:
    """The report of the runs checkpointed in `runs_dir`. With `thresholds` (repetition,
    grounding) the measures use those, fixed before the runs (`threshold_source` says where
    they come from), and the calibration on these outputs is shown beside them as a check;
    without, the calibration on these outputs. Each arm's knowledge base is listed from its
    runs' `kb` record; `unrecorded_kb` describes runs made before it was recorded."""
    pairs = [(t.page, a) for t in tasks for a in arms]
    # Interrupted runs count with the windows they wrote (each window is whole): the
    # deadline cuts runs, and what they wrote is still measured; the report says which.
    # `key`: one settings key, or one per arm (an arm's loop version may differ:
    # quality_llm.arm_loop_version)
    keys = key if isinstance(key, Mapping) else dict.fromkeys(arms, key)
    runs = [r for t, a in pairs for r in finished(runs_dir, [(t, a)], keys[a],
                                                 complete_only=False) if r["windows"]]
    partial = [r for r in runs if not r.get("complete")]
    by_key = {(r["task"], r["arm"]): r for r in runs}
    # An arm with no run at all (not asked for this time) is left out of the comparison
    # rather than emptying it; the report lists it as not run.
    absent = [a for a in arms if not any((t.page, a) in by_key for t in tasks)]
    arms = [a for a in arms if a not in absent]
    common = [t for t in tasks if all((t.page, a) in by_key for a in arms)]
    dim = int(ckf.dim)
    out.parent.mkdir(parents=True, exist_ok=True)

    emb = Embeddings(ckf.embedder.encode)
    # A CKF built with a context recipe stores each fact's vector of "title — section: fact":
    # grounding asks whether a sentence says what a fact says, so it compares with the fact's
    # own text, embedded alone (what the stored vector is on a plain CKF).
    plain = getattr(ckf, "recipe", "plain") == "plain"

    def fvec(rows: Sequence[int]) -> np.ndarray:
        if plain:
            return np.asarray(ckf.vectors(np.asarray(rows, dtype=np.int64)), dtype=np.float32)
        texts = [f.content for f in ckf.facts(np.asarray(rows, dtype=np.int64))]
        emb.add(texts)
        return emb.of(texts, dim)

    wvec = functools.partial(envelope_vectors, emb=emb, dim=dim, by_rows=fvec)

    sents = {(r["task"], r["arm"]): [sentences(w["text"]) for w in r["windows"]] for r in runs}
    emb.add([s for ws in sents.values() for w in ws for s in w])
    lines: list[str] = []
    if not runs:
        out.write_text("# Quality on generated text\n\nNo run has finished yet.\n", "utf-8")
        return
    id_row = {fid: i for i, fid in enumerate(corpus.ids) if fid}
    page_cache: dict[str, tuple[np.ndarray, list[str], int]] = {}
    for t in tasks:
        labels = task_labels(corpus, t)
        fids = list(labels)
        page_cache[t.page] = (fvec([id_row[f] for f in fids]) if fids else
                              np.zeros((0, dim), np.float32), [labels[f] for f in fids],
                              len(t.keys))
    other_pages = {t.page: [page_cache[u.page][0] for u in tasks
                            if u.page != t.page and len(page_cache[u.page][0])] for t in tasks}
    rep_cal, ground_cal, rep_bar, ground_bar = calibrations(runs, sents, emb, wvec, dim,
                                                            other_pages)
    rep_t, ground_t = thresholds or (rep_cal.threshold, ground_cal.threshold)
    series = {(r["task"], r["arm"]): run_series(
        r, sents[(r["task"], r["arm"])], emb, wvec, dim, page_cache[r["task"]],
        rep_t, ground_t) for r in runs}
    own_cal = None
    if thresholds:  # the same runs at the thresholds these outputs calibrate, as a check
        own_cal = {(r["task"], r["arm"]): run_series(
            r, sents[(r["task"], r["arm"])], emb, wvec, dim, page_cache[r["task"]],
            rep_cal.threshold, ground_cal.threshold) for r in runs}
    n_win = settings.windows

    def per_window(arm: str, name: str) -> list[float]:
        vals = []
        for w in range(n_win):
            xs = [series[(t.page, arm)][name][w] for t in common
                  if w < len(series[(t.page, arm)][name])]
            xs = [x for x in xs if not math.isnan(x)]
            vals.append(float(np.mean(xs)) if xs else math.nan)
        return vals

    def at_end(arm: str, name: str) -> float:
        xs = [series[(t.page, arm)][name][-1] for t in common if series[(t.page, arm)][name]]
        return float(np.mean(xs)) if xs else math.nan

    def w25(arm: str, name: str) -> float:
        xs = [mean_over(series[(t.page, arm)][name], 1) for t in common]
        xs = [x for x in xs if not math.isnan(x)]
        return float(np.mean(xs)) if xs else math.nan

    n_facts = int(np.count_nonzero(ckf.active))
    kb_note = kb_by_arm(runs, arms, unrecorded_kb)
    total_windows = sum(len(r["windows"]) for r in runs)
    cli_args = " --corpus man" if corpus_name == "man" else ""
    n_ctx_note = ("1.6× that: man-page text counts ~1.5× more model tokens than cl100k, "
                  "`N_CTX_RATIO` in bench/quality_llm.py" if corpus_name == "man"
                  else "1.3× that")
    make_args = ' ARGS="--corpus man"' if corpus_name == "man" else ""
    win_seconds = [w["seconds"] for r in runs for w in r["windows"]]
    lines += [
        "# Quality on generated text: what the reference model writes, per arm",
        "",
        f"Generated {datetime.now(UTC).isoformat(timespec='minutes')} by `make bench-llm"
        f"{make_args}` (`python bench/quality_llm.py --resume{cli_args}`), from the "
        "checkpoints in "
        f"`{_shown_path(runs_dir)}` on {platform.machine()} ({_cpus()}).",
        "",
        "## What ran",
        "",
        (f"- Model: `{settings.model}` (Qwen2.5-Coder-1.5B-Instruct Q4_K_M, llama.cpp "
         f"in-process via `--writer local`), temperature {settings.temperature}, seed "
         f"{settings.seed}, 1 thread (`CDR_LOCAL_THREADS=1`: faster than 2 on this loaded "
         "2-core machine)." if settings.writer == "local" else
         "- Writer: **extractive** (a smoke run of the pipeline, not the benchmark)."),
        f"- Context {settings.context_tokens} tokens (the model's n_ctx is {n_ctx_note}), "
        f"generation ≤ {settings.generation_tokens} tokens per window, document planned for "
        f"{settings.words} words, at most {n_win} windows; every window goes through "
        "`Generator.step` — the envelopes, prompts, Stage 8 and exit rules of `cdr generate`. "
        "A run ends where its own exit rule ends it.",
        (f"- CKF: `{ckf.path}` — {n_facts:,} facts of the task pages and their "
         "neighbours in the Python 3.11 docs (the distractors a real knowledge base holds), "
         f"fact recipe `{getattr(ckf, 'recipe', '?')}`. The knowledge base each arm's runs "
         f"were made on: {kb_note}."
         if corpus_name == "pydocs" else
         f"- CKF: `{ckf.path}` — {ckf.n_rows:,} facts of 60 system-call man pages (Debian "
         "manpages-dev, the retrieval benchmark's corpus, default fact recipe "
         f"`{getattr(ckf, 'recipe', '?')}`): every other page is a distractor of the same "
         "kind. A task is a page's NAME line, its outline the page's sections."),
        f"- Tasks planned: {len(tasks)} ({', '.join(t.page for t in tasks)}); arms: "
        f"{', '.join(arms)}.",
        f"- Ran: {len(runs) - len(partial)} of {len(pairs)} runs to their end, "
        f"{len(partial)} interrupted; {total_windows} windows, "
        f"{sum(win_seconds) / 60:.0f} min of window time ({np.median(win_seconds):.0f} s median "
        f"per window). Tasks every arm ran on (the headline's): "
        f"{', '.join(t.page for t in common) or 'none'}.",
    ]
    if corpus_name == "man":
        from quality_llm_man import WHY_TASKS

        lines.append(f"- Why these tasks: {WHY_TASKS}.")
    lines.append(f"- Window prompt version {settings.prompt} (`bench/quality_llm.py` "
                 "PROMPT_VERSION: 1 told a continued section only \"add new material\"; 2 "
                 "quotes where its text stopped and asks for code only where a fact shows "
                 "code); loop version " + str(getattr(settings, "loop", 1)) + " (1: a window cut "
                 "by the token limit dropped its last block whole; 2: a cut list keeps its "
                 "finished items; 3: the length contract asks a model writer for no more than "
                 "its envelope grounds, 0.4 words per word of its facts, and does not write a "
                 "window too thin for a 40-word section — only the arms with the contract, "
                 "`focused`, run at 3, the others' windows are the same at 2; 4: the "
                 "envelope's budget counts the whole prompt and a model writer's prompt lists "
                 "every packed fact, every arm; 5: a window plans only sections owning at least "
                 "4 of its packed facts, `plan: packed` — only `focused` runs at 5, the others' "
                 "windows are the same at 4).")
    if any(a.endswith("-guard") for a in arms):
        lines.append("- `*-guard` arms: the same ranking with the opt-in repeat guard "
                     "(`--repeats drop`, `cdr.window.repeat_guard`), which takes out of each "
                     "window the sentences, list items and code an earlier window wrote (half "
                     "their 6-grams, or cosine ≥ 0.70 with all-MiniLM-L6-v2 — the model the "
                     "semantic measure uses, so for these arms that measure is not independent "
                     "of the guard: the lexical restating column and the 6-gram measures are the"
                     " check). Their text is what the window kept; what the guard took out is in"
                     " the checkpoints (`dropped`) and in the \"guard took out\" column.")
    if "cdr-fresh" in arms and settings.prompt == 1:
        lines.append("- `cdr-fresh` is the opt-in `--profile fresh` (fact memory, envelope fit, "
                     "expanded sub-queries with widened facts weighted by (relevance / gate)²); "
                     "its runs were made after that weighting landed, the other arms' before "
                     "it (their code paths did not change).")
    if absent:
        lines.append(f"- Arms with no run in `{_shown_path(runs_dir)}` (left out): "
                     f"{', '.join(absent)}.")
    missing = [f"{t} × {a}" for t, a in pairs if (t, a) not in by_key and a not in absent]
    if missing:
        lines.append(f"- Not run (time ran out; the benchmark resumes with `--resume`): "
                     f"{', '.join(missing)}.")
    if partial:
        lines.append("- **Interrupted at the deadline** (counted with the windows they wrote; "
                     "their \"end\" values are at their last window, not W5): " + ", ".join(
                         f"{r['task']} × {r['arm']} ({len(r['windows'])} of {n_win} windows)"
                         for r in partial) + ".")
    lines += [f"- This report: {seconds / 60:.1f} min in this invocation (embedding and "
              "scoring take seconds; the rest is writing).", ""]

    if thresholds:
        lines += ["## Thresholds: fixed", "",
                  f"The measures below use the thresholds {threshold_source}: "
                  f"semantic repetition {thresholds[0]:.3f}, "
                  f"grounding {thresholds[1]:.3f}. The same calibration on these runs' own "
                  "outputs, as a check:", ""]
    else:
        lines += ["## Thresholds, calibrated on the outputs", ""]
    lines += _cal_lines(rep_cal, ground_cal, rep_bar, ground_bar)

    if common:
        lines += ["", "## Headline: targets for CDR, and every arm on the same tasks", "",
                  f"Means over the {len(common)} task(s) every arm ran on; W2–5 is the mean of "
                  "a run's windows 2–5 (those it wrote), then over tasks; \"end\" is a run's "
                  "last window (W5 unless it was interrupted or exited earlier).", ""]
        taken = {a: _dropped_grounding(a, common, by_key, emb, wvec, dim,
                                       ground_t) for a in arms}
        lines += _headline(arms, w25, at_end, per_window, series, common, by_key, taken)
        if own_cal is not None:
            lines += ["", "At the thresholds calibrated on these outputs "
                      f"({rep_cal.threshold:.3f}, {ground_cal.threshold:.3f}) instead, the check:",
                      "", "| arm | semantic rep. W2–5 | grounding (all windows) |",
                      "|---|---:|---:|"]
            for a in arms:
                sr = [mean_over(own_cal[(t.page, a)]["semrep"], 1) for t in common]
                gr = [mean_over(own_cal[(t.page, a)]["grounding"], 0) for t in common]
                lines.append(f"| {a} | {_fmt(float(np.nanmean(sr)))} | "
                             f"{_fmt(float(np.nanmean(gr)))} |")
        lines += _restating(arms, common, by_key, emb, dim, rep_t, corpus, n_win)
        lines += ["", "## Per window (mean over the same tasks)", ""]
        for name in SERIES:
            lines += [f"**{SERIES_LABELS[name]}**", "",
                      "| arm | " + " | ".join(f"W{i + 1}" for i in range(n_win)) + " |",
                      "|---|" + "---:|" * n_win]
            pct = name not in ("words", "seconds")
            for a in arms:
                lines.append(f"| {a} | " + " | ".join(
                    _fmt(x, pct, 1 if pct else 0) for x in per_window(a, name)) + " |")
            lines.append("")
        png = out.with_name(f"{out.stem}-curves.png")
        _plot(arms, per_window, n_win, png)
        lines += [f"![per-window curves per arm]({png.name})", ""]
    lines += ["## Every run", "",
              "| task | arm | windows | exit | words | semrep W2–5 | CWR6 W2–5 | cum. rep. end "
              "| grounding | coverage end | s/window |",
              "|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in runs:
        s = series[(r["task"], r["arm"])]
        lines.append(
            f"| {r['task']} | {r['arm']} | {len(r['windows'])} | "
            f"{r.get('exit_reason', 'interrupted') if r.get('complete') else 'interrupted'} | "
            f"{sum(s['words']):.0f} | {_fmt(mean_over(s['semrep'], 1))} | "
            f"{_fmt(mean_over(s['cwr6'], 1))} | {_fmt(s['cumrep'][-1], digits=2)} | "
            f"{_fmt(mean_over(s['grounding'], 0))} | {_fmt(s['coverage'][-1])} | "
            f"{np.mean(s['seconds']):.0f} |")
    lines += ["", "## How each measure is taken", "", *_method_lines(), ""]
    out.write_text("\n".join(lines) + "\n", "utf-8")
    print(f"wrote {out}")


def kb_by_arm(runs: Sequence[Mapping[str, Any]], arms: Sequence[str], unrecorded: str) -> str:
    """Which knowledge base each arm's runs were made on, from their `kb` records (path,
    recipe, facts): arms compared in one report may have met different builds of the same
    pages, and the reader must see it. Runs without the record are `unrecorded`."""
    seen: dict[str, list[str]] = {}
    for a in arms:
        kbs = {json.dumps(r.get("kb"), sort_keys=True) for r in runs if r["arm"] == a}
        for k in sorted(kbs):
            kb = json.loads(k)
            label = (unrecorded if kb is None else
                     f"`{kb['path']}`, recipe `{kb['recipe']}`, {kb['facts']:,} facts")
            seen.setdefault(label, []).append(a)
    return "; ".join(f"{', '.join(f'`{a}`' for a in arms_)}: {label}"
                     for label, arms_ in seen.items())


def _shown_path(path: Path) -> str:
    root = Path(__file__).resolve().parent.parent
    return str(path.resolve().relative_to(root)) if path.resolve().is_relative_to(root) else str(
        path)


def _cpus() -> str:
    import os

    return f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.0f} at report time"


def _cal_lines(rep: Calibration, gr: Calibration, rep_bar: float, ground_bar: float
               ) -> list[str]:
    def row(name: str, c: Calibration) -> str:
        return (f"| {name} | {c.threshold:.3f} | {c.positives} | {c.negatives} | "
                f"{c.positive_median:.3f} | {c.negative_median:.3f} | {c.negative_p99:.3f} | "
                f"{100 * c.true_positive_rate:.0f}% | {100 * c.false_positive_rate:.1f}% |")

    return [
        "Each threshold is the cosine (all-MiniLM-L6-v2) with the best Youden's J (TPR − FPR) "
        "between two sets of pairs drawn from the benchmark's own outputs:",
        "",
        f"- **Semantic repetition.** Paraphrase pairs: two sentences written for the same "
        f"task (any arms and windows, never the same window of one run) sharing ≥ "
        f"{rep_bar:.0%} of their content words (Jaccard; verbatim copies left out). "
        f"Non-paraphrase pairs: the same, sharing ≤ {DIFFERENT_JACCARD:.0%} — same task, same "
        "topic, different statements (hard negatives; a sample of 4,000). Paraphrases are "
        "found lexically, so the threshold is tuned to restatements that keep some wording; "
        "a fully reworded restatement below it is missed (the measure is a lower bound).",
        f"- **Grounding.** Grounded: a sentence at least {ground_bar:.0%} of whose content "
        "words come from one fact of its window's envelope, scored by its best cosine to that "
        "envelope. Ungrounded: the same sentences' best cosine to as many facts drawn from "
        "*another task's page* (they cannot be grounded there). Sub-topic coverage uses the "
        "same threshold against the page's labelled facts.",
        f"- A bar is lowered by 0.1 (down to 0.3) while fewer than {MIN_PAIRS} positive pairs "
        "meet it; the bars used are the ones shown above.",
        "",
        "| measure | threshold | positive pairs | negative pairs | positive median | "
        "negative median | negative p99 | TPR | FPR |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        row("semantic repetition", rep),
        row("grounding", gr),
    ]


# The arms whose targets are judged against relevance-only: CDR as the spec defines it, and
# CDR with the opt-in repeat guard where that arm ran.
TARGET_ARMS = ("cdr", "cdr-guard", "focused")


def _dropped_grounding(arm: str, common: Sequence[Task], by_key: dict[Any, Any],
                       emb: Embeddings, wvec: Any, dim: int, threshold: float
                       ) -> tuple[float, int]:
    """Of the prose the repeat guard took out of `arm`'s windows (units of ≥ 4 words, code
    left out), the share grounded in that window's envelope, and how many units there were:
    what the kept text's grounding lost with them."""
    hits = n = 0
    for t in common:
        for w in by_key[(t.page, arm)]["windows"]:
            units = [u for u in w.get("dropped", []) if len(u.split()) >= 4
                     and not u.lstrip().startswith(("```", "~~~"))]
            if not units or not w["fact_rows"]:
                continue
            emb.add(units)
            hits += round(grounding(emb.of(units, dim), wvec(w), threshold)
                          * len(units))
            n += len(units)
    return (hits / n if n else math.nan), n


def _headline(arms: Sequence[str], w25: Any, at_end: Any, per_window: Any,
              series: dict[Any, Any], common: Sequence[Task], by_key: dict[Any, Any],
              taken: dict[str, tuple[float, int]]) -> list[str]:
    lines = ["| arm | semantic rep. W2–5 | lexical restating W2–5 | CWR6 W2–5 | cum. 6-gram "
             "rep. at end | grounding (all windows) | coverage at end | words/run | "
             "guard took out | s/window | envelope reuse W2+ | re-planned sections W2+ |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]

    def grounding_all(a: str) -> float:
        xs = [mean_over(series[(t.page, a)]["grounding"], 0) for t in common]
        return float(np.nanmean(xs)) if xs else math.nan

    def dropped_all(a: str) -> float:
        d = sum(_dropped_words(w) for t in common for w in by_key[(t.page, a)]["windows"])
        k = sum(sum(series[(t.page, a)]["words"]) for t in common)
        return d / (d + k) if d + k else math.nan

    for a in arms:
        words = np.mean([sum(series[(t.page, a)]["words"]) for t in common])
        secs = np.mean([x for t in common for x in series[(t.page, a)]["seconds"]])
        reuse = np.nanmean([_reuse(by_key[(t.page, a)]) for t in common])
        replan = np.nanmean([_replanned(by_key[(t.page, a)]) for t in common])
        lines.append(
            f"| {a} | {_fmt(w25(a, 'semrep'))} | {_fmt(w25(a, 'lexrep'))} | "
            f"{_fmt(w25(a, 'cwr6'), digits=2)} | "
            f"{_fmt(at_end(a, 'cumrep'), digits=2)} | {_fmt(grounding_all(a))} | "
            f"{_fmt(at_end(a, 'coverage'))} | {words:.0f} | {_fmt(dropped_all(a))} | "
            f"{secs:.0f} | {_fmt(reuse)} | {_fmt(replan)} |")
    if "relevance" not in arms:
        return lines
    for c in [a for a in TARGET_ARMS if a in arms]:
        lines += _targets(c, arms, w25, at_end, per_window, series, common, by_key,
                          grounding_all, taken)
    return lines


def _targets(c: str, arms: Sequence[str], w25: Any, at_end: Any, per_window: Any,
             series: dict[Any, Any], common: Sequence[Task], by_key: dict[Any, Any],
             grounding_all: Any, taken: dict[str, tuple[float, int]]) -> list[str]:
    """The four targets for CDR arm `c` against relevance-only, why any is missed, and `c`
    against every other arm."""
    sr_c, sr_r = w25(c, "semrep"), w25("relevance", "semrep")
    cw = w25(c, "cwr6")
    cr = at_end(c, "cumrep")
    g_c, g_r = grounding_all(c), grounding_all("relevance")

    def verdict(ok: bool) -> str:
        return "**met**" if ok else "**missed**"

    lines = ["", f"| target (`{c}` vs relevance-only) | {c} | relevance | target | verdict |",
             "|---|---:|---:|---:|---|",
             f"| semantic repetition W2–5 ≤ ½ relevance-only's | {_fmt(sr_c)} | {_fmt(sr_r)} "
             f"| ≤ {_fmt(TARGET_SEMREP_RATIO * sr_r)} | "
             f"{verdict(sr_c <= TARGET_SEMREP_RATIO * sr_r)} |",
             f"| CWR6 W2–5 ≤ 3% | {_fmt(cw, digits=2)} | "
             f"{_fmt(w25('relevance', 'cwr6'), digits=2)} | ≤ 3.00% | "
             f"{verdict(cw <= TARGET_CWR6)} |",
             f"| cumulative 6-gram repetition at W5 (end) ≤ 2.08% | {_fmt(cr, digits=2)} | "
             f"{_fmt(at_end('relevance', 'cumrep'), digits=2)} | ≤ 2.08% | "
             f"{verdict(cr <= TARGET_CUMREP)} |",
             f"| grounding ≥ relevance-only's − 5 points | {_fmt(g_c)} | {_fmt(g_r)} | "
             f"≥ {_fmt(g_r - TARGET_GROUNDING_GAP)} | "
             f"{verdict(g_c >= g_r - TARGET_GROUNDING_GAP)} |"]
    lines += ["", *_why(c, arms, w25, at_end, per_window, series, common, by_key, taken,
                        grounding_all,
                        {"semrep": sr_c > TARGET_SEMREP_RATIO * sr_r, "cwr6": cw > TARGET_CWR6,
                         "cumrep": cr > TARGET_CUMREP,
                         "grounding": g_c < g_r - TARGET_GROUNDING_GAP})]
    lines += ["", f"`{c}` against every arm (its value / the arm's; < 1 means it repeats less "
              "or grounds less):", "",
              "| arm | semantic rep. ratio | lexical restating ratio | CWR6 ratio | "
              "cum. rep. ratio | grounding Δ (points) |", "|---|---:|---:|---:|---:|---:|"]

    def ratio(x: float, y: float) -> str:
        return "–" if not y or math.isnan(y) or math.isnan(x) else f"{x / y:.2f}"

    for a in [a for a in arms if a != c]:
        lines.append(f"| {a} | {ratio(sr_c, w25(a, 'semrep'))} | "
                     f"{ratio(w25(c, 'lexrep'), w25(a, 'lexrep'))} | "
                     f"{ratio(cw, w25(a, 'cwr6'))} | {ratio(cr, at_end(a, 'cumrep'))} | "
                     f"{100 * (g_c - grounding_all(a)):+.1f} |")
    return lines


def _why(c: str, arms: Sequence[str], w25: Any, at_end: Any, per_window: Any,
         series: dict[Any, Any], common: Sequence[Task], by_key: dict[Any, Any],
         taken: dict[str, tuple[float, int]], grounding_all: Any, missed: dict[str, bool]
         ) -> list[str]:
    """Measured reasons for each target arm `c` misses (numbers only; the reading is in the
    README)."""
    if not any(missed.values()):
        return [f"Every target is met by `{c}` on these tasks."]
    out = [f"**Why `{c}` misses, measured** (the numbers that locate the cause):", ""]

    def mean_run(a: str, f: Any) -> float:
        xs = [f(by_key[(t.page, a)]) for t in common]
        return float(np.nanmean(xs)) if xs else math.nan

    if missed["cumrep"]:
        parts = {a: np.mean([repetition_split([w["text"] for w in by_key[(t.page, a)]
                                               ["windows"]]) for t in common], axis=0)
                 for a in arms}
        out.append(
            "- Cumulative 6-gram repetition counts repeats *inside* a window as well as across "
            "windows. Split at the end (within one window + across windows = the total): " +
            "; ".join(f"{a} {_fmt(p[0], digits=2)} + {_fmt(p[1], digits=2)}"
                      for a, p in parts.items()) + f". Window 1 of `{c}` alone scores "
            f"{_fmt(per_window(c, 'cumrep')[0], digits=2)}. Repetition within a window is the "
            "writer's own phrasing, which no ranking of facts controls; the across part is "
            "what CDR is for.")
    if missed["semrep"] or missed["cwr6"]:
        out.append(
            "- What each arm was asked to write again — share of windows 2+'s planned sections "
            "already planned earlier, and of their envelope facts already sent: " + "; ".join(
                f"{a} {_fmt(mean_run(a, _replanned))} / {_fmt(mean_run(a, _reuse))}"
                for a in arms) + ". A section that is re-planned is written again under the "
            "same heading, and its sentences restate the earlier pass.")
    if missed["grounding"]:
        out.append(
            f"- Grounding per window (`{c}` / relevance-only): " + ", ".join(
                f"W{i + 1} {_fmt(x)} / {_fmt(r)}" for i, (x, r) in enumerate(
                    zip(per_window(c, "grounding"), per_window("relevance", "grounding"),
                        strict=True))) + ".")
        share, n = taken.get(c, (math.nan, 0))
        if n:
            out.append(
                f"- What the repeat guard took out was mostly grounded: {_fmt(share)} of the "
                f"{n} prose units it removed from `{c}`'s windows reach a fact of their "
                f"window's envelope at the grounding threshold (the kept sentences: "
                f"{_fmt(grounding_all(c))}). Restating a re-sent fact is grounded text; "
                "taking it out leaves the window's less grounded sentences a larger share.")
    return out


def human_floor(corpus: Corpus, tasks: Sequence[Task], emb: Embeddings, dim: int,
                threshold: float, n_windows: int, per_window: int) -> float:
    """Semantic repetition of text no model wrote: each task page's own first `n_windows`
    outline sections, `per_window` sentences each, as windows 1..n. The documentation repeats
    no section on purpose, so what it scores is the measure's floor on these topics (sentences
    of one topic resemble each other at this threshold)."""
    values = []
    for t in tasks:
        labels = task_labels(corpus, t)
        wins = []
        for key in t.keys[:n_windows]:
            text = "\n\n".join(corpus.contents[i] for i, fid in enumerate(corpus.ids)
                                if labels.get(fid) == key)
            wins.append(sentences(text)[:per_window])
        emb.add([x for w in wins for x in w])
        reps = semantic_repetition([emb.of(w, dim) for w in wins], threshold)
        values.append(mean_over(reps, 1))
    values = [v for v in values if not math.isnan(v)]
    return float(np.mean(values)) if values else math.nan


def _restating(arms: Sequence[str], common: Sequence[Task], by_key: dict[Any, Any],
               emb: Embeddings, dim: int, threshold: float, corpus: Corpus, n_win: int
               ) -> list[str]:
    """Where later windows' restating sentences come from, per arm, and the measure's floor on
    human-written text of the same topics."""
    rows = []
    counts = []
    for a in arms:
        wins = []
        for t in common:
            run = [section_sentences(w["text"]) for w in by_key[(t.page, a)]["windows"]]
            emb.add([s for w in run for _, s in w])
            wins.append([[(h, emb.of([s], dim)[0]) for h, s in w] for w in run])
            counts += [len(w) for w in run[1:]]
        parts = [semantic_repetition_split(w, threshold) for w in wins]
        n = sum(p[2] for p in parts)
        same = sum(p[0] * p[2] for p in parts if p[2]) / n if n else math.nan
        cross = sum(p[1] * p[2] for p in parts if p[2]) / n if n else math.nan
        rows.append(f"| {a} | {_fmt(same + cross)} | {_fmt(same)} | {_fmt(cross)} | {n} |")
    per = int(np.median(counts)) if counts else 9
    floor = human_floor(corpus, common, emb, dim, threshold, n_win, per)
    return [
        "", "## Where the restating comes from", "",
        "Windows 2+'s sentences pooled over the tasks: those whose closest earlier sentence "
        f"(cosine ≥ {threshold:.3f}) was written under the **same** `## ` section — a section "
        "written again — and under **another** section.", "",
        "| arm | restating (pooled) | same section | another section | sentences W2+ |",
        "|---|---:|---:|---:|---:|", *rows, "",
        f"**The measure's floor on these topics**: the task pages' own text, their first {n_win} "
        f"outline sections as windows 1–{n_win} ({per} sentences each, the median of the runs' "
        f"windows 2+), scores **{_fmt(floor)}** semantic repetition over windows 2–{n_win} at "
        "the same threshold — sentences about one module resemble each other at this cosine "
        "without restating anything. Above it is what a run adds.",
    ]


def _method_lines() -> list[str]:
    return [
        "- Sentences: the prose of each window's Markdown (headings and code blocks left out, "
        "list items split), split at sentence ends, fragments under 4 words dropped.",
        "- CWR6: share of a window's distinct 6-grams seen in earlier windows (docs/design.md §6; "
        "NaN for a window with no 6-gram). Cumulative 6-gram repetition: Σ(count − 1) / "
        "#6-grams over the document so far (seed §1.1); the W5 target is read at the run's "
        "last window.",
        "- Semantic repetition: share of a window's sentences whose cosine to some sentence of "
        "an earlier window of the same run reaches the calibrated threshold (0 for W1).",
        "- Grounding: share of a window's sentences whose best cosine to a fact of that "
        "window's envelope reaches the calibrated threshold.",
        "- Sub-topic coverage: share of the task page's sections (the outline) with at least "
        "one labelled fact that some sentence written so far reaches at the grounding "
        "threshold.",
        "- Envelope reuse: share of a window's envelope facts already in an earlier envelope "
        "(what the writer was shown again). Re-planned sections: share of a window's planned "
        "sections an earlier window planned too (what it was asked to write again).",
    ]


def _plot(arms: Sequence[str], per_window: Any, n_win: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = ("semrep", "cwr6", "cumrep", "grounding", "coverage", "words")
    fig, axes = plt.subplots(2, 3, figsize=(13, 7))
    xs = list(range(1, n_win + 1))
    for ax, name in zip(axes.flat, names, strict=True):
        for a in arms:
            ys = per_window(a, name)
            scale = 1 if name == "words" else 100
            ax.plot(xs, [y * scale for y in ys], marker="o", label=a)
        ax.set_title(SERIES_LABELS[name] + ("" if name == "words" else " (%)"), fontsize=9)
        ax.set_xlabel("window")
        ax.set_xticks(xs)
        ax.grid(alpha=0.3)
    axes.flat[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
