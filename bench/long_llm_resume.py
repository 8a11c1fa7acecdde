"""`focused` with and without resuming begun sections (`resume: "prefill"`, chosen on the
tuning tasks: bench/results/long-tune.md), on the long benchmark's report tasks.

*Without* are bench version 2's focused runs (library 2ac4f04, `resume: prompt`, before the
writers stopped a model's loop: `long-llm-runs-v2.jsonl`); *with* are the
same tasks, lengths and budget run with the profile plus `resume: prefill`
(`long-llm-runs-v2-focused-prefill.jsonl`, library c441b4e). Both sets are scored by the same
code at report time (`long_llm_causes.enrich` for the recalibrated repetition), so a
difference is the change's and the model's, not the measure's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from long_llm_causes import continued_split
from window_rows import nan_mean as _mean

MEASURES = (("lexrep", "restating"), ("cwr6", "CWR6"),
            ("semrep_cal", "semantic repetition (recalibrated)"),
            ("semrep_excess", "… above the page's floor"),
            ("grounding", "grounding (envelope)"), ("ground_page", "grounding in the page"))


# A window whose words are under this share distinct is the model looping (one sentence or
# list item repeated to the token limit): prose of 100+ words has over half its words distinct.
LOOP_DISTINCT = 0.2


def looping(text: str) -> bool:
    """Whether a window's text is a loop: 100+ words, under `LOOP_DISTINCT` of them distinct."""
    words = text.split()
    return len(words) >= 100 and len(set(words)) < LOOP_DISTINCT * len(words)


# Words a loop is recognised by: the first 8 words that already came earlier in the window.
LOOP_NGRAM = 8


def outside_loop(text: str) -> int:
    """The words of a window before its loop began: all of them for a window that does not
    loop (`looping`), else those before the first `LOOP_NGRAM` words that repeat earlier ones
    of the window (one copy of the looped sentence stays)."""
    words = text.split()
    if not looping(text):
        return len(words)
    seen: set[tuple[str, ...]] = set()
    for i in range(len(words) - LOOP_NGRAM + 1):
        gram = tuple(words[i:i + LOOP_NGRAM])
        if gram in seen:
            return i
        seen.add(gram)
    return len(words)


def words_outside_loops(run: dict[str, Any]) -> int:
    """A run's delivered words less what its windows' loops repeated (`outside_loop`)."""
    return sum(outside_loop(w.get("text", "")) for w in run["windows"])


def _pct(x: float) -> str:
    return "–" if x != x else f"{100 * x:.1f}%"


def _windows(runs: Sequence[dict[str, Any]], pick: Callable[[dict[str, Any]], list[Any]]
             ) -> list[dict[str, Any]]:
    return [w for r in runs for w in pick(r) if w.get("words")]


def render_before_after(without: Sequence[dict[str, Any]], with_: Sequence[dict[str, Any]],
                        verdicts: Callable[[Sequence[dict[str, Any]]],
                                           dict[str, tuple[float, float, float, int]]]
                        ) -> list[str]:
    """The section: window means (2+, and continuing windows) and the last-third verdicts
    (`verdicts(runs)` → measure → (mean, low, high, runs)) of the two sets."""
    if not without or not with_:
        return []
    lines = ["", "## `focused` with and without resuming begun sections", "",
             "The same report tasks, lengths and budget; *without*: bench version 2's focused runs "
             f"(library {', '.join(sorted({r.get('commit', '?') for r in without}))}, "
             "`resume: prompt`: the prompt quotes where a begun section stopped); *with*: the "
             "profile plus `resume: prefill` (the model's answer starts with the section's "
             "heading and last words; library "
             f"{', '.join(sorted({r.get('commit', '?') for r in with_}))}). Chosen on the "
             "tuning tasks before these runs (bench/results/long-tune.md); not confirmed here, "
             "so not in the profile.", "",
             "| set | runs | windows | " + " | ".join(label for _, label in MEASURES)
             + " | looping |",
             "|---|---:|---|" + "---:|" * (len(MEASURES) + 1)]
    for name, runs in (("without", without), ("with", with_)):
        for label, pick in (("2+", lambda r: r["windows"][1:]),
                            ("continuing", lambda r: [w for c, w in continued_split(r) if c])):
            ws = _windows(runs, pick)
            loops = sum(looping(w.get("text", "")) for w in ws)
            lines.append(f"| {name} | {len(runs)} | {label} ({len(ws)}) | " + " | ".join(
                _pct(_mean([w.get(k) for w in ws])) for k, _ in MEASURES) + f" | {loops} |")
    lines += ["", "*Looping*: windows whose text is the model repeating itself (100+ words, "
              f"under {LOOP_DISTINCT:.0%} of them distinct: one sentence or list item to the "
              "token limit). The loop is the model's; a window cut inside one keeps little.",
              "", "Last third minus baseline (the report's verdict, interval over tasks):", "",
              "| measure | without | with |", "|---|---:|---:|"]
    of = [verdicts(without), verdicts(with_)]  # every measure's, once per set
    for key, label in MEASURES:
        cells = []
        for v in of:
            mean, lo, hi, n = v[key]
            cells.append("–" if mean != mean else
                         f"{100 * mean:+.1f} pts ({100 * lo:+.1f} to {100 * hi:+.1f}; {n} runs)")
        lines.append(f"| {label} | {cells[0]} | {cells[1]} |")
    return lines
