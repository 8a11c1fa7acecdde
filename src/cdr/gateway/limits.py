"""Input hygiene shared by every request body: clean Unicode, and JSON where JSON is expected.

Invalid Unicode is refused, not repaired. JSON may carry `"\\ud800"`, a lone UTF-16
surrogate, which Python decodes into a `str` no encoder accepts: the embedder's tokenizer, the
SQLite session store and the response writer would each fail on it later, as a 500. Replacing
it with U+FFFD would silently change the caller's text (and the text a DPE report is about),
so the gateway answers 422 naming the field and the character's position instead. Control
characters (NUL included) are valid Unicode and pass through: the tokenizer, SQLite and JSON
all carry them (the hypothesis suites send them).

`check_text` walks the raw JSON before any model validates it, so the check covers every
string, including the extra fields OpenAI clients send, and dict keys.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic_core import PydanticCustomError
from starlette.types import Scope

__all__ = ["INVALID_TEXT", "check_text", "expects_json", "is_json_content_type"]

INVALID_TEXT = re.compile("[\ud800-\udfff]")
MAX_DEPTH = 64


def _problem(s: str) -> str | None:
    m = INVALID_TEXT.search(s)
    if m is None:
        return None
    return (f"invalid Unicode: lone surrogate U+{ord(m.group()):04X} at character "
            f"{m.start()}; send UTF-8 text")


def check_text(value: Any, path: str = "", depth: int = 0) -> Any:
    """Raise a pydantic `invalid_unicode` error naming the first string (value or key) under
    `value` that holds a lone surrogate; return `value` unchanged otherwise. Used as a
    `mode="before"` model validator."""
    if depth > MAX_DEPTH:
        raise PydanticCustomError("too_deep", "JSON nested deeper than {limit} levels",
                                  {"field": path or "body", "limit": MAX_DEPTH})
    if isinstance(value, str):
        if (why := _problem(value)) is not None:
            raise PydanticCustomError("invalid_unicode", "{why}",
                                      {"field": path or "body", "why": why})
    elif isinstance(value, dict):
        for k, v in value.items():
            key = str(k)
            where = f"{path}.{key}" if path else key
            if isinstance(k, str) and (why := _problem(k)) is not None:
                raise PydanticCustomError("invalid_unicode", "a key has {why}",
                                          {"field": path or "body", "why": why})
            check_text(v, where, depth + 1)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            check_text(v, f"{path}.{i}" if path else str(i), depth + 1)
    return value


def is_json_content_type(value: str) -> bool:
    media = value.split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/")
                                           and media.endswith("+json"))


def expects_json(method: str, path: str) -> bool:
    """Whether this call's body (when it has one) must be JSON: every write under /v1 except
    the multipart upload."""
    return (method.upper() in ("POST", "PUT", "PATCH") and path.startswith("/v1/")
            and path != "/v1/ckf/documents"
            and not (path.startswith("/v1/kbs/") and path.endswith("/documents")))


def header(scope: Scope, name: bytes) -> str | None:
    """The first value of header `name` (lower-case bytes) of an ASGI request, or None: read
    from the raw scope by the middlewares that run before any request object exists."""
    for k, v in scope.get("headers", []):
        if k == name:
            out: str | None = v.decode("latin-1")
            return out
    return None
