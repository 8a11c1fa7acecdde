"""What a report shows, derived from a trace alone (docs/design.md §4 "Contracts other code
relies on"), so that any trace — from `cdr generate --trace`, the demo, or the gateway's session
view — can be reported on later, without the CKF or the embedding model that produced it."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cdr.errors import InvalidInputError
from cdr.ngrams import NGRAM_SIZE
from cdr.ranking import DEFAULT_RANKING, RANKING_MODES
from cdr.report.quality import cwr6, fact_reuse
from cdr.session import COMPLETION_THRESHOLD, EXHAUSTION_RATIO, SAFETY_BUDGET_FLOOR
from cdr.window.dpe import split_paragraphs
from cdr.window.fit import MIN_SECTION_WORDS  # a thin window's end (`grounds_words`)
from cdr.window.stale import STALE_SHARE  # the stale stop's end (`sent_before`)

_WORD = re.compile(r"\w+")
# The exits' thresholds (docs/design.md §3 "Answers to the spec's open questions"), used here
# only to explain an exit.
COMPLETENESS_EXIT = COMPLETION_THRESHOLD
SAFETY_FLOOR = SAFETY_BUDGET_FLOOR


@dataclass
class Paragraph:
    """One paragraph of a window's text: the heading above it, its text cut into
    (segment, repeated?) runs, and the sub-query Stage 8 credited (None: none, or unknown)."""

    heading: str | None
    segments: list[tuple[str, bool]]
    sub_query: str | None
    repeated_words: int
    words: int


@dataclass
class WindowView:
    number: int
    record: Mapping[str, Any]
    completeness: float
    depth: dict[str, float]  # cumulative per sub-query after this window, capped at 1
    added: dict[str, float]  # this window's depth per sub-query
    coverage_score: float | None
    guard_activations: int | None
    cwr6: float
    reuse: float
    mean_novelty_ratio: float | None
    paragraphs: list[Paragraph]
    has_attribution: bool
    seen_before: dict[str, int] = field(default_factory=dict)  # fact id -> first window


@dataclass
class RunView:
    """One trace, with every per-window series the charts and tables need."""

    label: str
    trace: Mapping[str, Any]
    windows: list[WindowView]

    @property
    def sub_queries(self) -> list[Mapping[str, Any]]:
        return list(self.trace["sub_queries"])

    @property
    def status(self) -> str:
        return str(self.trace.get("status", "in-progress"))

    def later_mean(self, attr: str) -> float | None:
        """Mean of a per-window value over windows 2+ (window 1 has nothing to repeat)."""
        vals = [getattr(w, attr) for w in self.windows[1:]]
        return sum(vals) / len(vals) if vals else None

    @property
    def distinct_facts(self) -> int:
        return len({f["fact_id"] for w in self.windows for f in w.record["envelope"]})


def check_trace(trace: Any, name: str = "trace") -> Mapping[str, Any]:
    """The fields a report reads, with a message naming what is missing."""
    if not isinstance(trace, Mapping):
        raise InvalidInputError(f"{name} is not a JSON object (expected a cdr trace)")
    for key in ("task", "sub_queries", "windows"):
        if key not in trace:
            raise InvalidInputError(f"{name} has no {key!r} field: not a cdr trace "
                                    "(write one with `cdr generate --trace FILE`)")
    ranking = trace.get("ranking", DEFAULT_RANKING)
    if not isinstance(ranking, str) or ranking not in RANKING_MODES:
        shown = ranking[:40] if isinstance(ranking, str) else type(ranking).__name__
        raise InvalidInputError(f"{name}: 'ranking' must be one of {', '.join(RANKING_MODES)}; "
                                f"got {shown!r}")
    for i, w in enumerate(trace["windows"]):
        if not isinstance(w, Mapping):
            raise InvalidInputError(f"{name}: window {i + 1} is not an object")
        for key in ("number", "envelope", "output", "addressed", "completeness", "headers"):
            if key not in w:
                raise InvalidInputError(f"{name}: window {i + 1} has no {key!r} field")
    return trace


def _ngrams(tokens: Sequence[str]) -> set[tuple[str, ...]]:
    return {tuple(tokens[i:i + NGRAM_SIZE]) for i in range(len(tokens) - NGRAM_SIZE + 1)}


def mark_repeats(text: str, seen: set[tuple[str, ...]]) -> tuple[list[tuple[str, bool]], int]:
    """`text` cut into runs, each flagged when its words belong to a 6-gram already in `seen`
    (the tokenizer of docs/design.md §3.1 "Tokenizer for n-grams"), and the number of flagged
    words. The runs concatenate back to `text` exactly."""
    matches = list(_WORD.finditer(text))
    tokens = [m.group(0).lower() for m in matches]
    marked = [False] * len(tokens)
    for i in range(len(tokens) - NGRAM_SIZE + 1):
        if tuple(tokens[i:i + NGRAM_SIZE]) in seen:
            for k in range(i, i + NGRAM_SIZE):
                marked[k] = True
    segments: list[tuple[str, bool]] = []
    pos = 0
    i = 0
    while i < len(tokens):
        if not marked[i]:
            i += 1
            continue
        j = i
        while j + 1 < len(tokens) and marked[j + 1]:
            j += 1
        start, end = matches[i].start(), matches[j].end()
        if start > pos:
            segments.append((text[pos:start], False))
        segments.append((text[start:end], True))
        pos = end
        i = j + 1
    if pos < len(text):
        segments.append((text[pos:], False))
    return segments, sum(marked)


def _float(value: Any) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def build_run(trace: Mapping[str, Any], label: str) -> RunView:
    trace = check_trace(trace, label)
    records = list(trace["windows"])
    ids = [str(sq["id"]) for sq in trace["sub_queries"]]
    repeats = cwr6([str(w["output"]) for w in records])
    reuse = fact_reuse([[f["fact_id"] for f in w["envelope"]] for w in records])
    cumulative = dict.fromkeys(ids, 0.0)
    seen: set[tuple[str, ...]] = set()
    first_window: dict[str, int] = {}
    views = []
    for w, rep, ru in zip(records, repeats, reuse, strict=True):
        added = {str(a["id"]): float(a["depth"]) for a in w["addressed"]}
        for k, v in added.items():
            cumulative[k] = min(cumulative.get(k, 0.0) + v, 1.0)
        attribution = w.get("attribution")
        paragraphs = []
        for p, (heading, body) in enumerate(split_paragraphs(str(w["output"]))):
            segments, rep_words = mark_repeats(body, seen)
            sq = attribution[p] if attribution is not None and p < len(attribution) else None
            paragraphs.append(Paragraph(heading, segments, sq, rep_words,
                                        len(_WORD.findall(body))))
        env = w["envelope"]
        ratios = [float(f["novelty"]) * (1.0 - float(f["ngram_penalty"])) for f in env]
        headers = w["headers"]
        guard = _float(headers.get("CRP-Context-NGram-Guard-Activations"))
        views.append(WindowView(
            number=int(w["number"]), record=w, completeness=float(w["completeness"]),
            depth=dict(cumulative), added=added,
            coverage_score=_float(headers.get("CRP-Context-Coverage-Score")),
            guard_activations=None if guard is None else int(guard),
            cwr6=rep, reuse=ru,
            mean_novelty_ratio=sum(ratios) / len(ratios) if ratios else None,
            paragraphs=paragraphs, has_attribution=attribution is not None,
            seen_before={f["fact_id"]: first_window[f["fact_id"]] for f in env
                         if f["fact_id"] in first_window},
        ))
        for f in env:
            first_window.setdefault(f["fact_id"], int(w["number"]))
        seen |= _ngrams([t.lower() for t in _WORD.findall(str(w["output"]))])
    return RunView(label, trace, views)


def length_sentence(run: RunView) -> str:
    """The sentence after the exit's, from the trace's optional `length` field: the words
    written of those asked, and the length score; empty for a trace without the field."""
    length = run.trace.get("length")
    if not isinstance(length, dict):
        return ""
    try:
        asked, delivered = int(length["asked"]), int(length["delivered"])
        score = float(length["score"])
    except (KeyError, TypeError, ValueError):
        return ""
    return (f" It wrote {delivered} of the {asked} words asked ({delivered / max(asked, 1):.0%}; "
            f"LongBench-Write length score {score:.1f}).")


def explain_exit(run: RunView) -> str:
    """The exit reason in one sentence a newcomer can read."""
    status = run.status
    n = len(run.windows)
    last = run.windows[-1] if run.windows else None
    c = last.completeness if last else 0.0
    names = {str(sq["id"]): str(sq["text"]) for sq in run.sub_queries}
    still_open = [names.get(i, i) for i in (last.record.get("residual", []) if last else [])]
    if status == "task-complete":
        return (f"Stopped after window {n} because the task was done (Exit 1): completeness "
                f"reached {c:.2f} (at least {COMPLETENESS_EXIT}) and every sub-query was "
                "covered deeply enough to leave the Residual Set.")
    if status == "limit-reached":
        open_txt = f"; still open: {', '.join(still_open)}" if still_open else ""
        limit = run.trace.get("max_windows", n)
        return (f"Stopped after window {n} because the window limit ({limit}) was reached "
                f"(Exit 2) with completeness {c:.2f}{open_txt}.")
    if status == "ckf-exhausted":
        if last is None or not last.record["envelope"]:
            return (f"Stopped at window {n} because the knowledge base had no fact left that "
                    "is both relevant to the task and new to the document (Exit 3); ingest "
                    "more documents to go on.")
        grounds = last.record.get("grounds_words")
        if not last.record.get("output") and grounds is not None and grounds < MIN_SECTION_WORDS:
            k = len(last.record["envelope"])
            return (f"Stopped at window {n} without writing it: its envelope ({k} "
                    f"fact{'s' if k != 1 else ''}) could ground about {grounds} words, less "
                    f"than a minimal section ({MIN_SECTION_WORDS}), so the task's material had "
                    "run out (Exit 3). Ingest more documents to go on.")
        sent = last.record.get("sent_before")
        if not last.record.get("output") and sent is not None and sent >= STALE_SHARE:
            return (f"Stopped at window {n} without writing it: {sent:.0%} of its envelope had "
                    "already been sent to earlier windows, and nothing never sent was left "
                    "(the stale stop, Exit 3). Ingest more documents to go on.")
        return (f"Stopped after window {n} because the envelope's facts were mostly "
                f"already covered (mean novelty ratio {last.mean_novelty_ratio:.2f}, below "
                f"{EXHAUSTION_RATIO}; Exit 3): another window would have repeated itself. "
                "Ingest more documents to go on.")
    if status == "safety-budget-depleted":
        return (f"Stopped after window {n} because the safety budget fell to {SAFETY_FLOOR} "
                "or below (Exit 4).")
    if status == "upstream-error":
        err = next((w.record.get("error") for w in reversed(run.windows)
                    if w.record.get("error")), None)
        return (f"Stopped in window {n} because the writer failed"
                + (f": {err}" if err else "") + ". The text received before the failure "
                "was kept.")
    if status == "cancelled":
        return (f"Stopped after window {n}: the client disconnected, so the gateway wrote no "
                "more windows.")
    if status == "in-progress":
        return f"Still running: {n} window{'s' if n != 1 else ''} so far."
    return f"Ended with status {status!r} after {n} windows."
