"""The sidecar API: the client calls its own LLM; the gateway runs everything else.

    POST /v1/sessions                 task (+ outline)         -> id, token
    POST /v1/sessions/{id}/envelope   token                    -> facts, anchor, messages
    POST /v1/sessions/{id}/windows    token, the window's text -> DPE report, exit decision
    GET  /v1/sessions/{id}            token                    -> trace
    DELETE /v1/sessions/{id}          token

Concurrency: every state change is read → compute → compare-and-set on the stored version.
The compute step (packing, DPE embedding) runs outside any lock; if another request changed
the session meanwhile, the CAS fails and the whole step is redone from the new state — where
the token check then answers 409 if that other request finished this window first. Two
requests with one token for one window: exactly one wins. No LLM is ever called in here.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from cdr.citations.sources import SourceEntry
from cdr.gateway.app_state import (
    SESSION_ID_HEADER,
    SET_TOKEN_HEADER,
    Gateway,
    session_headers,
)
from cdr.gateway.auth import ApiKey
from cdr.gateway.citations_out import public_entries
from cdr.gateway.errors import ApiError
from cdr.gateway.paths import public_sources
from cdr.gateway.replay import replay_submission, with_submission
from cdr.gateway.schemas import SessionCreate, WindowSubmit
from cdr.gateway.session_record import SessionRecord, derive, with_pending
from cdr.gateway.session_store import StoredSession, VersionConflictError
from cdr.gateway.session_token import StaleTokenError
from cdr.gateway.settings import DEFAULT_KB
from cdr.trace import packed_facts, window_record
from cdr.window.loop import PreparedWindow, WindowEvent
from cdr.writers.base import WriterResult

MAX_ATTEMPTS = 25

Response = tuple[dict[str, Any], dict[str, str]]


def _backoff(attempt: int) -> None:
    time.sleep(random.uniform(0, min(0.05, 0.001 * 2**attempt)))


def create_session(gw: Gateway, req: SessionCreate, caller: ApiKey | None) -> Response:
    """Start a session owned by `caller` (the API key's id is stored, never the key)."""
    index = gw.index()
    options = gw.options(req)
    session = gw.generator(index, options).start(req.task, req.outline_text())
    sid = gw.new_session_id()
    owner = caller.owner_id if caller is not None else None
    gw.store.create(sid, SessionRecord(session, mode="sidecar", options=options,
                                       owner=owner, kb=_kb(gw)).to_json())
    token = gw.issue(sid, session)
    body = {
        "session_id": sid, "token": token, "status": session.status,
        "embedding_model": session.model_id, "ranking": session.ranking,
        "max_windows": session.max_windows,
        "sub_queries": [q.to_dict() for q in session.sub_queries],
    }
    headers = session_headers(session, sid, token)
    body["headers"] = headers
    return body, headers


def _kb(gw: Gateway) -> str | None:
    """The KB name a new session stores: None for the default KB, as records always had."""
    return None if gw.name == DEFAULT_KB else gw.name


def _facts_out(prepared: PreparedWindow) -> list[dict[str, Any]]:
    """The trace's view of the packed facts, plus what the client's LLM needs: the prompt's
    reference (F1, F2, …) and the fact text."""
    return [{"ref": f"F{i + 1}", **public_sources(item), "content": fact.content}
            for i, (item, fact) in enumerate(zip(packed_facts(prepared), prepared.facts,
                                                 strict=True))]


@dataclass
class _Change:
    """What one attempt computed: the record after it, the JSON to store (None: nothing to
    store), and what the response needs."""

    record: SessionRecord
    data: str | None
    prepared: PreparedWindow
    event: WindowEvent | None


def _change(gw: Gateway, sid: str, token: str, caller: ApiKey | None, fresh: bool,
            compute: Callable[[Any, StoredSession, SessionRecord], _Change]) -> _Change:
    """read → `compute` → compare-and-set on the read version, redone from the new state when
    another request changed the session meanwhile (the token check then answers 409 if that
    request finished this window first). `fresh`: `compute` changes the record it is given."""
    for attempt in range(MAX_ATTEMPTS):
        index = gw.index(require_facts=False)
        stored, rec = gw.authorize(sid, token, index, caller=caller, fresh=fresh)
        gw.require_in_progress(sid, rec.session)
        change = compute(index, stored, rec)
        if change.data is not None:
            try:
                new = gw.store.cas(sid, stored.version, change.data)
            except VersionConflictError:
                _backoff(attempt)
                continue
            gw.sessions.put(sid, new.version, index, change.record)
        return change
    raise VersionConflictError(sid, stored.version, None)


def envelope(gw: Gateway, sid: str, token: str, caller: ApiKey | None) -> Response:
    """The next window's envelope. Idempotent while the session does not move: asking again
    returns the same envelope. An empty envelope (nothing relevant and novel left) ends the
    session as ckf-exhausted right here, so the client never asks its LLM for ungrounded text.
    """
    def compute(index: Any, stored: StoredSession, rec: SessionRecord) -> _Change:
        gen = gw.generator(index, rec.options)
        prepared = gen.prepare(rec.session)  # rec is shared: read only
        if gen.out_of_material(rec.session, prepared):
            rec = SessionRecord.from_json(stored.data, index.ngram_index)  # a private copy
            event = gen.close_if_empty(rec.session, prepared)
            assert event is not None
            rec.windows.append(window_record(event))
            rec.pending = None
            return _Change(rec, rec.to_json(), prepared, event)
        pending = prepared.to_dict()
        if rec.pending == pending:
            return _Change(rec, None, prepared, None)
        return _Change(derive(rec, pending=pending), with_pending(stored.data, pending),
                       prepared, None)

    change = _change(gw, sid, token, caller, False, compute)
    session, prepared, event = change.record.session, change.prepared, change.event
    new_token = gw.issue(sid, session)
    if event is not None:
        gw.window_finished(event)
        headers = session_headers(session, sid, new_token, event.headers)
    else:
        headers = {**prepared.headers(session), SESSION_ID_HEADER: sid, SET_TOKEN_HEADER: new_token}
    env = prepared.envelope
    body = {
        "session_id": sid, "window": prepared.number, "max_windows": session.max_windows,
        "anchor": env.anchor, "facts": _facts_out(prepared),
        "plan": [{"title": p.title, "target_words": p.target_words,
                  "fact_refs": list(p.fact_refs)} for p in prepared.plan],
        "messages": [] if event is not None else prepared.messages,
        "max_tokens": prepared.max_tokens, "etag": env.etag,
        "saturation": round(env.saturation, 4), "residual": list(session.residual_ids),
        "status": session.status, "done": event is not None, "token": new_token,
        "headers": headers,
    }
    return body, headers


def submit_window(gw: Gateway, sid: str, token: str, req: WindowSubmit,
                  caller: ApiKey | None) -> Response:
    """Verify the window's text (DPE Stage 8), update the session, apply the exit rules.
    A repeat of the last accepted submission with its (now stale) token gets the original
    answer and a current token (`cdr.gateway.replay`)."""
    bodies: list[dict[str, Any]] = []

    def compute(index: Any, stored: StoredSession, rec: SessionRecord) -> _Change:
        session = rec.session  # a private copy: changed below
        pending = rec.pending
        number = session.window_count + 1
        if pending is None or pending.get("number") != number:
            raise ApiError(409, f"no envelope is prepared for window {number} of session "
                           f"{sid!r}: POST /v1/sessions/{sid}/envelope first",
                           code="no_envelope",
                           headers=session_headers(session, sid))
        if req.etag is not None and req.etag != pending["etag"]:
            raise ApiError(409, f"etag {req.etag!r} is not the envelope prepared for window "
                           f"{number} ({pending['etag']!r}); fetch the envelope again",
                           code="etag_mismatch", headers=session_headers(session, sid))
        prepared = PreparedWindow.from_dict(pending)
        result = (None if req.finish_reason is None
                  else WriterResult(req.text, req.finish_reason, {}))
        event = gw.generator(index, rec.options).complete(session, prepared, req.text,
                                                           result=result)
        rec.windows.append(window_record(event))
        rec.pending = None
        body = _window_body(sid, event, session_headers(session, sid, None, event.headers),
                            session.cited_sources)
        bodies.append(body)
        return _Change(rec, with_submission(rec.to_json(), event.number, req, body), prepared,
                       event)

    try:
        change = _change(gw, sid, token, caller, True, compute)
    except StaleTokenError as exc:
        done = replay_submission(gw, sid, exc, req, gw.index(require_facts=False))
        if done is not None:
            return done
        raise
    session, event = change.record.session, change.event
    assert event is not None
    gw.window_finished(event)
    new_token = gw.issue(sid, session)
    body = bodies[-1]  # the attempt whose compare-and-set won
    headers = {**body["headers"], SET_TOKEN_HEADER: new_token}
    body.update(token=new_token, headers=headers)
    return body, headers


def _window_body(sid: str, event: WindowEvent, headers: dict[str, str],
                 sources: Sequence[SourceEntry]) -> dict[str, Any]:
    """The response to an accepted window, without its token (stored for replays); a citing
    session's carries the text as shown, its citations and the sources they number."""
    report = event.report
    cited: dict[str, Any] = {}
    if event.citations is not None:  # a citing session (cdr.window.cite)
        numbers = set(event.citations.numbers.values())
        cited = {"text": event.shown, "citations": event.citations.to_dict(),
                 "sources": public_entries([e for e in sources if e.number in numbers])}
    return {
        **cited,
        "session_id": sid, "window": event.number,
        "report": {"addressed": report.addressed_sub_queries, "words": dict(report.words),
                   "paragraphs": report.paragraphs,
                   "unattributed_words": report.unattributed_words},
        "completeness": round(event.completeness, 4), "residual": list(event.residual),
        "status": event.status, "done": event.done,
        "exit_reason": event.status if event.done else None, "token": None,
        "headers": headers,
    }


def trace(gw: Gateway, sid: str, token: str, caller: ApiKey | None) -> Response:
    """The trace, for a token of any window of the session (a read): the answer carries the
    current token, which is how a client that lost its place gets back in."""
    index = gw.kb.current()
    _, rec = gw.authorize(sid, token, index, caller=caller, current=False)
    last = rec.windows[-1]["headers"] if rec.windows else None
    headers = session_headers(rec.session, sid, gw.issue(sid, rec.session), last)
    return public_sources(rec.trace(sid)), headers


def delete(gw: Gateway, sid: str, token: str, caller: ApiKey | None) -> Response:
    index = gw.kb.current()
    gw.authorize(sid, token, index, caller=caller)
    gw.sessions.discard(sid)
    if not gw.store.delete(sid):
        raise ApiError(404, f"session {sid!r} does not exist (deleted concurrently)")
    return {"id": sid, "deleted": True}, {SESSION_ID_HEADER: sid}
