"""Idempotent window submission: a retry after a lost response gets the original answer.

A client reports window N with the token of window N and the response is lost (timeout,
dropped connection). The window was accepted, so that token is now stale; before this, the
retry got 409 `stale_token` and nothing handed out the current token: the session was
stranded. Now each accepted submission stores, beside the session, a digest of what was
submitted (window number, text, etag) and the response without its token. A stale-token
submission for exactly the last accepted window with the same digest is a retry: it gets
the stored response and a fresh token for the session as it now stands. Anything else with
a stale token (other text, an older window) stays 409: a token still cannot be replayed to
report a different window.

The record lives in the stored session JSON under `last_submission` (outside the trace, and
without any token), written in the same compare-and-set as the window itself, so it can
never disagree with the session.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from cdr.gateway.app_state import SET_TOKEN_HEADER, Gateway
from cdr.gateway.schemas import WindowSubmit
from cdr.gateway.session_token import StaleTokenError

__all__ = ["replay_submission", "with_submission"]

KEY = "last_submission"


def digest(window: int, req: WindowSubmit) -> str:
    h = hashlib.sha256(f"{window}\n".encode())
    h.update(req.text.encode("utf-8"))
    if req.finish_reason is not None:  # the same text cut or not is another submission
        h.update(f"\0{req.finish_reason}".encode())
    return h.hexdigest()


def with_submission(data: str, window: int, req: WindowSubmit, body: dict[str, Any]) -> str:
    """The session JSON with the record of this accepted submission (`body` has no token)."""
    doc = json.loads(data)
    doc[KEY] = {"window": window, "digest": digest(window, req), "etag": req.etag,
                "response": body}
    return json.dumps(doc, separators=(",", ":"))


def replay_submission(gw: Gateway, sid: str, exc: StaleTokenError, req: WindowSubmit,
                      index: Any) -> tuple[dict[str, Any], dict[str, str]] | None:
    """The stored response (with a current token) when this stale-token submission repeats
    the last accepted one; None otherwise (the caller re-raises the 409)."""
    window = exc.token_window + 1
    if window != exc.current_window:
        return None
    stored = gw.store.get(sid)
    if stored is None:
        return None
    last = json.loads(stored.data).get(KEY)
    if not isinstance(last, dict) or last.get("window") != window \
            or last.get("digest") != digest(window, req):
        return None
    if req.etag is not None and last.get("etag") not in (None, req.etag):
        return None
    _, record = gw.load(sid, index)
    token = gw.issue(sid, record.session)
    body = dict(last["response"])
    headers = {**body.get("headers", {}), SET_TOKEN_HEADER: token}
    body.update(token=token, headers=headers)
    return body, headers
