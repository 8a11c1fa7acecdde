"""The OpenAI-compatible relay: one chat completion = one CDR session run to its exit.

The last user message is the task; the gateway plans sub-queries, writes every window with
its own writer (extractive, or the upstream LLM) and returns the assembled document. Each
window is stored as soon as it is written (compare-and-set on the version this run wrote
last), so a failed or abandoned run keeps what it did: its trace stays readable with the
token the response carries. The LLM is called outside any store operation.

The assembled document is the windows' texts, each stripped, joined by a blank line. A
stream sends exactly the same characters (`DocumentText`), window by window as they are
written, so concatenating the deltas of a stream gives the non-streamed content.

Empty CKF: with an LLM writer the request is passed through to the LLM unchanged, answered
with `CRP-Context-Mode: safety-only` and the onboarding hint (nothing to ground it in, but the
client still gets an answer); the extractive writer has nothing to write from, so that is a
409 carrying the same headers.
"""

from __future__ import annotations

import functools
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

from cdr.citations.attribute import CitedSpan
from cdr.errors import UpstreamError
from cdr.gateway.app_state import Gateway, session_headers
from cdr.gateway.citations_out import citation_list, message_annotations, public_entries
from cdr.gateway.errors import ApiError, from_cdr_error
from cdr.gateway.redact import upstream_summary
from cdr.gateway.schemas import ChatCompletionRequest
from cdr.gateway.session_record import SessionRecord
from cdr.gateway.settings import DEFAULT_KB
from cdr.session import CANCELLED, IN_PROGRESS, LIMIT_REACHED
from cdr.text.kept_stream import KeptStream
from cdr.trace import window_record
from cdr.window.cite import shown_outputs, stored_citations, window_spans
from cdr.window.envelope import DEFAULT_GENERATION_TOKENS
from cdr.window.headers import SAFETY_ONLY_HEADERS
from cdr.window.loop import EmptyKnowledgeBaseError, WindowEvent
from cdr.writers.base import pastes_facts, sum_usage

DeltaSink = Callable[[int, str], None]


class DocumentText:
    """Per-window deltas → the pieces of the assembled document: each window's text stripped,
    windows joined by a blank line. Leading whitespace of a window is dropped, trailing
    whitespace held back until more text shows it was inner whitespace."""

    SEPARATOR = "\n\n"

    def __init__(self, after_text: bool = False) -> None:
        """`after_text`: the document already has text (a resumed stream goes on after the
        windows it replayed), so the next window's text begins with the separator."""
        self._window: int | None = None
        self._started = False
        self._held = ""
        self._any = after_text

    def feed(self, window: int, piece: str) -> str:
        if window != self._window:
            self._window, self._started, self._held = window, False, ""
        prefix = ""
        if not self._started:
            piece = piece.lstrip()
            if not piece:
                return ""
            self._started = True
            prefix = self.SEPARATOR if self._any else ""
            self._any = True
        body = piece.rstrip()
        if not body:
            self._held += piece
            return ""
        out = prefix + self._held + body
        self._held = piece[len(body):]
        return out


def assemble(outputs: list[str]) -> str:
    """The document `DocumentText` streams, from the windows' texts."""
    return DocumentText.SEPARATOR.join(t.strip() for t in outputs if t.strip())


def _passthrough_messages(req: ChatCompletionRequest) -> list[dict[str, str]]:
    out = []
    for m in req.messages:
        role = {"developer": "system"}.get(m.role, m.role)
        text = m.text()
        if role in ("system", "user", "assistant") and text.strip():
            out.append({"role": role, "content": text})
    return out


