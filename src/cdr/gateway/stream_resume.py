"""A streamed chat completion resumed from `Last-Event-ID`: what the client missed, replayed
from the stored session, then the run going on.

The client sends the same request again with the id of the last event it received
(`cdr.gateway.stream_ids`). The resumed stream then sends, in the order the first one would
have: the rest of each stored window's text after the characters the client has, each window
event it has not seen, and — while the session is in progress — the windows still to write,
as a live run does. Nothing is sent twice and nothing is skipped, because positions count
what the stored windows hold (`relay.assemble`), and a run stores each window before its
window event goes out.

Before replaying, the run the client left must have stopped: on this process the resume
stops it (`LiveStreams`) and waits for its window; on another replica, the resume waits for
that window to reach the store. A client that saw text of a window no store holds (the
gateway died while writing it) cannot be continued without repeating or contradicting it:
that is a 409 naming the way on (the trace and the sidecar API).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from cdr.gateway.app_state import SESSION_ID_HEADER, SET_TOKEN_HEADER, Gateway, check_owner
from cdr.gateway.auth import ApiKey
from cdr.gateway.errors import ApiError
from cdr.gateway.relay import ChatRun, assemble
from cdr.gateway.stream_ids import HEADER, StreamPosition
from cdr.session import IN_PROGRESS
from cdr.window.cite import shown_from_record

# How often a resume looks at the store while a replica finishes the window it was writing
# (how long it waits: `CDR_RESUME_WAIT_SECONDS`).
POLL_SECONDS = 0.25


@dataclass
class Resumption:
    """What the resumed stream sends before going on: queue items as the live stream's
    (`("delta", text)`, `("window", crp)`), and whether the session still has windows to
    write."""

    replay: list[tuple[str, Any]] = field(default_factory=list)
    go_on: bool = False


def window_crp(sid: str | None, token: str | None, number: int, status: str,
               completeness: float, headers: dict[str, str]) -> dict[str, Any]:
    """The `crp` field of a window chunk (live or replayed); a run without a session (none
    is stored) carries no session headers rather than empty ones."""
    ids = {k: v for k, v in ((SESSION_ID_HEADER, sid), (SET_TOKEN_HEADER, token)) if v}
    return {"event": "window", "window": number, "status": status,
            "completeness": round(completeness, 4), "session_id": sid, "token": token,
            "headers": {**headers, **ids}}


def _conflict(message: str, code: str, retry_after: int | None = None) -> ApiError:
    headers = {"Retry-After": str(retry_after)} if retry_after is not None else None
    return ApiError(409, message, param=HEADER, code=code, headers=headers)


def prepare(gw: Gateway, run: ChatRun, pos: StreamPosition, caller: ApiKey | None
            ) -> Resumption:
    """Take the session over for `run` and list what the client missed (blocking: call it
    off the event loop). 404 for a session that is not the caller's, 409 for another task or
    a position past what the store holds."""
    sid = pos.session_id
    wait_seconds = gw.settings.resume_wait_seconds
    deadline = time.monotonic() + wait_seconds
    if not gw.streams.stop(sid, wait_seconds):
        raise _conflict(f"the run of session {sid!r} is still writing its window; retry the "
                        "stream shortly with the same Last-Event-ID", "session_busy",
                        retry_after=5)
    while True:
        index = gw.index(require_facts=False)
        stored, record = gw.load(sid, index, fresh=True)
        check_owner(sid, record, caller, gw.name)
        if record.session.task != run.task:
            raise _conflict("Last-Event-ID belongs to a stream of another task: resend the "
                            "request it came from, or drop the header to start anew",
                            "last_event_id_mismatch")
        # as the client was sent them: a citing run's with their markers (cdr.window.cite)
        outputs = [shown_from_record(w, record.session.options.citations)
                   for w in record.windows]
        if pos.windows <= len(outputs) and pos.chars <= len(assemble(outputs)):
            break
        # The client is ahead of the store: a window still being written by a replica whose
        # client left (it stores the window, then stops), or one that died mid-window.
        if record.session.status != IN_PROGRESS or time.monotonic() > deadline:
            raise _conflict(
                f"the stream's last event is past the {len(outputs)} windows session {sid!r} "
                "stored (the gateway stopped while writing the next one): read the trace "
                "with the last window's token and go on with the sidecar API",
                "stream_ahead_of_store")
        time.sleep(POLL_SECONDS)
    run.resume(sid, stored.version, record)
    token = run.token()
    out = Resumption(go_on=record.session.status == IN_PROGRESS)
    sent = pos.chars
    for number, window in enumerate(record.windows, start=1):
        so_far = assemble(outputs[:number])
        if len(so_far) > sent:
            out.replay.append(("delta", so_far[sent:]))
            sent = len(so_far)
        if number > pos.windows:
            headers = dict(window.get("headers") or {})
            status = headers.get("CRP-Context-Continuation-Status", IN_PROGRESS)
            out.replay.append(("window", window_crp(sid, token, number, status,
                                                    float(window.get("completeness", 0.0)),
                                                    headers)))
    return out
