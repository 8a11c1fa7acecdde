"""The quality benchmark's arms for the opt-in options beyond the spec (issue 13), and the part
of the report that judges them.

Each arm is spec-default CDR with `GenerationConfig` options turned on — the same fields a
user sets (`profile`, `memory`, `envelope`, `queries`) — so the benchmark measures exactly
what `cdr generate --profile fresh` runs. The sweep varies the rules' tunables (the memory
weights, the fit ratio, the expansion size) to defend the defaults with numbers.

The report part works on plain per-arm summaries (`Summary`) that `quality.py` computes, so
this module needs nothing from it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cdr.fact_memory import MemoryRule
from cdr.retrieval.expansion import EXPANSION_WIDENED_POWER
from cdr.window.fit import FIT_FACTS_PER_WORD, FIT_MARGIN, WORDS_PER_TOKEN, WORDS_PER_WRITTEN_FACT
from quality_lexical import Bm25Fused

PRESET = "cdr fresh"

# (name, label, GenerationConfig overrides)
OPTION_SPECS: tuple[tuple[str, str, dict[str, Any]], ...] = (
    ("cdr+memory", "CDR + fact memory (memory=facts)", {"memory": "facts"}),
    ("cdr+fit", "CDR + envelope sized to the window (envelope=fit)", {"envelope": "fit"}),
    ("cdr+expanded", "CDR + expanded sub-queries (queries=expanded)", {"queries": "expanded"}),
    (PRESET, "CDR, --profile fresh (memory=facts, envelope=fit, queries=expanded)",
     {"profile": "fresh"}),
)


def option_sweep_specs() -> list[tuple[str, str, dict[str, Any]]]:
    """Variants of the rules' tunables, each on top of the preset unless said."""
    r = MemoryRule()
    p = EXPANSION_WIDENED_POWER
    specs: list[tuple[str, str, dict[str, Any]]] = [
        ("fresh mem shown=written", "preset, written facts weighted as shown ones (0.2)",
         {"profile": "fresh", "memory_rule": MemoryRule(written=r.shown)}),
        ("fresh mem shown 0.5", "preset, shown-unwritten facts weighted 0.5",
         {"profile": "fresh", "memory_rule": MemoryRule(shown=0.5)}),
        ("fresh mem recovery 0.5", "preset, shown-unwritten weight recovers ×0.5 per window",
         {"profile": "fresh", "memory_rule": MemoryRule(recovery=0.5)}),
        ("fresh fit ×0.67", "preset, fit ratio × 2/3",
         {"profile": "fresh", "fit_facts_per_word": FIT_FACTS_PER_WORD * 2 / 3}),
        ("fresh fit ×2", "preset, fit ratio × 2",
         {"profile": "fresh", "fit_facts_per_word": FIT_FACTS_PER_WORD * 2}),
        # Widening: how many facts each expansion adds, and how widened-in facts are weighted
        # (× (relevance / gate)^power; the preset: 10 facts, power 2).
        ("fresh no widening", "preset, expansions do not widen Phase 1",
         {"profile": "fresh", "expansion_widens": False}),
        ("fresh widen 10 unweighted", "preset, widened-in facts not weighted (power 0)",
         {"profile": "fresh", "expansion_widened_power": 0.0}),
        ("fresh widen 10 × rel", "preset, widened-in facts × (relevance / gate)¹",
         {"profile": "fresh", "expansion_widened_power": 1.0}),
        ("fresh widen 7 unweighted", "preset, widen 7, widened-in facts not weighted",
         {"profile": "fresh", "expansion_widen_limit": 7, "expansion_widened_power": 0.0}),
        ("fresh widen 5 × rel²", f"preset, widen 5 (power {p:g})",
         {"profile": "fresh", "expansion_widen_limit": 5}),
        ("fresh widen 20 × rel²", f"preset, widen 20 (power {p:g})",
         {"profile": "fresh", "expansion_widen_limit": 20}),
        ("fresh top-up 10", "preset, each expansion only tops its section up to 10 facts",
         {"profile": "fresh", "expansion_top_up": True}),
        ("fresh bm25", "preset, expansions' nearest facts by cosine fused with BM25 (bm25s, RRF)",
         {"profile": "fresh", "expansion_scorer": Bm25Fused()}),
        ("fresh -expanded", "preset without expanded sub-queries",
         {"profile": "fresh", "queries": "titles"}),
        ("fresh -fit", "preset without fitted envelopes", {"profile": "fresh",
                                                           "envelope": "budget"}),
    ]
    return specs


@dataclass
class Summary:
    """One arm's numbers at the fixed window count (means over tasks)."""

    name: str
    cwr6: float
    reuse: float
    recall: float
    text_recall: float
    relevance: float
    completeness: float
    envelope_facts: float
    written_facts: float
    prompt_tokens: float  # per document, the fixed windows
    prompt_tokens_to_exit: float  # per document, until the run's own exit
    words_per_token: float  # written words / completion tokens
    words_per_written_fact: float
    plan_far: float
    pull_wins: float
    exit_window: float


def _p(v: float) -> str:
    return "–" if not math.isfinite(v) else f"{100 * v:.1f}%"


def _verdict(ok: bool) -> str:
    return "**met**" if ok else "**missed**"


