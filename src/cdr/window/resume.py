"""`resume: "prefill"` (cdr.options): a window that continues a begun section starts its answer
where the section stopped.

Told in its prompt that a section was begun and shown the words its text ends with
(`show_section_ends`), the 1.5B reference model still starts the section again: on the long
benchmark's runs, windows continuing a begun section restated 20.1% of their sentences against
8.7% in windows opening a new one, and two windows of one run opened with Window 1's first
sentence word for word (docs/length.md, "Why the last third restates"). A writer that can
continue a begun answer (`continues_prefix`: the local model) is handed the section's heading
and the last words written for it as the start of its answer, so that what comes next is,
for a language model, the section's next sentence rather than its first.

Only the window's first planned section can be resumed: an answer has one start, and the plan
is in outline order, so a begun section is first whenever it is planned at all (every section
before it was written whole or left). The heading goes into the window's text; the words
already written do not (they are in the earlier window).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cdr.window.prompt import PlanSection
from cdr.writers.base import DeltaCallback, StreamInterruptedError, WriterResult


@dataclass(frozen=True, slots=True)
class Resume:
    """Where a continued section's answer starts: its heading line and its last words."""

    heading: str  # "## Title", as the prompt asks headings to be written
    words: str  # the last words an earlier window wrote for the section

    @property
    def prefix(self) -> str:
        """The answer as the writer is handed it: the heading, then the words so far."""
        return f"{self.heading}\n\n{self.words}"

    @property
    def head(self) -> str:
        """What the window's text starts with: the heading, not the words so far."""
        return f"{self.heading}\n\n"


def resume_for(plan: Sequence[PlanSection], continued: Mapping[str, str]) -> Resume | None:
    """The resume of a window whose first planned section an earlier window began and whose
    last words are known (`continued`: title → words); None otherwise."""
    if not plan:
        return None
    words = continued.get(plan[0].title, "").strip()
    return Resume(f"## {plan[0].title}", words) if words else None


def can_resume(writer: Any) -> bool:
    """Whether `writer` takes `prefix=` (`cdr.writers.base.Writer`, `continues_prefix`)."""
    return bool(getattr(writer, "continues_prefix", False))


class _AfterHead:
    """Hands the continuation on without the whitespace it starts with (the model's next
    token after the words so far is usually a space or a paragraph break): the pieces given
    to `on_delta` concatenate to the window's text."""

    def __init__(self, on_delta: DeltaCallback) -> None:
        self._on_delta = on_delta
        self._started = False

    def __call__(self, piece: str) -> None:
        if not self._started:
            piece = piece.lstrip()
            self._started = bool(piece)
        if piece:
            self._on_delta(piece)


def write_resumed(writer: Any, messages: list[dict[str, str]], max_tokens: int,
                  resume: Resume, on_delta: DeltaCallback | None = None) -> WriterResult:
    """The window written by `writer` from `resume`'s prefix: its text is the heading and
    then what the writer wrote after the prefix (its leading whitespace dropped)."""
    if on_delta is not None:
        on_delta(resume.head)
    sink = _AfterHead(on_delta) if on_delta is not None else None
    try:
        result: WriterResult = writer.generate(messages, max_tokens, on_delta=sink,
                                               prefix=resume.prefix)
    except StreamInterruptedError as exc:
        raise StreamInterruptedError(str(exc), exc.status,
                                     resume.head + exc.partial_text.lstrip()) from None
    result.text = resume.head + result.text.lstrip()
    return result
