"""The gateway's run inspector: the HTML report of `cdr report`, live for a session.

    GET /ui/                      admin: recent sessions (page)
    GET /ui/sessions/{id}         one session, refreshed as windows arrive (page)
    GET /ui/api/sessions          admin: recent sessions (JSON)
    GET /ui/api/sessions/{id}     the rendered report body and the session's version (JSON)

Why the pages themselves carry no data and need no credentials: a browser navigating to a URL
cannot send `Authorization` or `CRP-Session`. So the page is a fixed shell, and its script
reads the credential from the URL fragment (`#token=<session token>` or `#key=<API key>`;
a fragment never reaches a server or its logs), keeps it in the tab's sessionStorage, and
sends it as a header on every call to the JSON endpoints, which check it:

* a session's view accepts that session's token (`CRP-Session`, or `Authorization: Bearer`
  when no API key is in that header) — signature, expiry and session are checked as on the
  sidecar API, but not the window number (the view only reads, and a token from any earlier
  window of the session still proves its holder ran it) nor the embedding model (the view
  never ranks, and the session's KB may not be the default one);
* with API keys, the key must be the session's owner (the key that created it), else the
  answer is the 404 of a missing session (`check_owner`);
* an admin may view every session of the knowledge bases its key reaches, and the list of
  them (sessions of other KBs are neither shown nor counted). Who is an admin is the
  gateway's to say: the API key the auth middleware accepted (`request.state.api_key`,
  scope `admin`); without keys, a dev-mode gateway (`CDR_DEV=1`, loopback only) treats
  every caller as admin.

With API keys configured, the auth middleware lets the two page shells through without a key
(`cdr.gateway.auth.required_scope`: they hold no data) and asks a key of every JSON endpoint
under `/ui/api/`; open a view as `/ui/sessions/{id}#key=<API key>&token=<session token>`.

Every piece of document text is escaped by the renderer (`cdr.report.render`), and every
response carries a Content-Security-Policy that allows only this page's own stylesheet and
script (by hash) and fetches to this origin.
"""

from __future__ import annotations

import json
from html import escape
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse

from cdr.errors import CdrError
from cdr.gateway.app_state import TOKEN_HEADER, Gateway, check_owner, session_not_found
from cdr.gateway.errors import ApiError, from_cdr_error
from cdr.gateway.session_record import SessionRecord
from cdr.gateway.settings import DEFAULT_KB
from cdr.report import csp_header, render_trace_body
from cdr.report.page import page

router = APIRouter(prefix="/ui", include_in_schema=False)

