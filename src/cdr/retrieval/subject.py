"""Subject-anchored sub-queries (`subject: "anchor"`, not in CRP-SPEC-024).

An outline line such as "Background" or "Return value" says nothing about *whose* background:
embedded alone it sits as close to every document's "Background" as to the task's own, so on a
knowledge base of many documents of one kind the ranking, the residual pull, the coverage and
Stage 8 all follow a generic topic. Anchored, the line is embedded as

    <subject> — <line>

where the subject is the task without its instruction words (`task_topic`, bounded to
`SUBJECT_WORDS`). That is the shape the `title-section` fact recipe gives the facts
(`cdr.retrieval.fact_recipe`), so a section line meets its own document's section. Only the vectors
change: the sub-query's text, which the window writes under and the trace shows, stays the
line. A line that already names the subject is embedded as written.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from cdr.coverage import SubQuery
from cdr.retrieval.fact_recipe import TITLE_WORDS, clean_context

# About a title's length: enough to name a subject, too short to drown the line.
SUBJECT_WORDS = TITLE_WORDS + 2
# What `task_topic` leaves of a task without a verb ("A guide to X", "a reference page about
# X"): a kind of document and a preposition, which name no subject.
_DOCUMENT_KIND = re.compile(
    r"^\s*(?:(?:a|an|the)\s+)?(?:[\w-]+\s+){0,3}?(?:guide|page|reference|report|overview"
    r"|article|document|documentation|chapter|tutorial|introduction|summary|manual|entry"
    r"|essay|review|audit|handbook)\s+(?:to|on|about|of|for|covering)\s+(?:the\s+)?",
    re.IGNORECASE)
# A task's instruction words ("Write a comprehensive guide to"), which `task_topic` drops.
_INSTRUCTION = re.compile(
    r"^\s*(?:please\s+)?(?:write|draft|produce|create|compose|prepare|generate|give|explain)"
    r"(?:\s+(?:me|us))?\s+(?:(?:a|an|the)\s+)?(?:(?:comprehensive|complete|detailed|long|short"
    r"|full|thorough|practical|concise|in-depth)\s+)*(?:(?:guide|report|overview|document"
    r"|article|essay|introduction|tutorial|summary|chapter|explanation|audit|review)\s+)?"
    r"(?:(?:to|on|about|of|for|covering)\s+(?:the\s+)?)?",
    re.IGNORECASE,
)


def task_topic(task: str) -> str:
    """The task without its instruction words ("Write a comprehensive guide to X" → "X"),
    which embeds closer to the material than the instruction does (docs/design.md §3.11
    "The query and the gate")."""
    topic = _INSTRUCTION.sub("", task.strip(), count=1).strip(" .:")
    return topic or task.strip()


def subject_of(task: str) -> str:
    """The task's subject: its topic without instruction words, cleaned and bounded."""
    # cleaned first so a control character cannot hide the instruction words
    topic = task_topic(clean_context(task, 8 * SUBJECT_WORDS))
    return clean_context(_DOCUMENT_KIND.sub("", topic, count=1) or topic, SUBJECT_WORDS)


def anchored(subject: str, line: str) -> str:
    """What a sub-query line is embedded as under `subject: "anchor"`."""
    if not subject or subject.casefold() in line.casefold():
        return line
    return f"{subject} — {line}"


def sub_query_texts(task: str, sub_queries: Sequence[SubQuery], mode: str) -> list[str]:
    """The texts the sub-queries are embedded from: as written (`"off"`, the spec), or each
    anchored to the task's subject (`"anchor"`)."""
    if mode == "off":
        return [sq.text for sq in sub_queries]
    subject = subject_of(task)
    return [anchored(subject, sq.text) for sq in sub_queries]
