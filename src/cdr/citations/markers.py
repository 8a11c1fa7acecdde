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
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

CitationStyle = Literal["off", "numbers", "footnotes"]
CITATION_STYLES: tuple[str, ...] = ("off", "numbers", "footnotes")

# [F3] [F3, F5] [F3; F5] [F3 and F5] (F3) (F3, F5) [F3][F5]; "Fact 3" and "F 3" as small models
# sometimes write them. A bracketed run that is not all refs (a link, a list index) stays.
_REF = r"F(?:act)?\s?\d{1,4}"
_SEP = r"\s*(?:,|;|and|&)\s*"
WRITER_MARKER = re.compile(
    rf"[ \t]*(?:\[(?P<b>{_REF}(?:{_SEP}{_REF})*)\]|\((?P<p>{_REF}(?:{_SEP}{_REF})*)\))")
_REF_NUMBER = re.compile(r"\d{1,4}")


@dataclass(frozen=True, slots=True)
class WriterMarker:
    """Refs a writer put at `offset` of the clean text (where the marker was taken out)."""

    offset: int
    refs: tuple[str, ...]


def take_writer_markers(text: str) -> tuple[str, list[WriterMarker]]:
    """`text` without its writer markers, and each marker's refs (``F3``…) with the offset in
    the clean text where it stood. Text inside fenced or indented code keeps its brackets."""
    out: list[str] = []
    markers: list[WriterMarker] = []
    last = 0
    length = 0
    fenced = _fenced_ranges(text)
    for m in WRITER_MARKER.finditer(text):
        if any(a <= m.start() < b for a, b in fenced):
            continue
        piece = text[last:m.start()]
        out.append(piece)
        length += len(piece)
        body = m.group("b") or m.group("p") or ""
        refs = tuple(f"F{int(n)}" for n in _REF_NUMBER.findall(body))
        markers.append(WriterMarker(length, refs))
        last = m.end()
    out.append(text[last:])
    return "".join(out), markers


def _fenced_ranges(text: str) -> list[tuple[int, int]]:
    """Character ranges of fenced code blocks (``` or ~~~), an unclosed one to the end."""
    ranges: list[tuple[int, int]] = []
    start: int | None = None
    fence = ""
    pos = 0
    for line in text.splitlines(keepends=True):
        stripped = line.lstrip()
        if start is None and stripped.startswith(("```", "~~~")):
            start, fence = pos, stripped[:3]
        elif start is not None and stripped.startswith(fence):
            ranges.append((start, pos + len(line)))
            start = None
        pos += len(line)
    if start is not None:
        ranges.append((start, len(text)))
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