class ChatRun:
    """One `/v1/chat/completions` request. `start` and `run` block (call them off the event
    loop); `run` yields each finished window."""

    def __init__(self, gw: Gateway, req: ChatCompletionRequest,
                 owner: str | None = None) -> None:
        task = req.task()
        if task is None or not task.strip():
            raise ApiError(422, "messages has no user message with text: the last user message "
                           "is the task to write", param="messages", code="invalid_fields")
        self.gw = gw
        self.req = req
        self.owner = owner  # the API key's owner id, stored with the session
        self.task = task
        self.options = gw.options(req.crp)
        self.outline = req.crp.outline_text() if req.crp is not None else None
        self.model = req.model
        self.id = f"chatcmpl-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.events: list[WindowEvent] = []
        self.passthrough = False
        self.passthrough_text = ""
        self.passthrough_usage: dict[str, int] = {}
        self.sid: str | None = None
        self.record: SessionRecord | None = None
        self.version = 0
        # The texts of windows stored before this request (a resumed stream, `resume`), as
        # the client saw them, and their cited runs (`cdr.window.cite`).
        self.prior_outputs: list[str] = []
        self.prior_spans: list[list[CitedSpan]] = []
        # The client's cap on the document's completion tokens (`max_tokens`), and whether the
        # run stopped at it (then `finish_reason` is "length").
        self.token_cap = req.token_cap()
        self.capped = False

    # ------------------------------------------------------------------ start

    def start(self) -> None:
        gw = self.gw
        try:
            index = gw.index()
        except EmptyKnowledgeBaseError:
            if pastes_facts(gw.writer):  # nothing to paste, and no model to pass through to
                raise
            self.passthrough = True
            return
        self.gen = gw.generator(index, self.options)
        try:
            session = self.gen.start(self.task, self.outline)
        except UpstreamError as exc:  # the LLM wrote the outline
            raise from_cdr_error(exc) from None
        self.sid = gw.new_session_id()
        self.record = SessionRecord(session, mode="chat", options=self.options,
                                    owner=self.owner,
                                    kb=None if gw.name == DEFAULT_KB else gw.name)
        self.version = gw.store.create(self.sid, self.record.to_json()).version

    def resume(self, sid: str, version: int, record: SessionRecord) -> None:
        """Go on with a stored session instead of starting one (a stream resumed with
        `Last-Event-ID`, `cdr.gateway.stream_resume`): its own options, not the request's."""
        self.gen = self.gw.generator(self.gw.index(require_facts=False), record.options)
        self.sid, self.version, self.record = sid, version, record
        style = record.session.options.citations
        shown = [window_spans(str(w.get("output", "")), stored_citations(w), style)
                 for w in record.windows]
        self.prior_outputs = [text for text, _ in shown]
        self.prior_spans = [spans for _, spans in shown]

    # ------------------------------------------------------------------ windows

    def run(self, on_delta: DeltaSink | None = None,
            cancelled: threading.Event | None = None) -> Iterator[WindowEvent]:
        """Windows until an exit fires. An upstream failure is stored as the window's
        `upstream-error`, then raised as a 502 `ApiError` carrying the session headers."""
        if self.passthrough:
            self._passthrough(on_delta)
            return
        assert self.record is not None and self.sid is not None
        session, gen = self.record.session, self.gen
        while not (cancelled is not None and cancelled.is_set()):
            left = self._tokens_left()
            if left is not None and left <= 0:
                self.capped = True  # the client's max_tokens: the session stays resumable
                return
            event = gen.step(session, on_delta, max_tokens=left)
            self.events.append(event)
            record = window_record(event)
            if event.upstream is not None:  # the trace gets the summary, not the upstream text
                record["error"] = upstream_summary(event.upstream)
            self.record.windows.append(record)
            self._save()
            self.gw.window_finished(event)
            if event.upstream is not None:
                api = from_cdr_error(event.upstream)
                api.headers.update(self.headers())
                raise api
            yield event
            if event.done:
                return
            if left is not None and event.prepared.max_tokens == left \
                    and event.finish_reason == "length":
                self.capped = True  # the window was cut at what was left of max_tokens
                return

    def _tokens_left(self) -> int | None:
        """What is left of the client's `max_tokens` after the windows this run wrote."""
        if self.token_cap is None:
            return None
        spent = sum(int(e.usage.get("completion_tokens", 0)) for e in self.events)
        return self.token_cap - spent

    def cancel(self) -> None:
        """The client went away: the run stops (after the window being written) and the
        stored session says `cancelled`, so nobody waits on it or spends model time on it."""
        if self.record is None or self.sid is None or self.session.status != IN_PROGRESS:
            return
        self.record.session.status = CANCELLED
        self._save()

    def _save(self) -> None:
        assert self.record is not None and self.sid is not None
        self.version = self.gw.store.cas(self.sid, self.version, self.record.to_json()).version

    def _passthrough(self, on_delta: DeltaSink | None) -> None:
        messages = _passthrough_messages(self.req)
        if not messages:
            raise ApiError(422, "messages has no text to send", param="messages")
        max_tokens = self.req.token_cap() or DEFAULT_GENERATION_TOKENS
        # Held back a block at a time like a window's text (cdr.text.kept_stream): an answer
        # the writer cuts (at the token limit, or where the model began to loop) streams
        # exactly what the whole reply gives.
        held = KeptStream(functools.partial(on_delta, 1)) if on_delta is not None else None
        try:
            result = self.gw.writer.generate(messages, max_tokens,
                                             on_delta=held.feed if held is not None else None)
        except UpstreamError as exc:
            api = from_cdr_error(exc)
            api.headers.update(self.headers())
            raise api from None
        if held is not None:
            result.text = held.released_at_least(result.text)
            held.finish(result.text)
        self.passthrough_text = result.text
        self.passthrough_usage = dict(result.usage)

    # ------------------------------------------------------------------ results

    @property
    def session(self) -> Any:
        return self.record.session if self.record is not None else None

    def token(self) -> str | None:
        if self.sid is None or self.record is None:
            return None
        return self.gw.issue(self.sid, self.record.session)

    def headers(self) -> dict[str, str]:
        if self.passthrough:
            return {**SAFETY_ONLY_HEADERS, "CRP-Context-Window": "1/1",
                    "CRP-Context-Continuation-Status": "safety-only"}
        assert self.record is not None and self.sid is not None
        last = self.events[-1].headers if self.events else None
        return session_headers(self.record.session, self.sid, self.token(), last)

    def content(self) -> str:
        if self.passthrough:  # as the stream gives it (`DocumentText`)
            return assemble([self.passthrough_text])
        return assemble(self.prior_outputs + shown_outputs(self.events))

    def citations(self) -> dict[str, Any]:
        """What a citing run adds to its response (`cdr.gateway.citations_out`): the
        message's annotations, the top-level citations and `crp.sources`; nothing when the
        run does not cite."""
        s = self.session
        if s is None or s.options.citations == "off":
            return {}
        style = s.options.citations
        windows = list(zip(self.prior_outputs, self.prior_spans, strict=True)) + [
            window_spans(e.output, e.citations, style) for e in self.events]
        return {"annotations": message_annotations(windows, s.cited_sources,
                                                   DocumentText.SEPARATOR),
                "citations": citation_list(s.cited_sources),
                "sources": public_entries(s.cited_sources)}

    def usage(self) -> dict[str, int]:
        return sum_usage([self.passthrough_usage] if self.passthrough
                         else [e.usage for e in self.events])

    def finish_reason(self) -> str:
        s = self.session
        if self.capped or (s is not None and s.status == LIMIT_REACHED):
            return "length"
        return "stop"

    def crp(self, headers: dict[str, str]) -> dict[str, Any]:
        s = self.session
        if s is None:
            return {"session_id": None, "token": None, "status": "safety-only", "windows": 1,
                    "max_windows": 1, "completeness": 0.0, "headers": headers}
        return {"session_id": self.sid, "token": headers.get("CRP-Set-Session"),
                "status": s.status, "windows": s.window_count, "max_windows": s.max_windows,
                "completeness": round(s.completeness(), 4), "headers": headers}

    def completion(self) -> tuple[dict[str, Any], dict[str, str]]:
        headers = self.headers()
        message: dict[str, Any] = {"role": "assistant", "content": self.content()}
        crp = self.crp(headers)
        body: dict[str, Any] = {
            "id": self.id, "object": "chat.completion", "created": self.created,
            "model": self.model,
            "choices": [{"index": 0, "finish_reason": self.finish_reason(),
                         "message": message}],
            "usage": self.usage(), "crp": crp,
        }
        if cited := self.citations():
            message["annotations"] = cited["annotations"]
            body["citations"] = cited["citations"]
            crp["sources"] = cited["sources"]
        return body, headers

    def chunk(self, delta: dict[str, Any], finish_reason: str | None = None,
              **extra: Any) -> dict[str, Any]:
        body: dict[str, Any] = {
            "id": self.id, "object": "chat.completion.chunk", "created": self.created,
            "model": self.model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
        }
        body.update(extra)
        return body


def run_to_completion(run: ChatRun, cancelled: threading.Event | None = None
                      ) -> tuple[dict[str, Any], dict[str, str]]:
    """The non-streaming request, start to end (blocking). When `cancelled` is set (the
    client disconnected) the run stops between windows and is stored as `cancelled`."""
    run.start()
    for _ in run.run(cancelled=cancelled):
        pass
    if cancelled is not None and cancelled.is_set():
        run.cancel()
    return run.completion()
