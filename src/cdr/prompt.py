"""The window prompt: task, Residual Task Anchor, a section plan and numbered facts.

One format serves every writer. An LLM reads the plan as guidance (which facts suit which
remaining section, and about how many words each needs); the extractive writer parses it back
(`parse_prompt`) and writes from it, so both see the same envelope.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

_PLAN_HEADER = "Plan for this part (write these sections in order, from the facts listed):"
_FACTS_HEADER = "Facts:"
_PLAN_LINE = re.compile(r"^- (?P<title>.+) \(~(?P<words>\d+) words\): (?P<refs>F\d+(?:, F\d+)*)$")
_FACT_LINE = re.compile(r"^\[(?P<ref>F\d+)\] \((?P<section>.*)\)$")


@dataclass(frozen=True)
class PlanSection:
    title: str
    target_words: int
    fact_refs: tuple[str, ...]


def build_user_prompt(
    task: str,
    anchor: str,
    plan: Sequence[PlanSection],
    facts: Sequence[tuple[str, str, str]],
    backward_summary: str = "",
) -> str:
    """`facts` are (ref, section, content) in envelope layout order."""
    lines = [f"Task: {task}", anchor]
    if backward_summary:
        lines.append(f"Previously covered (for reference only): {backward_summary}")
    lines += ["", _PLAN_HEADER]
    for s in plan:
        lines.append(f"- {s.title} (~{s.target_words} words): {', '.join(s.fact_refs)}")
    lines += ["", _FACTS_HEADER]
    for ref, section, content in facts:
        lines += [f"[{ref}] ({section})", content.strip(), ""]
    return "\n".join(lines).rstrip() + "\n"


def parse_prompt(text: str) -> tuple[list[PlanSection], dict[str, str]]:
    """The plan sections and the facts by ref, from a prompt made by `build_user_prompt`."""
    plan: list[PlanSection] = []
    facts: dict[str, list[str]] = {}
    state, current = "head", ""
    for line in text.splitlines():
        if state == "head" and line == _PLAN_HEADER:
            state = "plan"
        elif state in ("head", "plan") and line == _FACTS_HEADER:
            state = "facts"
        elif state == "plan":
            m = _PLAN_LINE.match(line)
            if m:
                plan.append(PlanSection(m["title"], int(m["words"]),
                                        tuple(m["refs"].split(", "))))
        elif state == "facts":
            m = _FACT_LINE.match(line)
            if m:
                current = m["ref"]
                facts[current] = []
            elif current:
                facts[current].append(line)
    return plan, {ref: "\n".join(body).strip() for ref, body in facts.items()}
