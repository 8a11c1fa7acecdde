"""HTTP glue for the sidecar API (the logic is in `cdr.gateway.sidecar`)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Request
from fastapi.responses import JSONResponse
from fastapi.security import APIKeyHeader, HTTPBearer

from cdr.gateway import sidecar
from cdr.gateway.app_state import SET_TOKEN_HEADER, TOKEN_HEADER, Gateway, token_from_headers
from cdr.gateway.auth import ApiKey
from cdr.gateway.errors import ApiError
from cdr.gateway.kbs import kb_gateway
from cdr.gateway.schemas import (
    Deleted,
    EnvelopeResponse,
    ErrorResponse,
    SessionCreate,
    SessionCreated,
    Trace,
    WindowResult,
    WindowSubmit,
)

# Mounted twice (`app.py`): under /v1/sessions for the default KB and /v1/kbs/{kb}/sessions.
router = APIRouter(tags=["sidecar"])

_bearer = HTTPBearer(auto_error=False, description="The session token (`CRP-Set-Session` of "
                     "the last response).")
_crp_header = APIKeyHeader(name=TOKEN_HEADER, auto_error=False,
                           description="The session token, as an alternative to Bearer.")


def session_token(request: Request, _b: Any = Depends(_bearer),
                  _h: Any = Depends(_crp_header)) -> str:
    """The session token. With API keys configured, `Authorization` carries the key, so the
    token comes from `CRP-Session` only; without (dev mode), from either header."""
    if getattr(request.state, "api_key", None) is None:
        return token_from_headers(request.headers)
    value = request.headers.get(TOKEN_HEADER, "").strip()
    if not value:
        raise ApiError(401, f"missing session token: send `{TOKEN_HEADER}: <token>` with the "
                       f"token from the last `{SET_TOKEN_HEADER}` (Authorization carries the "
                       "API key)", code="missing_token")
    return value


Token = Annotated[str, Depends(session_token)]
SessionId = Annotated[str, Path(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$",
                                description="The id `POST /v1/sessions` returned.")]


def _errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    return {c: {"model": ErrorResponse} for c in codes}


_TOKEN_ERRORS = _errors(400, 401, 404, 409, 413, 422, 503)
_HEADERS_DOC = {
    "CRP-Set-Session": {"description": "The session token to send on the next call.",
                        "schema": {"type": "string"}},
    "CRP-Context-Window": {"description": "N/M: window N of at most M.",
                           "schema": {"type": "string"}},
    "CRP-Quality-Completeness": {"schema": {"type": "string"}},
    "CRP-Context-Mode": {"schema": {"type": "string"}},
}


def _gw(request: Request) -> Gateway:
    """The KB this route serves (chosen by the router's dependency, `cdr.gateway.kbs`)."""
    return kb_gateway(request)


def _caller(request: Request) -> ApiKey | None:
    """The API key the auth middleware accepted (None in dev mode)."""
    return getattr(request.state, "api_key", None)


def _json(result: tuple[dict[str, Any], dict[str, str]], status: int = 200) -> JSONResponse:
    body, headers = result
    return JSONResponse(body, status_code=status, headers=headers)


@router.post("", status_code=201, response_model=SessionCreated,
             responses={201: {"headers": _HEADERS_DOC}, **_errors(400, 409, 413, 422, 502, 503)},
             summary="Start a session: plan the sub-queries, get the id and the first token")
def create_session(request: Request, body: SessionCreate) -> JSONResponse:
    return _json(sidecar.create_session(_gw(request), body, _caller(request)), 201)


@router.post("/{session_id}/envelope", response_model=EnvelopeResponse,
             responses={200: {"headers": _HEADERS_DOC}, **_TOKEN_ERRORS},
             summary="The next window's envelope: facts, anchor, plan and chat messages")
def envelope(request: Request, session_id: SessionId, token: Token) -> JSONResponse:
    return _json(sidecar.envelope(_gw(request), session_id, token, _caller(request)))


@router.post("/{session_id}/windows", response_model=WindowResult,
             responses={200: {"headers": _HEADERS_DOC}, **_TOKEN_ERRORS},
             summary="Report the window your LLM wrote: DPE report, headers, exit decision")
def submit_window(request: Request, session_id: SessionId, token: Token,
                  body: WindowSubmit) -> JSONResponse:
    return _json(sidecar.submit_window(_gw(request), session_id, token, body,
                                       _caller(request)))


@router.get("/{session_id}", response_model=Trace, responses=_TOKEN_ERRORS,
            summary="The session's trace (docs/design.md §4)")
def get_trace(request: Request, session_id: SessionId, token: Token) -> JSONResponse:
    return _json(sidecar.trace(_gw(request), session_id, token, _caller(request)))


@router.delete("/{session_id}", response_model=Deleted, responses=_TOKEN_ERRORS,
               summary="End a session and delete its state")
def delete_session(request: Request, session_id: SessionId, token: Token) -> JSONResponse:
    return _json(sidecar.delete(_gw(request), session_id, token, _caller(request)))
