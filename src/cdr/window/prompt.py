"""The window prompt: task, Residual Task Anchor, a section plan and numbered facts.

One format serves every writer. An LLM reads the plan as guidance (which facts suit which
remaining section, and about how many words each needs); the extractive writer parses it back
(`cdr.text.prompt_format.parse_prompt`) and writes from it, so both see the same envelope.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

import numpy as np

from cdr.text.prompt_format import (
    CITE_LINE,
    FACTS_HEADER,
    PLAN_HEADER,
    WRITE_HEADER,
    PlanSection,
)
from cdr.text.tokens import count_tokens, count_tokens_batch
from cdr.window.fit import MIN_SECTION_WORDS

TRIM_SLACK_WORDS = MIN_SECTION_WORDS  # the loop's smallest section target
# Facts are numbered F1, F2… in layout order, known only once the envelope is packed; a fact's
# cost is counted with its ref at this width (cl100k reads up to 3 digits as one token).
WIDEST_FACT_REF = "F999"


def fit_plan(plan: Sequence[PlanSection], word_budget: int) -> list[PlanSection]:
    """The leading sections a window of `word_budget` words can write in depth.

    A small model asked for six sections in 700 words touches all six thinly and the next
    window writes them again; asked for two, it writes two. Sections are kept in order while
    their targets fit (the first always, trimmed to the budget); a section that would get less
    than half its target is left for the next window.
    """
    kept: list[PlanSection] = []
    left = max(int(word_budget), 1)
    for section in plan:
        if kept and (left <= 0 or left < section.target_words // 2):
            break
        words = min(section.target_words, left)
        # Trimmed by less than a minimal section's words is still the whole section.
        whole = section.whole and words >= section.target_words - TRIM_SLACK_WORDS
        kept.append(PlanSection(section.title, max(words, 1), section.fact_refs, whole))
        left -= words
    return kept


def fact_label(fact: Any) -> str:
    """What the prompt labels a fact (a CKF fact or `FactRef`) with: its section path, else
    its source."""
    return str(fact.section or fact.source)


def fact_lines(ref: str, label: str, content: str) -> list[str]:
    """A fact as the prompt lists it: its ref and label (section, else source) on one line,
    its text, a blank line."""
    return [f"[{ref}] ({label})", content.strip(), ""]


@lru_cache(maxsize=1)
def _plan_ref_tokens() -> int:
    return count_tokens(f", {WIDEST_FACT_REF}")


def fact_prompt_tokens(facts: Sequence[tuple[str, str]]) -> np.ndarray:
    """What each fact, given as (label, content), costs in a window prompt: its lines as
    `build_user_prompt` writes them (label and text, with the ref at its widest, and the
    line breaks that join them to the next fact) plus its ref in the plan's line. A 300-
    character document title or a deep section path is paid for here, not left to the
    context's slack (docs/design.md §3.16, "The budget counts the whole prompt")."""
    if not facts:
        return np.zeros(0, dtype=np.int64)
    blocks = ["\n".join(fact_lines(WIDEST_FACT_REF, label, content)) + "\n"
              for label, content in facts]
    return count_tokens_batch(blocks).astype(np.int64) + _plan_ref_tokens()


def build_user_prompt(
    task: str,
    anchor: str,
    plan: Sequence[PlanSection],
    facts: Sequence[tuple[str, str, str]],
    backward_summary: str = "",
    *,
    continued: Mapping[str, str] | Sequence[str] = (),
    first_window: bool = True,
    instructions: bool = True,
    cite: bool = False,
) -> str:
    """`facts` are (ref, section, content) in envelope layout order; only those the plan cites
    are listed (the rest would only lengthen the prompt). `continued` names planned sections
    an earlier window began, each with the last words written for it when known (a mapping
    title → text); `first_window` False says the document is already under way;
    `instructions` False leaves out the closing lines (the prompt before they were added,
    kept so the prompt benchmark can compare); `cite` asks the writer to cite the facts by
    their refs.

    The closing lines are what a small instruction model follows best (measured in docs/llm.md,
    "The window prompt"): the exact headings to write, a word count, and a plain
    "no introduction, no conclusion" — it otherwise opens every window with an introduction.
    """
    cited = {ref for s in plan for ref in s.fact_refs} if instructions else set()
    lines = [f"Task: {task}", anchor]
    if backward_summary:
        lines.append(f"Previously covered (for reference only): {backward_summary}")
    lines += ["", PLAN_HEADER]
    for s in plan:
        lines.append(f"- {s.title} (~{s.target_words} words): {', '.join(s.fact_refs)}")
    lines += ["", FACTS_HEADER]
    for ref, section, content in facts:
        if not cited or ref in cited:
            lines += fact_lines(ref, section, content)
    if plan and instructions:
        headings = ", ".join(f'"## {s.title}"' for s in plan)
        total = sum(s.target_words for s in plan)
        lines += ["", WRITE_HEADER,
                  f"- Write exactly these sections, in this order, each under its heading "
                  f"written exactly as given: {headings}. No other headings.",
                  f"- About {total} words in all, in full paragraphs that explain the facts in "
                  "your own words. Use only the facts above.",
                  *([CITE_LINE] if cite else []),
                  "- No code unless a fact above shows code.",
                  "- Start directly with the first heading: no greeting, no introduction, no "
                  "conclusion, no summary."]
        if not first_window:
            lines.append("- This continues a document that is already partly written; do not "
                         "restate the task or what earlier parts said.")
        ends = continued if isinstance(continued, Mapping) else dict.fromkeys(continued, "")
        for title, end in ends.items():
            if end:
                lines.append(f'- "{title}" was begun earlier and its text so far ends: "{end}" '
                             "Continue it from there with new material: do not introduce, "
                             "define or summarise it again.")
            else:
                lines.append(f'- "{title}" was begun earlier: add new material to it, do not '
                             "introduce it again.")
    return "\n".join(lines).rstrip() + "\n"
