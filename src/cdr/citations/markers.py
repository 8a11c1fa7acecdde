"""The citation markers a writer leaves in its text, and the ones a document shows.

A window's prompt numbers its facts F1…Fn (`cdr.window.prompt`), and a writer asked to cite
marks a sentence with the facts it rests on: ``[F2]``, ``[F1, F3]``, ``(F4)``. Those refs mean
something only inside their window, so they never reach the reader: `take_writer_markers`
lifts them out of the text (leaving clean prose, which every other layer — Stage 8, the n-gram
guard, the length contract — reads as it always did) and says where each stood. The document
shows numbers instead, one per fact across the whole document (`render_markers`), in the style
the run chose: ``[n]`` after the sentence, or Markdown footnotes ``[^n]``.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Literal

from markdown_it import MarkdownIt

from cdr.text.markdown import line_starts

CitationStyle = Literal["off", "numbers", "footnotes"]
CITATION_STYLES: tuple[str, ...] = ("off", "numbers", "footnotes")

# [F3] [F3, F5] [F3; F5] [F3 and F5] [F1-F3] [f2] [F1, F2, 3] (F3) (F3, F5) [F3][F5]; "Fact 3"
# and "F 3" as small models sometimes write them. A bracketed run that is not all refs (a link,
# a list index) stays; a parenthesised one is taken only when every ref in it was given (prose
# says "the F1 key (F1)" more often than a bracket does).
_REF = r"F(?:act)?\s?\d{1,4}"
_ITEM = rf"{_REF}(?:\s*[-–]\s*{_REF})?"
_NEXT = rf"(?:{_ITEM}|\d{{1,4}})"
_SEP = r"\s*(?:,|;|and|&)\s*"
WRITER_MARKER = re.compile(
    rf"[ \t]*(?:\[(?P<b>{_ITEM}(?:{_SEP}{_NEXT})*)\]|\((?P<p>{_ITEM}(?:{_SEP}{_NEXT})*)\))",
    re.IGNORECASE)
_REF_PART = re.compile(r"(?P<a>\d{1,4})(?:\s*[-–]\s*F(?:act)?\s?(?P<b>\d{1,4}))?", re.IGNORECASE)
_INLINE_CODE = re.compile(r"(`+)(?:(?!\1).)+?\1", re.DOTALL)
MAX_RANGE = 20  # [F1-F20] at most: a wider "range" is not a citation
_PARSER = MarkdownIt("commonmark")


@dataclass(frozen=True, slots=True)
class WriterMarker:
    """Refs a writer put at `offset` of the clean text (where the marker was taken out)."""

    offset: int
    refs: tuple[str, ...]


def _refs(body: str) -> tuple[str, ...]:
    out: list[str] = []
    for m in _REF_PART.finditer(body):
        a = int(m["a"])
        b = int(m["b"]) if m["b"] else a
        out += [f"F{n}" for n in range(a, b + 1)] if a <= b <= a + MAX_RANGE else [f"F{a}"]
    return tuple(out)


def take_writer_markers(text: str, given: Collection[str] | None = None
                        ) -> tuple[str, list[WriterMarker]]:
    """`text` without its writer markers, and each marker's refs (``F3``…) with the offset in
    the clean text where it stood. Code (fenced, indented, inline) keeps its brackets; a
    parenthesised marker is taken only when all its refs are in `given` (when given). A marker
    that opens a line takes the space after it too."""
    out: list[str] = []
    markers: list[WriterMarker] = []
    last = 0
    length = 0
    code = _code_ranges(text)
    for m in WRITER_MARKER.finditer(text):
        if any(a <= m.start() < b for a, b in code):
            continue
        refs = _refs(m.group("b") or m.group("p") or "")
        if m.group("p") is not None and given is not None and not set(refs) <= set(given):
            continue
        piece = text[last:m.start()]
        out.append(piece)
        length += len(piece)
        markers.append(WriterMarker(length, refs))
        last = m.end()
        if (m.start() == 0 or text[m.start() - 1] in "\r\n") and text[last:last + 1] == " ":
            last += 1
    out.append(text[last:])
    return "".join(out), markers


def _code_ranges(text: str) -> list[tuple[int, int]]:
    """Character ranges of code: fenced and indented blocks (CommonMark's), inline spans."""
    starts = line_starts(text)
    ranges = [(starts[tok.map[0]], starts[min(tok.map[1], len(starts) - 1)])
              for tok in _PARSER.parse(text)
              if tok.type in ("fence", "code_block") and tok.map is not None]
    ranges += [(m.start(), m.end()) for m in _INLINE_CODE.finditer(text)]
    return ranges


def marker_text(numbers: Sequence[int], style: str) -> str:
    """What the reader sees after a sentence resting on facts `numbers`."""
    if style == "footnotes":
        return "".join(f"[^{n}]" for n in numbers)
    if style == "numbers":
        return "".join(f"[{n}]" for n in numbers)
    return ""


def render_markers(text: str, placed: Sequence[tuple[int, Sequence[int]]], style: str) -> str:
    """`text` with `marker_text(numbers)` inserted at each (offset, numbers) of `placed`."""
    if style == "off" or not placed:
        return text
    out: list[str] = []
    last = 0
    for offset, numbers in sorted(placed, key=lambda p: p[0]):
        if not numbers:
            continue
        out.append(text[last:offset])
        out.append(marker_text(numbers, style))
        last = offset
    out.append(text[last:])
    return "".join(out)
