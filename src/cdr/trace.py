"""The trace JSON of a run (docs/design.md §4 "Contracts other code relies on"): the contract
`--trace` files and the gateway's session view share. `TRACE_SCHEMA` is its JSON Schema; tests
validate traces against it.

The gateway's session trace is `trace_document` plus the session id, completeness and window
limit; the sidecar's envelope facts are `packed_facts` plus the reference and text."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from cdr.citations import SENTENCE_STATUSES
from cdr.options import OPTION_CHOICES
from cdr.ranking import RANKING_MODES
from cdr.session import RUN_STATUSES, Session
from cdr.window.length import run_length
from cdr.window.spread import documents_per_window
from cdr.window.stale import sent_before_per_window

if TYPE_CHECKING:
    from cdr.window.loop import PreparedWindow, WindowEvent


def packed_facts(prepared: PreparedWindow) -> list[dict[str, Any]]:
    """Each packed fact with its ranking numbers, in layout order (and its fact-memory
    weight when the session remembers facts: an optional field)."""
    env = prepared.envelope
    r = env.ranking
    facts = [
        {
            "fact_id": fid,
            "source": fact.source,
            "section": fact.section,
            "relevance": round(float(r.relevance[i]), 4),
            "novelty": round(float(r.novelty[i]), 4),
            "residual_pull": round(float(r.residual_pull[i]), 4),
            "ngram_penalty": round(float(r.ngram_penalty[i]), 4),
            "score": round(float(r.score[i]), 4),
            "tokens": int(env.tokens[i]),
        }
        for i, (fid, fact) in enumerate(zip(env.fact_ids, prepared.facts, strict=True))
    ]
    if r.memory is not None:
        for i, f in enumerate(facts):
            f["memory"] = round(float(r.memory[i]), 4)
    return facts


def window_record(event: WindowEvent) -> dict[str, Any]:
    record: dict[str, Any] = {
        "number": event.number,
        "envelope": packed_facts(event.prepared),
        "output": event.output,
        "addressed": event.report.addressed_sub_queries,
        "completeness": round(event.completeness, 4),
        "residual": list(event.residual),
        "headers": dict(event.headers),
        # Optional (readers must not require it): the sub-query Stage 8 credited with each
        # paragraph of `output` (as `cdr.window.dpe.split_paragraphs` cuts it), or null for none.
        "attribution": list(event.report.attribution),
    }
    if event.error:
        record["error"] = event.error
    if event.dropped:  # optional: what `repeats: "drop"` took out of the writer's text
        record["dropped"] = list(event.dropped)
    if event.prepared.grounds_words is not None:
        # optional: the words the envelope can ground (the length contract with a model
        # writer, `cdr.window.length.grounded_words`); below a minimal section the window is
        # not written and the run ends ckf-exhausted
        record["grounds_words"] = int(event.prepared.grounds_words)
    if event.citations is not None:
        # optional: `citations` on (cdr.citations): each factual sentence of `output` (by its
        # offsets there) with the facts it cites, their numbers in the document, their
        # support, and whether the writer's citation stood, was repaired or none supports it
        record["citations"] = event.citations.to_dict()
    if event.prepared.resume is not None and event.output.strip():
        # optional: `resume: "prefill"` began the window's answer with its first section's
        # heading and last words (cdr.window.resume)
        record["resumed"] = True
    return record


def trace_document(session: Session, windows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The trace of `session` with its windows' records (`window_record`) as stored; the
    session's opt-in options (`cdr.options`) appear only when one is on. With the optional
    `length` (`cdr.window.length`): the words asked (the sub-queries' expected words, which
    split `--words` exactly), the words the windows delivered, their ratio, LongBench-Write's
    length score and whether it is within ±15% — so the gateway's session view says as much
    about a run's length as the CLI's trace."""
    # Optional per window (readers must not require it): the share of its envelope that an
    # earlier window was already sent (`cdr.window.stale`), null for an empty envelope. Exit 3 does
    # not see an unwritten fact sent again; this shows it, whatever the options.
    shares = sent_before_per_window([[f["fact_id"] for f in w.get("envelope", ())]
                                     for w in windows])
    doc: dict[str, Any] = {
        "task": session.task,
        "embedding_model": session.model_id,
        "ranking": session.ranking,
        "sub_queries": [sq.to_dict() for sq in session.sub_queries],
        # Optional per window: the documents sent so far and each one's share of the facts
        # sent so far (`cdr.window.spread`).
        "windows": [{**w, "sent_before": None if s is None else round(s, 4), "documents": d}
                    for w, s, d in zip(windows, shares, documents_per_window(windows),
                                       strict=True)],
        "status": session.status,
    }
    doc["length"] = run_length([sq.expected_words for sq in session.sub_queries],
                               [str(w.get("output", "")) for w in windows]).to_dict()
    if not session.options.is_default:
        doc["options"] = session.options.to_dict()
    if session.cited_sources:  # optional: the sources list of a citing run, by number
        doc["sources"] = [e.to_dict() for e in session.cited_sources]
    return doc


def build_trace(session: Session, events: Sequence[WindowEvent]) -> dict[str, Any]:
    """The run's trace (`trace_document`) from its window events."""
    return trace_document(session, [window_record(e) for e in events])


