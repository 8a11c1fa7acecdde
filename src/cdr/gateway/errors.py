"""One error shape for every 4xx/5xx the gateway sends, and the mapping from `cdr` errors.

The body follows OpenAI's error object, so the official clients surface our messages as they
do theirs: `{"error": {"type": ..., "message": ..., "param": ..., "code": ...}}`, plus fields
that help a caller act (`upstream_status` on a 502, `expected`/`got` on a model mismatch,
`details` for field validation). `message` always names the problem.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping, Sequence
from typing import Any

from fastapi import HTTPException
from fastapi.responses import JSONResponse

from cdr.errors import (
    CdrError,
    EmbeddingModelMismatchError,
    InvalidInputError,
    NotFoundError,
    UpstreamError,
)
from cdr.gateway.redact import redact, scrub_paths, summarize_upstream

__all__ = [
    "ERROR_TYPES",
    "ApiError",
    "BodyReadTimeoutError",
    "BodyTooLargeError",
    "error_response",
    "from_cdr_error",
    "from_validation_errors",
]

log = logging.getLogger("cdr.gateway")

# HTTP status -> the `type` our bodies carry for it (OpenAI's words where it has one).
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "method_not_allowed",
    408: "request_timeout",
    409: "conflict_error",
    413: "payload_too_large",
    415: "unsupported_media_type",
    431: "request_header_fields_too_large",
    422: "invalid_request_error",
    500: "internal_error",
    502: "upstream_error",
    503: "service_unavailable",
}


class ApiError(Exception):
    """An error response to send: status, type, message, extra body fields, extra headers."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str | None = None,
        param: str | None = None,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
        **extra: Any,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type or ERROR_TYPES.get(status, "error")
        self.param = param
        self.code = code
        self.headers = dict(headers or {})
        self.extra = extra

    def body(self) -> dict[str, Any]:
        err: dict[str, Any] = {
            "type": self.type, "message": scrub_paths(self.message), "param": self.param,
            "code": self.code,
        }
        err.update(self.extra)
        return {"error": err}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


class BodyTooLargeError(HTTPException):
    """Raised from the body-size guard while a handler reads the body. An `HTTPException`
    so that FastAPI's body parsing re-raises it instead of turning it into a generic 400."""

    code = "body_too_large"

    def __init__(self, limit: int) -> None:
        super().__init__(413, f"request body exceeds the limit of {limit} bytes "
                              "(CDR_MAX_BODY_BYTES)")
        self.limit = limit


class BodyReadTimeoutError(HTTPException):
    """The body's read deadline passed (an `HTTPException` for the same reason as above)."""

    code = "request_timeout"

    def __init__(self, seconds: float) -> None:
        super().__init__(408, f"the request body did not arrive within {seconds:g} s "
                              "(CDR_READ_TIMEOUT_SECONDS)", headers={"Connection": "close"})


def error_response(status: int, message: str, **kwargs: Any) -> JSONResponse:
    return ApiError(status, message, **kwargs).response()


def from_cdr_error(exc: CdrError) -> ApiError:
    """The response for an error the library raised on purpose."""
    headers = dict(getattr(exc, "headers", None) or {})
    status = getattr(exc, "http_status", None)
    if isinstance(exc, UpstreamError):
        # Never the upstream's own words: they carry its URL and may echo our API key.
        log.warning("upstream failure: %s", redact(str(exc)))
        return ApiError(502, f"upstream LLM failed: {summarize_upstream(exc.status, str(exc))}",
                        code="upstream_failed", upstream_status=exc.status, headers=headers)
    if isinstance(exc, EmbeddingModelMismatchError):
        return ApiError(409, str(exc), code="embedding_model_mismatch",
                        expected=exc.expected, got=exc.got, headers=headers)
    if isinstance(status, int) and 400 <= status < 600:
        return ApiError(status, str(exc), code=_code(exc), headers=headers)
    if isinstance(exc, NotFoundError):
        return ApiError(404, str(exc), headers=headers)
    if isinstance(exc, InvalidInputError):
        return ApiError(422, str(exc), headers=headers)
    # Anything else raised on purpose (e.g. an empty knowledge base) conflicts with the
    # state the gateway is in rather than with the request's shape.
    return ApiError(409, str(exc), code=_code(exc), headers=headers)


def _code(exc: Exception) -> str:
    """`StaleTokenError` -> `stale_token`: a stable, machine-readable name for the error."""
    name = type(exc).__name__.removesuffix("Error")
    out = "".join(f"_{c.lower()}" if c.isupper() else c for c in name).lstrip("_")
    return out or "error"


# Union members and validator wrappers pydantic puts in an error's location: not fields.
_TAG = re.compile(r"^(str|int|float|bool|list\[.*\]|dict\[.*\]|[a-z-]+\[.*\]|[A-Z]\w*)$")


def _loc(loc: Sequence[Any]) -> str:
    parts = [str(p) for p in loc if p not in ("body", "query", "path", "header")]
    parts = [p for p in parts if not _TAG.match(p)]
    return ".".join(parts)


def from_validation_errors(errors: Sequence[Mapping[str, Any]]) -> ApiError:
    """FastAPI's validation errors as one 400 (malformed JSON) or 422 (wrong fields) error
    whose message names every offending field."""
    for e in errors:
        if e.get("type") == "json_invalid":
            ctx = e.get("ctx") or {}
            where = f" at position {e['loc'][-1]}" if len(e.get("loc", ())) > 1 else ""
            return ApiError(400, f"request body is not valid JSON{where}: "
                                 f"{ctx.get('error', 'parse error')}", code="invalid_json")
    details = [
        {"field": str((e.get("ctx") or {}).get("field") or _loc(e.get("loc", ()))),
         "message": str(e.get("msg", "")), "type": str(e.get("type", ""))}
        for e in errors
    ]
    code = "invalid_unicode" if any(d["type"] == "invalid_unicode" for d in details) \
        else "invalid_fields"
    if code == "invalid_unicode":
        details = [d for d in details if d["type"] == "invalid_unicode"]
    summary = "; ".join(f"{d['field'] or 'body'}: {d['message']}" for d in details[:10])
    if len(details) > 10:
        summary += f"; and {len(details) - 10} more"
    first = details[0]["field"] if details else None
    return ApiError(422, f"invalid request: {summary}", param=first or None,
                    code=code, details=_jsonable(details))


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))
