"""Invented identifiers: the API names a window writes that its material does not hold.

The long benchmark's first runs grounded Window 1 worst (bench/results/long.md: focused W1
75.2%, datetime W1 33%), and the report put it down to the model listing members the facts
do not name (`timedelta.total_microseconds()`). This module checks that on the texts: per
sentence (the prose sentences the grounding measure scores, `cdr.report.quality.sentences`),
the identifiers it names, and which of them neither the window's envelope nor the task's own
page holds.

An **identifier** is what documentation names as code: the leading name of an inline code span
(`` `timedelta.total_seconds()` `` → `timedelta.total_seconds`), a name followed by a call's
parenthesis (`mbind(`), an upper-case constant with an underscore (`MPOL_BIND`), an errno
name (`EFAULT`), or a snake_case name. It is **held** by a text when its last dotted
component occurs there as a word (`timedelta.total_seconds` is held by a fact that says
"total_seconds"): the model may qualify a name the facts give bare. Absent from the
envelope means the window was not given it; absent from the page means the documentation
does not have it at all — invented, or at best from the model's own memory.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

_SPAN = re.compile(r"`([^`\n]+)`")
_LEADING = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*)")
_CALL = re.compile(r"\b([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*)\(")
_CONST = re.compile(r"\b([A-Z][A-Z0-9]*_[A-Z0-9_]+)\b")
_ERRNO = re.compile(r"\b(E[A-Z]{3,})\b")
_SNAKE = re.compile(r"\b([a-z][a-z0-9]*_[a-z0-9_]+)\b")
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def identifiers(sentence: str) -> set[str]:
    """The identifiers a sentence names (see the module docstring)."""
    out: set[str] = set()
    for span in _SPAN.findall(sentence):
        m = _LEADING.match(span)
        if m:
            out.add(m.group(1))
    bare = _SPAN.sub(" ", sentence)
    for rx in (_CALL, _CONST, _ERRNO, _SNAKE):
        out.update(rx.findall(bare))
    return {i for i in out if len(i.rsplit(".", 1)[-1]) > 1}


def words_of(texts: Iterable[str]) -> set[str]:
    """Every word-like token of `texts` (what an identifier's last component is looked up in)."""
    out: set[str] = set()
    for t in texts:
        out.update(_WORD.findall(t))
    return out


def held(identifier: str, words: set[str]) -> bool:
    """Whether a text whose words are `words` holds `identifier` (its last dotted component)."""
    return identifier.rsplit(".", 1)[-1] in words


@dataclass(frozen=True)
class WindowIdentifiers:
    """One window's identifiers against its material."""

    named: int  # distinct identifiers the window's sentences name
    not_on_page: int  # … that the task's own page does not hold
    not_in_envelope: int | None  # … that the window's envelope does not hold (None: unknown)
    sentences: int
    sentences_not_on_page: int  # sentences naming an identifier the page does not hold
    flags: tuple[bool, ...]  # per sentence: names an identifier its material does not hold
    off_page_flags: tuple[bool, ...]  # per sentence: names one the page does not hold
    examples: tuple[str, ...]  # a few of the names the page does not hold


def window_identifiers(sentences: Sequence[str], page_words: set[str],
                       envelope_words: set[str] | None) -> WindowIdentifiers:
    """Count a window's identifiers against the page (always) and the envelope (when known).
    `flags` marks the sentences naming one the envelope does not hold, or, when the envelope
    is unknown, the page."""
    per = [identifiers(s) for s in sentences]
    named = set().union(*per) if per else set()
    off_page = {i for i in named if not held(i, page_words)}
    off_env = None if envelope_words is None else {i for i in named
                                                   if not held(i, envelope_words)}
    missing = off_page if off_env is None else off_env
    flags = tuple(bool(ids & missing) for ids in per)
    return WindowIdentifiers(len(named), len(off_page),
                             None if off_env is None else len(off_env), len(sentences),
                             sum(bool(ids & off_page) for ids in per), flags,
                             tuple(bool(ids & off_page) for ids in per),
                             tuple(sorted(off_page))[:6])
