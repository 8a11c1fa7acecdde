"""`resume: "prefill"` (cdr.options): a window that continues a begun section starts its answer
where the section stopped.

Told in its prompt that a section was begun and shown the words its text ends with
(`show_section_ends`), the 1.5B reference model still starts the section again: on the long
benchmark's runs, windows continuing a begun section restated 20.1% of their sentences against
8.7% in windows opening a new one, and two windows of one run opened with Window 1's first
sentence word for word (docs/length.md, "The reference model on today's loop"). A writer that can
continue a begun answer (`continues_prefix`: the local model) is handed the section's heading
and the last words written for it as the start of its answer, so that what comes next is,
for a language model, the section's next sentence rather than its first.

Only the window's first planned section can be resumed: an answer has one start, and the plan
is in outline order, so a begun section is first whenever it is planned at all (every section
before it was written whole or left). The heading goes into the window's text; the words
already written do not (they are in the earlier window).

Two ways it can go nowhere, both seen on the tuning runs (bench/results/long-tune.md): the
words so far are the model's own loop (a list of one item repeated to the token limit), which
a model handed them goes on repeating, so such a tail (`MIN_DISTINCT_SHARE`) is not handed
on; and a continuation cut inside its first paragraph keeps nothing, so the window is written
once more unresumed rather than left empty (which the next window would only repeat).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cdr.text.prompt_format import PlanSection
from cdr.window.plan import heading_key
from cdr.writers.base import DeltaCallback, StreamInterruptedError, WriterResult, sum_usage


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


# Distinct words among the words so far below which they are a loop, not a start: prose
# repeats few of its 40 words (function words), a model's loop ("- `tuple` - `tuple` …")
# nearly all.
MIN_DISTINCT_SHARE = 0.5


def repeats_itself(words: str) -> bool:
    """Whether `words` are mostly the same few words over again."""
    tokens = words.casefold().split()
    return bool(tokens) and len(set(tokens)) < MIN_DISTINCT_SHARE * len(tokens)


# Marks of Markdown structure that the quoted words lose: the quote (`dpe.tail_words`) joins
# its lines with single spaces, so a list or a code block in it would be handed to the model
# as one broken line, and one starting mid-sentence is marked "… ".
_STRUCTURE = re.compile(r"```|~~~|(?:^|\s)(?:[-*+]|\d+[.)]|#{1,6}|\|)\s")


def hands_on(words: str) -> bool:
    """Whether `words` can start the model's answer as they are: plain prose that begins a
    sentence, does not repeat itself, and holds no list, code, table or heading."""
    return bool(words) and not words.startswith("…") and not repeats_itself(words) \
        and not _STRUCTURE.search(words)


def resume_for(plan: Sequence[PlanSection], continued: Mapping[str, str]) -> Resume | None:
    """The resume of a window whose first planned section an earlier window began and whose
    last words are known (`continued`: title → words) and can be handed on (`hands_on`);
    None otherwise."""
    if not plan:
        return None
    words = continued.get(plan[0].title, "").strip()
    return Resume(f"## {plan[0].title}", words) if hands_on(words) else None


def without_own_heading(text: str, heading: str) -> str:
    """`text` without a first line that is a Markdown heading naming the same section as
    `heading` (an unresumed answer begins with the section's heading, which the resumed
    window's text already holds)."""
    first, _, rest = text.lstrip().partition("\n")
    if first.startswith("#") and heading_key(first.lstrip("#").strip()) == heading_key(
            heading.lstrip("#").strip()):
        return rest.lstrip()
    return text.lstrip()


def can_resume(writer: Any) -> bool:
    """Whether `writer` takes `prefix=` (`cdr.writers.base.Writer`, `continues_prefix`)."""
    return bool(getattr(writer, "continues_prefix", False))


class _AfterHead:
    """Hands the continuation on without the whitespace it starts with (the model's next
    token after the words so far is usually a space or a paragraph break): the pieces given
    to `on_delta` concatenate to the window's text."""

    def __init__(self, head: str, on_delta: DeltaCallback) -> None:
        self._head = head
        self._on_delta = on_delta
        self._started = False

    @property
    def started(self) -> bool:
        """Whether anything has been handed on."""
        return self._started

    def __call__(self, piece: str) -> None:
        if not self._started:
            piece = piece.lstrip()
            if not piece:
                return
            # the heading goes out with the first words after it: a continuation that
            # brings nothing has sent nothing
            self._started = True
            piece = self._head + piece
        self._on_delta(piece)


def write_resumed(writer: Any, messages: list[dict[str, str]], max_tokens: int,
                  resume: Resume, on_delta: DeltaCallback | None = None
                  ) -> tuple[WriterResult, bool]:
    """The window written by `writer` from `resume`'s prefix, and whether the prefix was
    kept: its text is the heading and then what the writer wrote after the prefix (leading
    whitespace dropped). A continuation that keeps nothing (cut at the token limit inside its
    first paragraph, or stopped at once) is written again unresumed, its usage the two
    calls'."""
    sink = _AfterHead(resume.head, on_delta) if on_delta is not None else None
    try:
        result: WriterResult = writer.generate(messages, max_tokens, on_delta=sink,
                                               prefix=resume.prefix)
    except StreamInterruptedError as exc:
        partial = exc.partial_text.lstrip()
        raise StreamInterruptedError(str(exc), exc.status,
                                     resume.head + partial if partial else "") from None
    if result.text.strip():
        result.text = resume.head + result.text.lstrip()
        return result, True
    # Nothing kept: written again unresumed. Also when the model stopped at once (the section
    # done, to its mind): an empty window changes nothing in the session, so the next window
    # would be prepared, resumed and left empty the same way until the window limit.
    if sink is not None and sink.started:
        # the stream has the heading and the start of a paragraph that was then cut: written
        # again without streaming, under the heading already sent (a stream kept to complete
        # blocks, `KeptStream`, has released at most the heading)
        again: WriterResult = writer.generate(messages, max_tokens)
        again.text = resume.head + without_own_heading(again.text, resume.heading)
    else:
        again = writer.generate(messages, max_tokens, on_delta=on_delta)
    estimated = any(u.get("estimated") for u in (result.usage, again.usage))
    again.usage = {**sum_usage([result.usage, again.usage]),
                   **({"estimated": 1} if estimated else {})}
    return again, False
