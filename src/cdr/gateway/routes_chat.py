"""`POST /v1/chat/completions`: the OpenAI wire format over a whole CDR run.

Streaming (`stream: true`): `chat.completion.chunk` events as the windows are written, then
`data: [DONE]`. Response headers go out before the first window, so they describe the session
as it starts (`CRP-Context-Window: 0/M`, the first token); what is only known later rides in
the chunks' `crp` field instead of headers:

* after each window, a chunk with an empty delta and
  `crp: {"event": "window", "window": n, "status", "completeness", "session_id", "token",
  "headers": {...}}` — `token` is the session's token after that window, so a client whose
  stream drops can go on with the sidecar API from the last window it saw (a stale token
  still reads the trace, which answers with the current token);
* the last chunk (with `finish_reason`) carries `crp: {"event": "final", "session_id",
  "token", "status", "windows", "max_windows", "completeness", "headers": {...}}` — the
  headers a non-streamed response would have had, including `CRP-Set-Session`;
* with `stream_options.include_usage`, a usage chunk (empty `choices`) follows, as OpenAI's.

Every event carries an SSE `id:` (`cdr.gateway.stream_ids`: the session and how far the client
got, signed); the same request sent again with `Last-Event-ID` resumes the stream
(`cdr.gateway.stream_resume`): what the client missed, then the run going on.

A failure before any text was sent (the upstream LLM down) is a plain JSON error response
(502); a failure after that is an `{"error": {...}}` event (what OpenAI's clients raise on),
followed by `[DONE]`. A client that disconnects stops the run after the current window: a
streamed session stays `in-progress` (the client may resume it), a non-streamed one is stored
as `cancelled`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from cdr.errors import CdrError
from cdr.gateway import stream_ids, stream_resume
from cdr.gateway.app_state import Gateway, session_headers
from cdr.gateway.errors import ApiError, from_cdr_error
from cdr.gateway.kbs import KnowledgeBases
from cdr.gateway.relay import ChatRun, DocumentText, assemble, run_to_completion
from cdr.gateway.routes_models import DEFAULT_MODEL, kb_of_model, model_not_found
from cdr.gateway.schemas import ChatCompletion, ChatCompletionRequest, ErrorResponse
from cdr.gateway.stream_ids import StreamPosition
from cdr.gateway.stream_resume import window_crp

log = logging.getLogger("cdr.gateway")
router = APIRouter(tags=["openai"])

_END = object()
# The reconnection delay a stream asks SSE clients for (the `retry:` field).
RETRY_MILLISECONDS = 3000


@router.post(
    "/v1/chat/completions",
    response_model=ChatCompletion,
    responses={
        200: {"content": {"text/event-stream": {"schema": {"type": "string"}}},
              "description": "A chat.completion, or with `stream: true` an SSE stream of "
                             "chat.completion.chunk events ending with `data: [DONE]`."},
        **{c: {"model": ErrorResponse} for c in (400, 404, 409, 413, 422, 429, 502, 503)},
    },
    summary="OpenAI-compatible chat completion written over several CDR windows",
)
async def chat_completions(request: Request, body: ChatCompletionRequest) -> Response:
    key = getattr(request.state, "api_key", None)
    gw = _kb_for(request, body, key)
    position = _resume_position(request, body, gw)
    # cdr.gateway.admission: a ticket before any work is queued, or a 503/429 at once
    ticket = request.app.state.kbs.admission.enter(key.id if key is not None else None)
    started = time.monotonic()
    try:
        run = ChatRun(gw, body, owner=key.owner_id if key is not None else None)
        loop = asyncio.get_running_loop()
        if not body.stream:
            try:
                return await _complete(request, gw, run)
            finally:
                ticket.release(time.monotonic() - started)
        if position is None:
            await loop.run_in_executor(gw.executor, run.start)
            resumption = None
        else:
            resumption = await loop.run_in_executor(
                gw.executor, stream_resume.prepare, gw, run, position, key)
    except BaseException:
        ticket.release()
        raise
    return await _stream(gw, run, body, lambda: ticket.release(time.monotonic() - started),
                         position, resumption)


def _resume_position(request: Request, body: ChatCompletionRequest, gw: Gateway
                     ) -> StreamPosition | None:
    """The position a `Last-Event-ID` header names (a client's SSE reconnect), checked."""
    value = request.headers.get(stream_ids.HEADER)
    if value is None:
        return None
    if not body.stream:
        raise ApiError(400, f"{stream_ids.HEADER} resumes a stream: send it with "
                       "`stream: true`, or drop it", param=stream_ids.HEADER,
                       code="invalid_last_event_id")
    return stream_ids.read_position(gw.signer, value)


async def _complete(request: Request, gw: Gateway, run: ChatRun) -> Response:
    """A non-streamed run: written on a chat thread, stopped between windows if the client
    leaves (stored as cancelled)."""
    loop = asyncio.get_running_loop()
    cancelled = threading.Event()
    work = loop.run_in_executor(gw.executor, run_to_completion, run, cancelled)
    watcher = asyncio.ensure_future(_disconnected(request))
    try:
        waiting: set[asyncio.Future[Any]] = {work, watcher}
        done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
        if watcher in done:
            cancelled.set()  # the run stops between windows and is stored as cancelled
        result, headers = await work
    finally:
        watcher.cancel()
    return JSONResponse(result, headers=headers)


def _kb_for(request: Request, body: ChatCompletionRequest, key: Any) -> Gateway:
    """The KB a chat completion writes from, the OpenAI way: the `model` (`cdr` for the default
    KB, `cdr/<name>`), or `crp.kb` with the model `cdr`. A model that is not ours, or a KB the
    key does not reach, is the unknown model's 404; a `crp.kb` another model contradicts, 422."""
    kbs: KnowledgeBases = request.app.state.kbs
    named = kb_of_model(body.model)
    if named is None:
        raise model_not_found(body.model)
    name = named
    if body.crp is not None and body.crp.kb:
        if body.model != DEFAULT_MODEL and body.crp.kb != named:
            raise ApiError(422, f"crp.kb names the knowledge base {body.crp.kb!r} but the model "
                           f"{body.model!r} names {named!r}: send one, or the model "
                           f"{DEFAULT_MODEL!r} with crp.kb", param="crp.kb",
                           code="invalid_fields")
        name = body.crp.kb
    try:
        return kbs.resolve(name, key)
    except ApiError:
        shown = body.model if not body.crp or not body.crp.kb else name
        raise model_not_found(shown) from None


async def _disconnected(request: Request) -> None:
    """Returns when the client closes its connection (the body has been read, so the next
    ASGI message is the disconnect)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


def _sse(obj: Any, event_id: str | None = None) -> str:
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}data: {json.dumps(obj, separators=(',', ':'))}\n\n"


async def _stream(gw: Gateway, run: ChatRun, body: ChatCompletionRequest,
                  done: Callable[[], None], position: StreamPosition | None = None,
                  resumption: stream_resume.Resumption | None = None) -> Response:
    """The run streamed; `done` is called once its worker has finished, however it ends.
    With `position` and `resumption` (a `Last-Event-ID` reconnect), what the client missed
    is sent first, then the run goes on from the stored session."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[Any] = asyncio.Queue()
    cancelled = threading.Event()

    def put(item: Any) -> None:
        loop.call_soon_threadsafe(queue.put_nowait, item)

    text = DocumentText(after_text=bool(assemble(run.prior_outputs)))

    def on_delta(window: int, piece: str) -> None:
        if out := text.feed(window, piece):
            put(("delta", out))

    go_on = resumption is None or resumption.go_on
    finished = gw.streams.add(run.sid, cancelled) if run.sid is not None else None

    def work() -> None:
        try:
            if go_on:
                for event in run.run(on_delta, cancelled):
                    put(("window", window_crp(run.sid, run.token(), event.number,
                                              event.status, event.completeness,
                                              event.headers)))
            put(("final", None))
        except ApiError as exc:
            put(("error", exc))
        except CdrError as exc:
            err = from_cdr_error(exc)
            if run.sid is not None:
                err.headers.update(run.headers())
            put(("error", err))
        except Exception:
            log.exception("chat completion stream failed")
            put(("error", ApiError(500, "internal error in the gateway (logged)")))
        finally:
            if finished is not None and run.sid is not None:
                gw.streams.remove(run.sid, finished)
            done()
            put(_END)

    # Headers describe the session before any window: computed before the worker touches it.
    headers = run.headers() if run.passthrough else _initial_headers(run)
    for item in resumption.replay if resumption is not None else ():
        queue.put_nowait(item)
    loop.run_in_executor(gw.executor, work)
    first = await queue.get()
    if resumption is None and isinstance(first, tuple) and first[0] == "error":
        await queue.get()  # _END: the worker is done
        out: Response = first[1].response()
        return out

    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    at = position or stream_ids.StreamPosition(run.sid or "", 0, 0)
    if go_on:  # a final chunk seen while the session went on (its run was taken over): not final
        at = dataclasses.replace(at, phase=stream_ids.RUNNING)

    def ident() -> str | None:  # the id of the event just built: where the client then is
        return stream_ids.event_id(gw.signer, at) if run.sid is not None else None

    async def events() -> AsyncIterator[str]:
        nonlocal at
        try:
            if position is None:
                yield f"retry: {RETRY_MILLISECONDS}\n" + _sse(
                    run.chunk({"role": "assistant", "content": ""}), ident())
            item = first
            while item is not _END:
                kind, value = item
                if kind == "delta":
                    at = dataclasses.replace(at, chars=at.chars + len(value))
                    yield _sse(run.chunk({"content": value}), ident())
                elif kind == "window":
                    at = dataclasses.replace(at, windows=at.windows + 1)
                    yield _sse(run.chunk({}, crp=value), ident())
                elif kind == "final":
                    if at.phase == stream_ids.RUNNING:
                        at = dataclasses.replace(at, phase=stream_ids.FINAL_SENT)
                        yield _sse(_final_chunk(run), ident())
                    if include_usage and at.phase == stream_ids.FINAL_SENT:
                        at = dataclasses.replace(at, phase=stream_ids.USAGE_SENT)
                        chunk = run.chunk({})
                        chunk["choices"] = []
                        chunk["usage"] = run.usage()
                        yield _sse(chunk, ident())
                elif kind == "error":
                    yield _sse(value.body())
                item = await queue.get()
            yield "data: [DONE]\n\n"
        finally:
            cancelled.set()

    return StreamingResponse(events(), media_type="text/event-stream", headers={
        **headers, "Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


def _final_chunk(run: ChatRun) -> dict[str, Any]:
    """The chunk with `finish_reason`: the final `crp`, and a citing run's annotations over the
    whole streamed document (in the delta, as OpenAI streams them), its citations and sources
    — what the non-streamed response carries (`ChatRun.completion`)."""
    crp = {"event": "final", **run.crp(run.headers())}
    cited = run.citations()
    delta = {"annotations": cited["annotations"]} if cited else {}
    if cited:
        crp["sources"] = cited["sources"]
    extra = {"citations": cited["citations"]} if cited else {}
    return run.chunk(delta, run.finish_reason(), crp=crp, **extra)


def _initial_headers(run: ChatRun) -> dict[str, str]:
    """The session as it starts (window 0); the final ones go in the last chunk."""
    session = run.session
    assert session is not None and run.sid is not None
    return session_headers(session, run.sid, run.gw.issue(run.sid, session))
