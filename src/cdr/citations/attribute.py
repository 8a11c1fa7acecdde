"""Which facts each sentence of a window rests on: the writer's citations, checked and repaired.

A writer is asked to cite the facts it uses (`cdr.window.prompt`); the extractive writer cites
the fact it pastes, a model cites what it remembers to, and a small model forgets or cites the
wrong fact. So no citation is taken on trust: every factual sentence of the window's text is
scored against the facts the window was given (`cdr.citations.support`), and

- a writer's citation stands when its fact supports the sentence (``cited``); a sentence with no
  marker of its own takes the next marker in its paragraph (models often cite once per
  paragraph) on the same terms;
- a sentence left with none gets the given fact that supports it best, when one does
  (``repaired``);
- a sentence no given fact supports is flagged (``unsupported``) and cites nothing.

A citation therefore never names a fact the window was not given: refs outside the envelope
are counted (`WindowCitations.invalid`) and dropped. The result is an overlay on the clean text
(offsets of each sentence), so the text every other layer reads is the prose alone.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from markdown_it import MarkdownIt
from markdown_it.token import Token

from cdr.citations.markers import (
    WriterMarker,
    marker_text,
    render_markers,
    take_writer_markers,
)
from cdr.citations.support import (
    SUPPORT_THRESHOLD,
    content_words,
    lexical_scores,
    lexical_support,
    lexical_sure,
    negations,
    support_scores,
)
from cdr.text.markdown import line_starts
from cdr.text.sentences import sentence_spans

MIN_FACTUAL_WORDS = 4  # a shorter sentence ("See below.") states nothing to cite
MAX_PER_SENTENCE = 3
# Factual sentences a window's citations cover: a window of 4,096 tokens holds about 150; a
# text far longer (a sidecar client's 400,000 characters) is cited up to here, the rest counted.
MAX_SENTENCES = 512
_PARSER = MarkdownIt("commonmark")
CITED, REPAIRED, UNSUPPORTED = "cited", "repaired", "unsupported"
SENTENCE_STATUSES = (CITED, REPAIRED, UNSUPPORTED)

Encode = Callable[[list[str]], np.ndarray]


@dataclass(frozen=True, slots=True)
class GivenFact:
    """A fact the window's prompt listed: its ref there (F3) and what a source entry shows."""

    ref: str
    fact_id: str
    source: str
    section: str
    content: str


@dataclass(frozen=True, slots=True)
class SentenceCitation:
    """One factual sentence of a window's clean text (`start`:`end`) and the facts it cites,
    best supported first, with their support scores."""

    start: int
    end: int
    facts: tuple[str, ...]
    support: tuple[float, ...]
    status: str
    unit: int  # the paragraph or list item it is in: a marker closes a run within one

    def to_dict(self, numbers: Mapping[str, int]) -> dict[str, Any]:
        return {"start": self.start, "end": self.end, "facts": list(self.facts),
                "numbers": [numbers[f] for f in self.facts if f in numbers],
                "support": [round(s, 4) for s in self.support], "status": self.status,
                "paragraph": self.unit}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SentenceCitation:
        return cls(int(data["start"]), int(data["end"]), tuple(map(str, data["facts"])),
                   tuple(float(s) for s in data["support"]), str(data["status"]),
                   int(data.get("paragraph", 0)))


