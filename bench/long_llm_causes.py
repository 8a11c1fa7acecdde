"""The two measures the long benchmark's first report misread, per window (issue 22 §3):
semantic repetition at a threshold calibrated for the long-document measure
(`long_llm_semrep.py`), and grounding with its cause shown — the identifiers a window names
that its envelope, or the task's own page, does not hold (`long_llm_identifiers.py`).

Computed at report time from the texts in the run records: nothing here changes a run or its
stored figures (`semrep`, `grounding` stay as measured, at 0.607 and 0.508), so the old
figure stays beside the new one. The envelope of a window is known for runs recorded with
their windows' rows (`rows`); runs recorded before that are checked against the page alone.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from cdr.report import quality
from long_llm_identifiers import window_identifiers, words_of
from long_llm_semrep import leading_windows, repetition
from window_rows import nan_mean as _mean
from window_rows import window_means

GROUND_THRESHOLD = 0.508  # long_llm's, the quality benchmark's calibrated grounding


class Encoder:
    """Sentence vectors, each distinct text encoded once (unit rows)."""

    def __init__(self, encode: Any) -> None:
        self.encode = encode
        self.cache: dict[str, np.ndarray] = {}

    def __call__(self, texts: Sequence[str]) -> np.ndarray:
        new = list(dict.fromkeys(t for t in texts if t not in self.cache))
        for i in range(0, len(new), 256):
            chunk = new[i:i + 256]
            for t, v in zip(chunk, np.asarray(self.encode(chunk), dtype=np.float64),
                            strict=True):
                n = float(np.linalg.norm(v))
                self.cache[t] = v / n if n else v
        if not texts:
            return np.zeros((0, 0))
        return np.stack([self.cache[t] for t in texts])


def enrich(run: dict[str, Any], ckf: Any, own: set[int], enc: Encoder,
           threshold: float | None) -> None:
    """Add to each window of `run` (in memory, for the report): `semrep_cal` (semantic
    repetition at the calibrated `threshold`), the identifier counts (`ids_named`,
    `ids_off_page`, `ids_off_env` where the envelope is recorded), `sent_off_page` (share of
    its sentences naming an identifier the page does not hold), `ground_page` (grounding in the
    task's whole page instead of the window's envelope), `invented_ungrounded` (share of its
    sentences grounded nowhere in the page that name a name the page does not hold) and, where
    the envelope is recorded, the grounding of the sentences that name an identifier the
    envelope does not hold (`ground_flagged`) and of the rest (`ground_rest`)."""
    page_facts = ckf.facts(np.asarray(sorted(own), dtype=np.int64)) if own else []
    page_words = words_of(f.content for f in page_facts)
    page_vecs = enc([f.content for f in page_facts]) if page_facts else None
    sents = [quality.sentences(w["text"]) for w in run["windows"]]
    if threshold is not None:
        for w, v in zip(run["windows"], repetition(sents, enc, threshold), strict=True):
            w["semrep_cal"] = None if math.isnan(v) else v
    for w, ss in zip(run["windows"], sents, strict=True):
        rows = w.get("rows")
        facts = ckf.facts(np.asarray(rows, dtype=np.int64)) if rows else []
        env_words = words_of(f.content for f in facts) if rows is not None else None
        ids = window_identifiers(ss, page_words, env_words)
        w.update(ids_named=ids.named, ids_off_page=ids.not_on_page,
                 ids_off_env=ids.not_in_envelope, ids_examples=list(ids.examples),
                 sent_off_page=ids.sentences_not_on_page / len(ss) if ss else None,
                 ground_flagged=None, ground_rest=None, ground_page=None,
                 invented_ungrounded=None)
        if ss and page_vecs is not None:
            # grounded anywhere in the page (the envelope is a part of it), and the sentences
            # grounded nowhere in it that name a name the page does not hold: invention
            on_page = (enc(ss) @ page_vecs.T).max(axis=1) >= GROUND_THRESHOLD
            off = np.asarray([bool(i) for i in ids.off_page_flags])
            w["ground_page"] = float(on_page.mean())
            w["invented_ungrounded"] = float((~on_page & off).mean())
        if not ss or rows is None or not facts:
            continue
        best = (enc(ss) @ enc([f.content for f in facts]).T).max(axis=1) >= GROUND_THRESHOLD
        flagged = np.asarray(ids.flags)
        if flagged.any():
            w["ground_flagged"] = float(best[flagged].mean())
        if (~flagged).any():
            w["ground_rest"] = float(best[~flagged].mean())


def page_floor_at(ckf: Any, own: set[int], n_windows: int, enc: Encoder, threshold: float
                  ) -> list[float]:
    """The measure's floor per window at `threshold`: the task page's own text read in windows
    of `WINDOW_WORDS` words (the runs' window size, as the calibration cut the tuning pages),
    its first `n_windows`, each scored against the earlier ones. Window k of the page has as
    much text before it as a run's Window k, so run minus floor is the restating a run adds at
    that window (a short page gives fewer windows)."""
    if n_windows < 2 or not own:
        return []
    facts = ckf.facts(np.asarray(sorted(own), dtype=np.int64))
    return repetition(leading_windows(" ".join(f.content for f in facts), n_windows), enc,
                      threshold)


def add_excess(run: dict[str, Any], floor: Sequence[float]) -> None:
    """`semrep_excess` per window: the recalibrated repetition minus the page's floor at the
    same window (None where either is missing)."""
    for i, w in enumerate(run["windows"]):
        v = w.get("semrep_cal")
        f = floor[i] if i < len(floor) else math.nan
        w["semrep_excess"] = None if v is None or math.isnan(f) else v - f


def _pct(x: float) -> str:
    return "–" if math.isnan(x) else f"{100 * x:.1f}%"


def _num(x: float) -> str:
    return "–" if math.isnan(x) else f"{x:.1f}"


def render_sections(runs: Sequence[dict[str, Any]], arms: Sequence[str],
                    calibration: dict[str, Any] | None,
                    floors: dict[str, tuple[list[float], list[float]]]) -> list[str]:
    """The report's sections on the recalibrated repetition and on grounding's cause."""
    lines: list[str] = []
    deepest = max((len(r["windows"]) for r in runs), default=0)
    if calibration:
        t = calibration["threshold"]
        lines += [
            "", "## Semantic repetition, recalibrated for the long-document measure", "",
            "**The measure changed.** At 0.607 — a threshold calibrated on *pairs* of "
            "sentences by the quality benchmark — the task pages' own text scored 58–79% "
            "(the floor above): the long measure takes each sentence's *best* cosine over "
            "every earlier window's sentences, and with a hundred of them a 4% false-positive "
            "rate per pair is crossed by chance. The threshold is now chosen where the measure "
            "decides, on TUNING tasks only (`bench/long_llm_semrep.py`, "
            "`bench/results/long-semrep-calibration.json`): restating = pairs the reference "
            "model wrote for a tuning page sharing ≥ 50% of their content words "
            f"({calibration['positives']} pairs); not restating = each sentence of the tuning "
            "pages' own text (both corpora), cut into windows of "
            f"{calibration['window_words']} words, against all the earlier windows "
            f"({calibration['negatives']} sentences). Best Youden's J: **{t:.3f}** (TPR "
            f"{_pct(calibration['tpr'])}, FPR {_pct(calibration['fpr'])}; at 0.607: TPR "
            f"{_pct(calibration['tpr_at_old'])}, FPR {_pct(calibration['fpr_at_old'])}). "
            "Applied unchanged to the report tasks below; the 0.607 figure (`semrep`) stays "
            "beside it.", "",
            "| window | arm | n | semrep at 0.607 (old) | semrep at " f"{t:.3f} | "
            f"page floor at {t:.3f} (same window) | run minus floor |",
            "|---:|---|---:|---:|---:|---:|---:|"]
        for i in range(deepest):
            for arm in arms:
                ws = [r for r in runs if r["arm"] == arm and len(r["windows"]) > i]
                if not ws:
                    continue
                floor = _mean([floors[r["task"]][1][i] for r in ws
                               if len(floors.get(r["task"], ([], []))[1]) > i])
                lines.append(
                    f"| {i + 1} | {arm} | {len(ws)} | "
                    f"{_pct(_mean([r['windows'][i].get('semrep') for r in ws]))} | "
                    f"{_pct(_mean([r['windows'][i].get('semrep_cal') for r in ws]))} | "
                    f"{_pct(floor)} | "
                    f"{_pct(_mean([r['windows'][i].get('semrep_excess') for r in ws]))} |")
        lines += ["", "The page floor per task at both thresholds (the page's own text cut "
                  "into as many windows as the task's longest run, windows 2+; at 0.607 "
                  "cut into that many equal parts, as before; at the new threshold read in "
                  f"windows of {calibration['window_words']} words, as the runs write):", "",
                  "| task | windows | floor at 0.607 | floor at " f"{t:.3f} |",
                  "|---|---:|---:|---:|"]
        for name, (old, new) in floors.items():
            lines.append(f"| {name} | {len(new)} | {_pct(_mean(old[1:]))} | "
                         f"{_pct(_mean(new[1:]))} |")
    lines += [
        "", "## Grounding per window, and what the ungrounded sentences name", "",
        "Identifiers (`bench/long_llm_identifiers.py`): the names a window's sentences give as "
        "code — inline code spans, calls, constants, errno names, snake_case names. *Not on "
        "the page*: the task's own document does not hold the name at all (invented, or from "
        "the model's memory). *Grounding in the page*: the same grounding measure against "
        "every fact of the task's page instead of the window's envelope (the envelope is a "
        "part of it): a sentence grounded in the page but not in its envelope says something "
        "true of the page that the window was not given. *Invented, ungrounded*: sentences "
        "grounded nowhere in the page that name a name the page does not hold. *Not in the "
        "envelope* and *grounding, the rest* (the sentences naming no name outside the "
        "envelope) need the windows' rows, recorded from the 5,000-word runs on.", "",
        "| window | arm | n | grounding (envelope) | grounding in the page | sentences naming "
        "a name not on the page | invented, ungrounded | names not on the page (mean) | names "
        "not in the envelope (mean) | grounding, the rest |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for n, arm, count, m in window_means(runs, arms, written_only=True):
        lines.append(
            f"| {n} | {arm} | {count} | {_pct(m('grounding'))} | "
            f"{_pct(m('ground_page'))} | {_pct(m('sent_off_page'))} | "
            f"{_pct(m('invented_ungrounded'))} | {_num(m('ids_off_page'))} | "
            f"{_num(m('ids_off_env'))} | {_pct(m('ground_rest'))} |")
    examples = sorted({(r["task"], e) for r in runs for w in r["windows"][:1]
                       for e in w.get("ids_examples", [])})
    if examples:
        lines += ["", "Names Window 1 gave that its page does not hold, per task: " + "; ".join(
            f"{task}: " + ", ".join(f"`{e}`" for t2, e in examples if t2 == task)
            for task in sorted({t for t, _ in examples})) + "."]
    return lines


def continued_split(run: dict[str, Any]) -> list[tuple[bool, dict[str, Any]]]:
    """Windows 2+ that wrote words, each marked whether its plan names a section an earlier
    window of the run had planned (a continuation) or only sections new to the run."""
    seen: set[str] = set()
    out = []
    for i, w in enumerate(run["windows"]):
        titles = [p[0] for p in w.get("plan") or []]
        if i and w.get("words") and titles:
            out.append((any(t in seen for t in titles), w))
        seen.update(titles)
    return out


def render_continued(runs: Sequence[dict[str, Any]], arms: Sequence[str]) -> list[str]:
    """Where the repetition at length comes from: windows that continue a begun section
    against windows that open new ones, per arm (means over windows, all runs)."""
    lines = ["", "## Windows continuing a begun section against windows opening new ones", "",
             "Windows 2+ that wrote words, split by their plan: *continues* = it names a "
             "section an earlier window of the run had planned (cut there, or continued with "
             "fresh facts of it); *new* = only sections no earlier window planned. Means over "
             "the windows of every run of the arm. The envelope is as fresh either way; what "
             "differs is what the model writes under a heading it has written before.", "",
             "| arm | windows | n | words | restating | CWR6 | semantic repetition "
             "(recalibrated) | grounding (envelope) | grounding in the page |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for arm in arms:
        split = [x for r in runs if r["arm"] == arm for x in continued_split(r)]
        for label, flag in (("continues", True), ("new", False)):
            ws = [w for c, w in split if c is flag]
            if not ws:
                continue

            def m(key: str, ws: list[dict[str, Any]] = ws) -> float:
                return _mean([w.get(key) for w in ws])

            lines.append(f"| {arm} | {label} | {len(ws)} | {m('words'):.0f} | "
                         f"{_pct(m('lexrep'))} | {_pct(m('cwr6'))} | {_pct(m('semrep_cal'))} "
                         f"| {_pct(m('grounding'))} | {_pct(m('ground_page'))} |")
    return lines