def preset_targets(s: Mapping[str, Summary], windows: int, name: str = PRESET) -> list[str]:
    """The issue's targets for the preset against the same run's baselines."""
    if name not in s or "cdr" not in s or "relevance" not in s:
        return []
    f, c, rel = s[name], s["cdr"], s["relevance"]
    bases = [s[b] for b in ("relevance", "mmr-0.5", "mmr-0.3", "ssd", "xquad") if b in s]
    xq = s.get("xquad")
    out = [f"- fact reuse at W{windows} ≤ 10%: {_p(f.reuse)} (spec CDR {_p(c.reuse)}) — "
           f"{_verdict(f.reuse <= 0.10)}"]
    if xq is not None:
        out.append(f"- envelope sub-topic recall after {windows} windows ≥ xQuAD's + 3 points: "
                   f"{_p(f.recall)} vs xQuAD {_p(xq.recall)} (needs ≥ {_p(xq.recall + 0.03)}; "
                   f"spec CDR {_p(c.recall)}) — {_verdict(f.recall >= xq.recall + 0.03)}")
    best = max(bases, key=lambda b: b.text_recall)
    out.append(f"- text sub-topic recall ≥ every baseline's: {_p(f.text_recall)} vs best "
               f"baseline {best.name} {_p(best.text_recall)} (spec CDR {_p(c.text_recall)}) — "
               f"{_verdict(all(f.text_recall >= b.text_recall for b in bases))}")
    ratio = f.relevance / rel.relevance if rel.relevance else math.nan
    out.append(f"- mean envelope relevance ≥ 85% of relevance-only's: {f.relevance:.3f} vs "
               f"{rel.relevance:.3f} ({_p(ratio)}; spec CDR {_p(c.relevance / rel.relevance)})"
               f" — {_verdict(ratio >= 0.85)}")
    out.append(f"- CWR6 at W{windows} ≤ 1%: {_p(f.cwr6)} (spec CDR {_p(c.cwr6)}) — "
               f"{_verdict(f.cwr6 <= 0.01)}")
    tok = f.prompt_tokens / c.prompt_tokens if c.prompt_tokens else math.nan
    out.append(f"- prompt tokens per document ≤ 50% of spec CDR's: {f.prompt_tokens:,.0f} vs "
               f"{c.prompt_tokens:,.0f} ({_p(tok)}; until each run's own exit: "
               f"{f.prompt_tokens_to_exit:,.0f} vs {c.prompt_tokens_to_exit:,.0f}) — "
               f"{_verdict(tok <= 0.50)}")
    return out


def options_table(s: Mapping[str, Summary], names: Sequence[str], windows: int) -> list[str]:
    rel = s["relevance"].relevance
    lines = [f"| arm | CWR6 W{windows} | fact reuse W{windows} | sub-topic recall W{windows} "
             f"(envelopes / text) | relevance (vs relevance only) | completeness W{windows} | "
             "envelope facts | facts written | prompt tokens / document (to own exit) | "
             "plan facts below threshold | pull beats relevance |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for n in names:
        if n not in s:
            continue
        x = s[n]
        lines.append(
            f"| {'**' + n + '**' if n == PRESET else n} | {_p(x.cwr6)} | {_p(x.reuse)} | "
            f"{_p(x.recall)} / {_p(x.text_recall)} | {x.relevance:.3f} "
            f"({100 * (x.relevance / rel - 1):+.1f}%) | {_p(x.completeness)} | "
            f"{x.envelope_facts:.1f} | {x.written_facts:.1f} | {x.prompt_tokens:,.0f} "
            f"({x.prompt_tokens_to_exit:,.0f}) | {_p(x.plan_far)} | {_p(x.pull_wins)} |")
    return lines


def option_analysis(s: Mapping[str, Summary], sweep_names: Sequence[str], windows: int,
                    label: Callable[[str], str]) -> list[str]:
    """The report section on the options: the table, the targets, the calibration."""
    if "cdr" not in s or "relevance" not in s:
        return []
    c = s["cdr"]
    main = ["cdr", *[n for n, _, _ in OPTION_SPECS]]
    L = ["## Beyond the spec: opt-in options (issue 13)", "",
         "Spec-default CDR with one option on, and the `fresh` preset (all three); the rows "
         "below the preset vary one tunable of the preset's rules. Same 16 tasks, same loop, "
         "same extractive writer; prompt tokens are what the writer was sent (system + user "
         f"message, cl100k) over the {windows} fixed windows, and in brackets until the run's "
         "own exit rule.", "",
         *options_table(s, [*main, *sweep_names], windows), "",
         "Arms: " + "; ".join(f"`{n}` — {label(n)}" for n in [*main[1:], *sweep_names]) + ".",
         "", "### The preset against the targets of issue 13", "",
         *preset_targets(s, windows), ""]
    # Calibration of the fit ratio, from what the writer used under the spec's envelopes.
    wpf, wpt = c.words_per_written_fact, c.words_per_token
    L += ["### Envelopes sized to the window: the calibration", "",
          f"Under the spec's envelopes CDR sends {c.envelope_facts:.1f} facts per window and the "
          f"writer uses {c.written_facts:.1f}; the text runs {wpt:.2f} words per completion "
          f"token and each written fact carries {wpf:.0f} words. So a window of G tokens can "
          f"use about {wpt:.2f}·G / {wpf:.0f} facts. `cdr.window.fit` packs "
          f"`ceil(ratio × min(planned words, {WORDS_PER_TOKEN:.2f}·G))` facts with ratio = "
          f"{FIT_FACTS_PER_WORD * 1000:.1f} facts per 1,000 words ({FIT_MARGIN} × "
          f"1/{WORDS_PER_WRITTEN_FACT}, the constants in `cdr.window.fit`, from this measurement "
          "on a previous run; the margin covers facts the plan puts under a section the window "
          "does not reach); the rows "
          "`fresh fit ×0.67` and `fresh fit ×2` show what a tighter or looser ratio costs.", ""]
    return L