@dataclass
class WindowCitations:
    """A window's citations: every factual sentence, and what was taken out of the writer's."""

    sentences: list[SentenceCitation] = field(default_factory=list)
    invalid: int = 0  # refs to facts the window was not given
    dropped: int = 0  # the writer's refs to given facts that do not support their sentence
    written: int = 0  # refs the writer wrote in all
    unplaced: int = 0  # refs by no factual sentence (after a heading, in a code block's place)
    beyond: int = 0  # factual sentences past `MAX_SENTENCES`, left uncited
    numbers: dict[str, int] = field(default_factory=dict)  # each cited fact's in the document

    @property
    def factual(self) -> int:
        return len(self.sentences)

    @property
    def cited(self) -> int:
        return sum(1 for s in self.sentences if s.facts)

    @property
    def unsupported(self) -> list[SentenceCitation]:
        return [s for s in self.sentences if s.status == UNSUPPORTED]

    def fact_order(self) -> list[str]:
        """The cited facts in order of first citation."""
        return list(dict.fromkeys(f for s in self.sentences for f in s.facts))

    def to_dict(self) -> dict[str, Any]:
        return {
            "sentences": [s.to_dict(self.numbers) for s in self.sentences],
            "factual": self.factual, "cited": self.cited,
            "cited_share": round(self.cited / self.factual, 4) if self.factual else None,
            "unsupported": len(self.unsupported), "invalid": self.invalid,
            "dropped": self.dropped, "written": self.written,
            **({"unplaced": self.unplaced} if self.unplaced else {}),
            **({"beyond": self.beyond} if self.beyond else {}),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> WindowCitations:
        sentences = [SentenceCitation.from_dict(s) for s in data["sentences"]]
        numbers = {str(f): int(n) for s in data["sentences"]
                   for f, n in zip(s["facts"], s.get("numbers", ()), strict=False)}
        return cls(sentences, invalid=int(data.get("invalid", 0)),
                   dropped=int(data.get("dropped", 0)), written=int(data.get("written", 0)),
                   unplaced=int(data.get("unplaced", 0)), beyond=int(data.get("beyond", 0)),
                   numbers=numbers)


@dataclass(frozen=True, slots=True)
class _Sentence:
    start: int
    end: int
    unit: int


@dataclass(frozen=True, slots=True)
class _Unit:
    """A paragraph (of its own, in a list item or a quote): where it runs in the text, to the
    end of its last line."""

    start: int
    end: int


_ITEM_START = re.compile(r"^[ \t]*(?:>[ \t]?)*[ \t]*(?:(?:[-*+]|\d{1,9}[.)])(?:[ \t]+|$))?")
_LINE_START = re.compile(r"^[ \t]*(?:>[ \t]?)*[ \t]*")


def prose_units(text: str) -> tuple[list[_Unit], list[_Sentence]]:
    """The paragraphs of `text`'s prose (CommonMark's, at any depth: list items and quotes
    included; not headings, code or HTML) and their sentences that have words enough to state
    something. A sentence's offsets leave out the list marker or quote marks before it."""
    starts = line_starts(text)
    units: list[_Unit] = []
    sentences: list[_Sentence] = []
    stack: list[Token] = []
    for tok in _PARSER.parse(text):
        if tok.nesting == 1:
            stack.append(tok)
        elif tok.nesting == -1 and stack:
            stack.pop()
        if tok.type != "paragraph_open" or tok.map is None:
            continue
        first, last = tok.map[0], min(tok.map[1], len(starts) - 1)
        parent = stack[-2] if len(stack) > 1 else None
        item_first = (parent is not None and parent.type == "list_item_open"
                      and parent.map is not None and parent.map[0] == first)
        masked = []
        for k in range(first, last):
            line = text[starts[k]:starts[k + 1]]
            prefix = (_ITEM_START if k == first and item_first else _LINE_START).match(line)
            cut = prefix.end() if prefix else 0
            masked.append(" " * cut + line[cut:])
        base = starts[first]
        body = "".join(masked)
        unit = len(units)
        units.append(_Unit(base, base + len(body.rstrip("\r\n"))))
        for s, e in sentence_spans(body):
            if len(body[s:e].split()) >= MIN_FACTUAL_WORDS:
                sentences.append(_Sentence(base + s, base + e, unit))
    return units, sentences


def factual_sentences(text: str) -> list[_Sentence]:
    """The factual sentences of `text`'s prose (`prose_units`)."""
    return prose_units(text)[1]


def _own_markers(units: Sequence[_Unit], sentences: Sequence[_Sentence],
                 markers: Sequence[WriterMarker]) -> tuple[list[list[str]], int]:
    """The refs each sentence carries, and how many refs belong to none. A marker belongs to
    its paragraph — the one it stands in, or ends the last line of, or stands alone on the
    line after — and there to the last factual sentence that starts at or before it, else the
    first (a marker that opens a paragraph). A marker by a heading or code belongs to none."""
    own: list[list[str]] = [[] for _ in sentences]
    by_unit: dict[int, list[int]] = {}
    for i, s in enumerate(sentences):
        by_unit.setdefault(s.unit, []).append(i)
    starts_in = {u: [sentences[i].start for i in members] for u, members in by_unit.items()}
    unit_starts = [u.start for u in units]
    unplaced = 0
    for marker in markers:
        u = bisect.bisect_right(unit_starts, marker.offset) - 1
        members = by_unit.get(u, []) if u >= 0 and marker.offset <= units[u].end + 1 else []
        if not members:
            unplaced += len(marker.refs)
            continue
        at = bisect.bisect_right(starts_in[u], marker.offset) - 1
        own[members[max(at, 0)]].extend(marker.refs)
    return own, unplaced


class Citer:
    """Cites one window's text against the facts it was given.

    Built once per window: a stream asks `cite` again on every longer prefix, and a sentence's
    embedding is computed only the first time its text is seen."""

    def __init__(self, given: Sequence[GivenFact], fact_vectors: np.ndarray, encode: Encode,
                 threshold: float = SUPPORT_THRESHOLD) -> None:
        self.given = list(given)
        self.by_ref = {g.ref: j for j, g in enumerate(self.given)}
        self.fact_vectors = np.asarray(fact_vectors, dtype=np.float32).reshape(
            len(self.given), -1) if len(self.given) else np.zeros((0, 1), np.float32)
        self.fact_words = [content_words(g.content) for g in self.given]
        self.fact_negations = [negations(g.content) for g in self.given]
        self.encode = encode
        self.threshold = float(np.float32(threshold))  # as the float32 scores compare
        self._vectors: dict[str, np.ndarray] = {}

    def _sentence_vectors(self, texts: list[str]) -> np.ndarray:
        missing = [t for t in dict.fromkeys(texts) if t not in self._vectors]
        if missing:
            vecs = np.asarray(self.encode(missing), dtype=np.float32)
            self._vectors.update(zip(missing, vecs, strict=True))
        dim = self.fact_vectors.shape[1]
        return (np.stack([self._vectors[t] for t in texts]) if texts
                else np.zeros((0, dim), np.float32))

    def cite(self, text: str) -> tuple[str, WindowCitations]:
        """`text` without the writer's markers, and its citations (`WindowCitations`)."""
        clean, markers = take_writer_markers(text, self.by_ref)
        units, sentences = prose_units(clean)
        result = WindowCitations(written=sum(len(m.refs) for m in markers),
                                 beyond=max(len(sentences) - MAX_SENTENCES, 0))
        sentences = sentences[:MAX_SENTENCES]
        owned, result.unplaced = _own_markers(units, sentences, markers)
        given_refs = [[r for r in refs if r in self.by_ref] for refs in owned]
        result.invalid = sum(len(m.refs) for m in markers) - sum(
            1 for m in markers for r in m.refs if r in self.by_ref)
        if not sentences:
            return clean, result
        if not self.given:
            result.sentences = [SentenceCitation(s.start, s.end, (), (), UNSUPPORTED, s.unit)
                                for s in sentences]
            return clean, result
        texts = [clean[s.start:s.end] for s in sentences]
        inherited = _inherit(sentences, given_refs)
        wanted_of = [[self.by_ref[r] for r in dict.fromkeys(refs)] for refs in inherited]
        words = [content_words(t) for t in texts]
        lexical = lexical_support(words, self.fact_words)
        # Embedded only where the words do not settle it: a sentence that quotes every fact it
        # cites, or cites none and quotes one, is decided by its words alone.
        sure = lexical_sure(lexical, words, [negations(t) for t in texts], self.fact_negations)
        scores = lexical_scores(lexical, sure)
        unsettled = [i for i, wanted in enumerate(wanted_of)
                     if not (sure[i, wanted].all() if wanted else sure[i].any())]
        if unsettled:
            scores[unsettled] = support_scores(
                lexical[unsettled], self._sentence_vectors([texts[i] for i in unsettled]),
                self.fact_vectors, sure[unsettled])
        for i, s in enumerate(sentences):
            wanted = wanted_of[i]
            kept = sorted((j for j in wanted if scores[i, j] >= self.threshold),
                          key=lambda j: -scores[i, j])[:MAX_PER_SENTENCE]
            own = {self.by_ref[r] for r in given_refs[i]}
            result.dropped += len(own - set(kept))
            status = CITED
            if not kept:
                best = int(np.argmax(scores[i]))
                if scores[i, best] >= self.threshold:
                    kept, status = [best], REPAIRED
                else:
                    status = UNSUPPORTED
            result.sentences.append(SentenceCitation(
                s.start, s.end, tuple(self.given[j].fact_id for j in kept),
                tuple(float(scores[i, j]) for j in kept), status, s.unit))
        return clean, result


def _inherit(sentences: Sequence[_Sentence], own: list[list[str]]) -> list[list[str]]:
    """Each sentence's refs: its own, else those of the next sentence of its paragraph that
    has some (a paragraph cited once, at its end)."""
    out = [list(refs) for refs in own]
    following: list[str] = []
    for i in range(len(sentences) - 1, -1, -1):
        if i + 1 < len(sentences) and sentences[i + 1].unit != sentences[i].unit:
            following = []
        if out[i]:
            following = out[i]
        else:
            out[i] = list(following)
    return out


def number_facts(numbers: Mapping[str, int], order: Sequence[str]) -> dict[str, int]:
    """`numbers` (fact id → its number in the document) with each fact of `order` not yet
    numbered given the next number, in order: numbering by first citation, stable for a
    resumed session since the numbers so far are part of its state."""
    out = dict(numbers)
    for fact_id in order:
        if fact_id not in out:
            out[fact_id] = len(out) + 1
    return out


@dataclass(frozen=True, slots=True)
class CitedSpan:
    """A run of sentences of the shown text (`start`:`end`, its marker excluded) and the
    numbers of the facts it rests on; the marker follows at `end`."""

    start: int
    end: int
    numbers: tuple[int, ...]
    facts: tuple[str, ...]


def cited_runs(citations: WindowCitations, numbers: Mapping[str, int]) -> list[CitedSpan]:
    """The runs of sentences of one paragraph or item that rest on the same facts, in the
    clean text's offsets, each with its facts' numbers (ascending): a run's marker goes at its
    end. The rule every face places markers by."""
    runs: list[CitedSpan] = []
    sents = citations.sentences
    run_start: int | None = None
    for i, s in enumerate(sents):
        if not s.facts:
            run_start = None
            continue
        if run_start is None:
            run_start = s.start
        nxt = sents[i + 1] if i + 1 < len(sents) else None
        if nxt is not None and nxt.unit == s.unit and set(nxt.facts) == set(s.facts):
            continue
        facts = tuple(sorted((f for f in s.facts if f in numbers), key=lambda f: numbers[f]))
        runs.append(CitedSpan(run_start, s.end, tuple(numbers[f] for f in facts), facts))
        run_start = None
    return runs


def rendered_spans(clean: str, citations: WindowCitations, numbers: Mapping[str, int],
                   style: str) -> tuple[str, list[CitedSpan]]:
    """The window's text as the reader sees it — a marker of the facts' numbers after each
    cited run (`cited_runs`) — and where each run is in it (the gateway's annotations)."""
    runs = cited_runs(citations, numbers)
    shown = render_markers(clean, [(r.end, r.numbers) for r in runs], style)
    spans: list[CitedSpan] = []
    shift = 0
    for r in sorted(runs, key=lambda r: r.end):
        spans.append(CitedSpan(r.start + shift, r.end + shift, r.numbers, r.facts))
        shift += len(marker_text(r.numbers, style))
    return shown, spans


def rendered(clean: str, citations: WindowCitations, numbers: Mapping[str, int], style: str
             ) -> str:
    """The window's text as the reader sees it (`rendered_spans`)."""
    return rendered_spans(clean, citations, numbers, style)[0]
