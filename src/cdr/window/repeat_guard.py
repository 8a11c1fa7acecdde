"""Keep out of a window what an earlier window already said (opt-in: `repeats="drop"`).

Why: CDR keeps stale facts out of the envelope, and the spec's n-gram guard (§5) de-prioritises
facts whose wording was already written. Both act on the model's *input*. A small instruction
model still writes things again: a section it is asked to continue gets the same opening
sentence, an example is retyped, a fact seen in Window 1 is restated in Window 4's words. The
quality benchmark on the reference model measured it (bench/results/quality-llm.md): with CDR,
a third of windows 2–5's sentences restate an earlier window. This guard is the output-side
counterpart the spec calls "treating the symptom" (§1): it works on what the model wrote,
before Stage 8 and the session see it.

What counts as a repeat, per unit (a paragraph's sentences, a list's items, a code block, a
table or quote whole):

- *said before in these words*: at least `REPEAT_SHARE` of the unit's distinct 6-grams are in
  the session's blacklist (every earlier window's kept text, §5.1) or in the units this window
  already kept;
- *said before in other words* (prose units of `MIN_MEANING_WORDS` words or more): the unit's
  embedding has cosine ≥ `RESTATE_COSINE` to a sentence an earlier window kept.

A dropped unit is reported (`GuardResult.dropped`), never silently lost; a heading is kept only
if something under it is. When nothing is dropped the text comes back byte for byte.

`filter` is a pure function of the text and the earlier windows, decided block by block in
order, so what it keeps of a prefix of complete blocks is a prefix of what it keeps of the
whole text: `cdr.text.kept_stream.KeptStream` streams its output block by block and the streamed
text equals the stored one.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cdr.ngrams import ngram_hashes
from cdr.text.markdown import line_starts, parse_blocks
from cdr.text.sentences import split_sentences

# Half of a unit's 6-grams already written: the unit is mostly a copy. Sentences of new
# statements about the same API share a 6-gram or two ("the default value of the"), not half.
REPEAT_SHARE = 0.5
# Cosine (all-MiniLM-L6-v2) above which two sentences say the same thing. The quality
# benchmark's calibration on the reference model's outputs: paraphrase pairs have median 0.87,
# same-topic pairs making different statements have their 99th percentile at 0.70.
RESTATE_COSINE = 0.70
# Shorter prose ("For example:", "Here is how") is never judged by meaning.
MIN_MEANING_WORDS = 4

# A list item starts a line with a bullet or a number; a top-level one at the first's indent.
_ITEM_START = re.compile(r"^(?P<indent> *)(?:[-*+]|\d{1,9}[.)])(?:\s|$)")


def split_items(list_source: str) -> list[str]:
    """A list's top-level items, each with its continuation and nested lines (and the blank
    lines after it, so that joining the items with newlines gives the list back)."""
    items: list[list[str]] = []
    top: int | None = None
    for line in list_source.split("\n"):
        start = _ITEM_START.match(line)
        if top is None and start:
            top = len(start["indent"])
        if not items or (start and len(start["indent"]) == top):
            items.append([line])
        else:
            items[-1].append(line)
    return ["\n".join(lines) for lines in items if "".join(lines).strip()]


@dataclass
class GuardResult:
    """What a window keeps, what the guard took out, and the kept prose units' vectors (rows
    L2-normalised), which later windows are compared with."""

    text: str
    dropped: list[str] = field(default_factory=list)
    vectors: np.ndarray | None = None


@dataclass
class _Unit:
    source: str  # as written, for putting the block back together
    prose: bool
    text: str = field(init=False)  # what is judged and reported: no list marker or spacing

    def __post_init__(self) -> None:
        self.text = _ITEM_START.sub("", self.source.strip(), count=1).strip()


class RepeatGuard:
    """The guard for one window: fixed earlier windows, any number of `filter` calls."""

    def __init__(
        self,
        written_before: Callable[[int], bool],
        earlier_vectors: np.ndarray,
        encode: Callable[[Sequence[str]], np.ndarray],
        *,
        restate_cosine: float = RESTATE_COSINE,
        repeat_share: float = REPEAT_SHARE,
    ) -> None:
        """`written_before(h)`: is 6-gram hash `h` in an earlier window's kept text (the
        session's blacklist). `earlier_vectors`: (n, dim) unit rows of the sentences earlier
        windows kept. `encode`: the CKF's embedding model (rows L2-normalised)."""
        self._before = written_before
        self._earlier = np.asarray(earlier_vectors, np.float32)
        if self._earlier.ndim != 2:
            raise ValueError(f"earlier_vectors must be (n, dim), got shape {self._earlier.shape}")
        self._dim = self._earlier.shape[1]
        self._encode = encode
        self.restate_cosine = restate_cosine
        self.repeat_share = repeat_share
        self._vectors: dict[str, np.ndarray] = {}  # a streamed window re-filters its prefix

    # -- the decision -------------------------------------------------------------------------

    def _vector(self, unit: str) -> np.ndarray:
        vec = self._vectors.get(unit)
        if vec is None:
            vec = np.asarray(self._encode([unit]), np.float32)[0]
            self._vectors[unit] = vec
        return vec

    def _said_in_these_words(self, hashes: np.ndarray, this_window: set[int]) -> bool:
        if not hashes.size:
            return False
        seen = sum(1 for h in hashes.tolist() if h in this_window or self._before(h))
        return seen >= self.repeat_share * hashes.size

    def _said_in_other_words(self, unit: str) -> bool:
        if not len(self._earlier) or len(unit.split()) < MIN_MEANING_WORDS:
            return False
        return float((self._earlier @ self._vector(unit)).max()) >= self.restate_cosine

    # -- the text -----------------------------------------------------------------------------

    def filter(self, text: str) -> GuardResult:
        """`text` without its repeats (see the module docstring)."""
        blocks = parse_blocks(text)
        if not blocks:
            return GuardResult(text, [], self._stack([]))
        starts = line_starts(text)
        out: list[str] = []
        # Headings waiting for kept content under them: [level, source, emptied] — emptied
        # once a unit after it was dropped. A heading the guard emptied goes; one the model
        # left empty stays, as it would with nothing dropped.
        pending: list[list[Any]] = []
        dropped: list[str] = []
        kept_prose: list[str] = []
        this_window: set[int] = set()
        prev_end = 0
        for block in blocks:
            s, e = starts[block.start], starts[min(block.end, len(starts) - 1)]
            lead, source = text[prev_end:s], text[s:e].rstrip("\n")
            prev_end = s + len(source)
            if block.kind == "heading":
                while pending and pending[-1][0] >= block.level:
                    closed = pending.pop()
                    if not closed[2]:  # empty as written: keep it, and what is above it
                        out.extend(p[1] for p in pending)
                        out.append(closed[1])
                        pending = [[lvl, "", emptied] for lvl, _, emptied in pending]
                pending.append([block.level, lead + source, False])
                continue
            units = self._units(block.kind, source)
            kept: list[_Unit] = []
            for unit in units:
                hashes = np.unique(ngram_hashes(unit.text))
                if self._said_in_these_words(hashes, this_window) or (
                        unit.prose and self._said_in_other_words(unit.text)):
                    dropped.append(unit.text)
                    for p in pending:
                        p[2] = True
                    continue
                kept.append(unit)
                this_window.update(hashes.tolist())
                if unit.prose and len(unit.text.split()) >= MIN_MEANING_WORDS:
                    kept_prose.append(unit.text)
            if not kept:
                continue
            out.extend(p[1] for p in pending)
            pending = []
            body = source if len(kept) == len(units) else _join(block.kind, kept)
            out.append(lead + body)
        if not dropped:
            return GuardResult(text, [], self._stack(kept_prose))
        out.extend(p[1] for p in pending if not p[2])
        kept_text = "".join(out)
        if out and kept_text and text[prev_end:].strip() == "":
            kept_text += text[prev_end:]
        return GuardResult(kept_text, dropped, self._stack(kept_prose))

    @staticmethod
    def _units(kind: str, source: str) -> list[_Unit]:
        if kind == "paragraph":
            return [_Unit(s, True) for s in split_sentences(source)]
        if kind == "list":
            return [_Unit(i, True) for i in split_items(source)]
        return [_Unit(source, False)]

    def _stack(self, units: list[str]) -> np.ndarray:
        if not units:
            return np.zeros((0, self._dim), np.float32)
        return np.stack([self._vector(u) for u in units]).astype(np.float32)


def _join(kind: str, kept: list[_Unit]) -> str:
    """A block from its kept units: sentences joined by a space, list items as they were
    separated (a blank line after an item stays with it)."""
    if kind == "paragraph":
        return " ".join(u.source for u in kept)
    return "\n".join(u.source for u in kept).rstrip("\n")