LIST_LIMIT = 50
SessionId = Annotated[str, Path(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")]


def _security_headers() -> dict[str, str]:
    return {"Content-Security-Policy": csp_header(), "X-Content-Type-Options": "nosniff",
            "Referrer-Policy": "no-referrer", "Cache-Control": "no-store",
            "X-Frame-Options": "DENY"}


def _gw(request: Request) -> Gateway:
    out: Gateway = request.app.state.gateway
    return out


def is_admin(request: Request, gw: Gateway) -> bool:
    """Admin scope by the API key the auth middleware accepted, else dev mode."""
    key = getattr(request.state, "api_key", None)
    if key is not None:
        return bool(key.allows("admin"))
    return bool(gw.settings.dev)


def _session_token(request: Request) -> str | None:
    value = request.headers.get(TOKEN_HEADER.lower(), "").strip()
    if value:
        return value
    if getattr(request.state, "api_key", None) is not None:
        return None  # Authorization carries the API key, not a session token
    scheme, _, rest = request.headers.get("authorization", "").strip().partition(" ")
    return rest.strip() if scheme.lower() == "bearer" and rest.strip() else None


def _authorize_view(request: Request, gw: Gateway, sid: str) -> tuple[int, SessionRecord]:
    """The session's stored version and record, for an admin, or for the session's owner key
    holding a token of the session (any window: the view only reads). Another key gets the
    404 of a session that does not exist."""
    caller = getattr(request.state, "api_key", None)
    if not is_admin(request, gw):
        token = _session_token(request)
        if token is None:
            raise ApiError(401, f"this view needs the session's token: open /ui/sessions/"
                           f"{sid}#token=<token>, or send it as `CRP-Session: <token>`",
                           code="missing_token")
        gw.verify(token, sid, None)  # signature, expiry, this session (any KB's model)
    version, rec = _record(gw, sid)
    check_owner(sid, rec, caller)  # the owner, or an admin reaching the session's KB
    return version, rec


def _html(body: str) -> HTMLResponse:
    return HTMLResponse(body, headers=_security_headers())


def _json(body: dict[str, Any], status: int = 200) -> JSONResponse:
    return JSONResponse(body, status_code=status, headers=_security_headers())


def _refusal(exc: Exception) -> JSONResponse:
    """The usual JSON error body, with this router's security headers too."""
    err = exc if isinstance(exc, ApiError) else from_cdr_error(exc)  # type: ignore[arg-type]
    resp = err.response()
    resp.headers.update(_security_headers())
    return resp


@router.get("/")
def sessions_page() -> HTMLResponse:
    body = ('<header><h1>cdr gateway — recent sessions</h1><p id="live">loading…</p>'
            '<p class="muted">Admins only: open this page as /ui/#key=&lt;admin API key&gt; '
            "(dev mode needs none).</p></header>"
            '<table class="kv"><thead><tr><th>session</th><th>task</th><th>ranking</th>'
            "<th>windows</th><th>status</th><th>completeness</th><th>mode</th>"
            '<th>updated</th></tr></thead><tbody id="sessions"></tbody></table>')
    return _html(page("cdr sessions", body, attrs=' data-list="/ui/api/sessions"',
                      connect=True))


@router.get("/sessions/{session_id}")
def session_page(session_id: SessionId) -> HTMLResponse:
    sid = escape(session_id)
    body = (f'<p id="live">loading session {sid}…</p><div id="content"></div>')
    return _html(page(f"cdr session {session_id}", body,
                      attrs=f' data-live="/ui/api/sessions/{sid}"', connect=True))


def _record(gw: Gateway, sid: str) -> tuple[int, SessionRecord]:
    stored = gw.store.get(sid)
    if stored is None:
        raise session_not_found(sid)
    # No n-gram index: the view reads the session, it never ranks with it.
    return stored.version, SessionRecord.from_json(stored.data, None)


@router.get("/api/sessions/{session_id}")
def session_view(request: Request, session_id: SessionId,
                 after: Annotated[int, Query(ge=-1)] = -1) -> JSONResponse:
    gw = _gw(request)
    try:
        version, rec = _authorize_view(request, gw, session_id)
    except (ApiError, CdrError) as exc:
        return _refusal(exc)
    trace = rec.trace(session_id)
    out: dict[str, Any] = {"version": version, "status": trace["status"],
                           "windows": len(trace["windows"]), "changed": version != after}
    if version != after:
        out["html"] = render_trace_body(trace)
    return _json(out)


@router.get("/api/sessions")
def sessions_list(request: Request) -> JSONResponse:
    gw = _gw(request)
    if not is_admin(request, gw):
        return _refusal(ApiError(403, "the session list is for admins: send an API key with "
                                 "the admin scope (`Authorization: Bearer <key>`)",
                                 code="forbidden"))
    key = getattr(request.state, "api_key", None)
    rows = []
    for sid in gw.store.list_ids():
        stored = gw.store.get(sid)
        if stored is None:
            continue
        try:
            raw = json.loads(stored.data)
            kb = str(raw.get("kb") or DEFAULT_KB)
        except (ValueError, AttributeError):
            continue  # a damaged record is listed nowhere rather than breaking the list
        if key is not None and not key.reaches(kb):
            continue  # another KB's session: neither listed nor counted
        rows.append((stored.updated, sid, raw, kb))
    rows.sort(key=lambda r: (r[0], r[1]), reverse=True)
    sessions = []
    for updated, sid, raw, kb in rows[:LIST_LIMIT]:
        try:
            s = raw["session"]
            windows = raw.get("windows") or []
            sessions.append({
                "id": sid, "task": str(s["task"]), "ranking": str(s["ranking"]),
                "status": str(s["status"]), "windows": int(s["window_count"]),
                "max_windows": int(s["max_windows"]), "mode": str(raw.get("mode", "")),
                "kb": kb,
                "completeness": float(windows[-1]["completeness"]) if windows else 0.0,
                "updated": float(updated)})
        except (ValueError, KeyError, TypeError, CdrError):
            continue  # a damaged record is listed nowhere rather than breaking the list
    return _json({"sessions": sessions, "total": len(rows)})
