"""One CDR session handed out window by window, for a framework's retriever: the next
window's envelope on each call, then what the model wrote from it recorded (DPE Stage 8,
the session's update, the exit rules). Framework-neutral: the Haystack component is this
plus its Documents."""

from __future__ import annotations

from typing import Any

from cdr.errors import InvalidInputError
from cdr.session import IN_PROGRESS, Session
from cdr.trace import build_trace
from cdr.window.loop import Generator, PreparedWindow, WindowEvent

# The CDR score components a retriever hands out with each fact.
SCORE_KEYS = ("relevance", "novelty", "residual_pull", "ngram_penalty", "score")


def envelope_facts(prepared: PreparedWindow) -> list[tuple[str, str, dict[str, Any]]]:
    """A prepared window's facts in envelope order, each (fact id, text, meta): `source`,
    `section`, `fact_id`, `ref` (F1, F2 … as the prompt cites them), `window`, `tokens` and
    the CDR score components — what a framework's Document carries."""
    env = prepared.envelope
    r = env.ranking
    out = []
    for i, (fid, fact) in enumerate(zip(env.fact_ids, prepared.facts, strict=True)):
        meta: dict[str, Any] = {"source": fact.source, "section": fact.section,
                                "fact_id": fid, "ref": f"F{i + 1}", "window": prepared.number,
                                "tokens": int(env.tokens[i])}
        meta.update({k: round(float(getattr(r, k)[i]), 4) for k in SCORE_KEYS})
        out.append((fid, fact.content, meta))
    return out


class WindowHandout:
    """The session of `generator` for `task` (or the first query), one envelope out at a
    time: `envelope(query)` hands out the next one (again, until it is recorded), `record`
    takes what was written from it."""

    def __init__(self, generator: Generator, task: str | None = None,
                 outline: str | None = None) -> None:
        self.generator = generator
        self.task, self.outline = task, outline
        self.session: Session | None = None
        self.prepared: PreparedWindow | None = None
        self.events: list[WindowEvent] = []

    @property
    def done(self) -> bool:
        return self.session is not None and self.session.status != IN_PROGRESS

    def envelope(self, query: str | None = None) -> PreparedWindow | None:
        """The envelope out (prepared now if none is); None once the session has ended —
        also when nothing relevant and novel is left, which ends it here (Exit 3)."""
        if self.session is None:
            task = self.task or query
            if not task or not task.strip():
                raise InvalidInputError("no task: pass task= or a non-empty query")
            self.session = self.generator.start(task, self.outline)
        if self.done:
            return None
        if self.prepared is None:
            self.prepared = self.generator.prepare(self.session)
            if len(self.prepared.envelope) == 0:
                self.record("")
                return None
        return self.prepared

    def record(self, text: str) -> WindowEvent:
        """Record what the model wrote from the envelope out."""
        if self.prepared is None or self.session is None:
            raise InvalidInputError("no envelope is out: ask for one before recording what "
                                    "the model wrote")
        event = self.generator.complete(self.session, self.prepared, text)
        self.prepared = None
        self.events.append(event)
        return event

    def trace(self) -> dict[str, Any]:
        if self.session is None:
            raise InvalidInputError("no session yet: ask for an envelope first")
        return build_trace(self.session, self.events)
