"""The window prompt's format: the headers and lines a writer finds in it, and the parser
the extractive writer (and the tests) read a prompt back with.

`cdr.window.prompt` builds prompts in this format; a writer that reads the plan and the facts
back imports this module, not the loop that wrote them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

PLAN_HEADER = "Plan for this part (write these sections in order, from the facts listed):"
FACTS_HEADER = "Facts:"
WRITE_HEADER = "Write this part now:"
# The line a prompt of a citing session carries (`citations` on, `cdr.citations`): the writer
# marks each sentence with the refs of the facts it states; the loop checks every mark.
CITE_LINE = ("- After each sentence, cite the facts it states by their refs in square "
             "brackets, such as [F2] or [F1, F3]. Cite only the facts above.")
_PLAN_LINE = re.compile(r"^- (?P<title>.+) \(~(?P<words>\d+) words\): (?P<refs>F\d+(?:, F\d+)*)$")
_FACT_LINE = re.compile(r"^\[(?P<ref>F\d+)\] \((?P<section>.*)\)$")


@dataclass(frozen=True)
class PlanSection:
    title: str
    target_words: int
    fact_refs: tuple[str, ...]
    # False when `fit_plan` trimmed the section to the window's budget: the window writes
    # part of it and the next one continues it (the length contract's "written whole").
    whole: bool = True


def asks_citations(text: str) -> bool:
    """Whether a prompt made by `build_user_prompt` asks its writer to cite (`cite`)."""
    return CITE_LINE in text.splitlines()


def parse_prompt(text: str) -> tuple[list[PlanSection], dict[str, str]]:
    """The plan sections and the facts by ref, from a prompt made by `build_user_prompt`."""
    plan: list[PlanSection] = []
    facts: dict[str, list[str]] = {}
    state, current = "head", ""
    for line in text.splitlines():
        if state == "head" and line == PLAN_HEADER:
            state = "plan"
        elif state in ("head", "plan") and line == FACTS_HEADER:
            state = "facts"
        elif state == "facts" and line == WRITE_HEADER:
            state = "end"
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