_NUM = {"type": "number"}
_COUNT = {"type": "integer", "minimum": 0}
_CITATIONS: dict[str, Any] = {
    "type": "object",
    "required": ["sentences", "factual", "cited", "unsupported", "invalid"],
    "properties": {
        "sentences": {"type": "array", "items": {
            "type": "object", "required": ["start", "end", "facts", "numbers", "support",
                                           "status"],
            "properties": {
                "start": _COUNT, "end": _COUNT, "paragraph": _COUNT,
                "facts": {"type": "array", "items": {"type": "string"}},
                "numbers": {"type": "array", "items": {"type": "integer", "minimum": 1}},
                "support": {"type": "array",
                            "items": {"type": "number", "minimum": 0, "maximum": 1}},
                "status": {"enum": list(SENTENCE_STATUSES)}}}},
        "factual": _COUNT, "cited": _COUNT, "unsupported": _COUNT, "invalid": _COUNT,
        "dropped": _COUNT, "written": _COUNT, "unplaced": _COUNT, "beyond": _COUNT,
        "cited_share": {"type": ["number", "null"], "minimum": 0, "maximum": 1}}}
TRACE_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "required": ["task", "embedding_model", "ranking", "sub_queries", "windows", "status"],
    "properties": {
        "task": {"type": "string", "minLength": 1},
        "embedding_model": {"type": "string", "minLength": 1},
        "ranking": {"enum": list(RANKING_MODES)},
        "sub_queries": {"type": "array", "minItems": 1, "items": {
            "type": "object", "required": ["id", "text", "expected_words"],
            "properties": {"id": {"type": "string"}, "text": {"type": "string"},
                           "expected_words": {"type": "integer", "minimum": 1}}}},
        "windows": {"type": "array", "items": {
            "type": "object",
            "required": ["number", "envelope", "output", "addressed", "completeness",
                         "residual", "headers"],
            "properties": {
                "number": {"type": "integer", "minimum": 1},
                "envelope": {"type": "array", "items": {
                    "type": "object",
                    "required": ["fact_id", "source", "section", "relevance", "novelty",
                                 "residual_pull", "ngram_penalty", "score", "tokens"],
                    "properties": {
                        "fact_id": {"type": "string"}, "source": {"type": "string"},
                        "section": {"type": "string"}, "relevance": _NUM,
                        "novelty": {"type": "number", "minimum": 0.2, "maximum": 1.0},
                        "residual_pull": _NUM,
                        "ngram_penalty": {"type": "number", "minimum": 0, "maximum": 0.8},
                        "score": _NUM, "tokens": {"type": "integer", "minimum": 1},
                        "memory": {"type": "number", "minimum": 0, "maximum": 1}}}},
                "output": {"type": "string"},
                "addressed": {"type": "array", "items": {
                    "type": "object", "required": ["id", "depth"],
                    "properties": {"id": {"type": "string"},
                                   "depth": {"type": "number", "minimum": 0, "maximum": 1}}}},
                "completeness": {"type": "number", "minimum": 0, "maximum": 1},
                "residual": {"type": "array", "items": {"type": "string"}},
                "headers": {"type": "object", "additionalProperties": {"type": "string"},
                            "required": ["CRP-Context-Coverage-Score",
                                         "CRP-Context-Coverage-Depth",
                                         "CRP-Context-NGram-Guard-Activations",
                                         "CRP-Context-Continuation-Status"]},
                "error": {"type": "string"},
                "dropped": {"type": "array", "items": {"type": "string"}},
                "grounds_words": {"type": "integer", "minimum": 0},
                "resumed": {"type": "boolean"},
                "sent_before": {"type": ["number", "null"], "minimum": 0, "maximum": 1},
                "documents": {"type": "object", "required": ["sent", "new", "shares"],
                              "properties": {
                                  "sent": {"type": "integer", "minimum": 0},
                                  "new": {"type": "integer", "minimum": 0},
                                  "shares": {"type": "object", "additionalProperties": {
                                      "type": "number", "minimum": 0, "maximum": 1}}}},
                "attribution": {"type": "array",
                                "items": {"type": ["string", "null"]}},
                "citations": _CITATIONS,
            }}},
        "status": {"enum": list(RUN_STATUSES)},
        "length": {"type": "object", "required": ["asked", "delivered", "score"],
                   "properties": {
                       "asked": {"type": "integer", "minimum": 1},
                       "delivered": {"type": "integer", "minimum": 0},
                       "ratio": {"type": "number", "minimum": 0},
                       "score": {"type": "number", "minimum": 0, "maximum": 100},
                       "within_tolerance": {"type": "boolean"}}},
        "sources": {"type": "array", "items": {
            "type": "object", "required": ["number", "fact_id", "source", "section", "title"],
            "properties": {"number": {"type": "integer", "minimum": 1},
                           "fact_id": {"type": "string"}, "source": {"type": "string"},
                           "section": {"type": "string"}, "title": {"type": "string"},
                           "excerpt": {"type": "string"}}}},
        "options": {"type": "object", "additionalProperties": False, "properties": {
            name: {"enum": list(choices)} for name, choices in OPTION_CHOICES.items()}},
    },
}
