"""What a client may learn about an upstream failure: its status and a short reason.

The writers' `UpstreamError` messages are written for the operator: they name the upstream
URL and quote the upstream's answer, and an upstream that echoes request headers quotes our
`CDR_LLM_API_KEY` back. None of that is the client's business, so responses (streamed and
not) and stored traces carry `summarize_upstream(exc)` instead: "HTTP 401 Unauthorized" or
"connection failed", never the text. The full message goes to the server log, with known
secrets masked there too.
"""

from __future__ import annotations

import re
import threading
from http import HTTPStatus

__all__ = ["redact", "register_path", "register_secret", "scrub_paths", "summarize_upstream"]

_SECRETS: set[str] = set()
_PATHS: dict[str, str] = {}
_LOCK = threading.Lock()
_URL = re.compile(r"\b[a-zA-Z][a-zA-Z0-9+.-]*://[^\s'\"<>]+")
_CREDENTIAL = re.compile(
    r"(?i)(bearer\s+|authorization:\s*\S+\s+|x-api-key:\s*|api[_-]?key[\"']?\s*[:=]\s*[\"']?)"
    r"[^\s'\",}]+")
_KEYLIKE = re.compile(r"\b(sk|pk|rk|cdr)[-_][A-Za-z0-9_-]{8,}")
_HOSTPORT = re.compile(r"\b(?:\d{1,3}\.){3}\d{1,3}(?::\d+)?\b|\blocalhost(?::\d+)?\b")


def register_secret(value: str | None) -> None:
    """Mask `value` wherever `redact` sees it (the gateway registers its LLM API key)."""
    if value and len(value) >= 4:
        with _LOCK:
            _SECRETS.add(value)


def register_path(path: object) -> None:
    """Show `path` (a server directory or file: the CKF, the session store) in error messages
    by its public name only (`cdr.gateway.paths.public_path`)."""
    from cdr.gateway.paths import public_path

    text = str(path) if path is not None else ""
    if (len(text) > 1 and text.startswith(("/", "\\"))) or (len(text) > 2 and text[1] == ":"):
        with _LOCK:
            _PATHS[text] = str(public_path(text))


def scrub_paths(text: str) -> str:
    """`text` with every registered server path replaced by its public name."""
    with _LOCK:
        known = sorted(_PATHS.items(), key=lambda kv: len(kv[0]), reverse=True)
    for full, short in known:
        if full in text:
            text = text.replace(full, short)
    return text


def redact(text: str, *, keep_addresses: bool = False) -> str:
    """`text` with registered secrets, credentials after `Bearer`/`api_key=`, key-like
    tokens, URLs and IP addresses masked. `keep_addresses` leaves URLs and addresses as they
    are (secrets and credentials are still masked): for the lines that say where the server
    itself listens, which an operator needs to read (`is_bind_line`)."""
    with _LOCK:
        known = sorted(_SECRETS, key=len, reverse=True)
    for s in known:
        text = text.replace(s, "[redacted]")
    if not keep_addresses:
        text = _URL.sub("[url]", text)
    text = _CREDENTIAL.sub(lambda m: m.group(1) + "[redacted]", text)
    text = _KEYLIKE.sub("[redacted]", text)
    return text if keep_addresses else _HOSTPORT.sub("[host]", text)


# The log lines that name the gateway's own listening address: ours (`cdr serve`) and
# uvicorn's. Every other line keeps URLs and addresses masked (an upstream's, a client's).
BIND_LINES = (("cdr.gateway", "cdr gateway on http://"), ("uvicorn.error", "Uvicorn running on "))


def is_bind_line(logger: str, message: str) -> bool:
    return any(logger == name and message.startswith(start) for name, start in BIND_LINES)


def _reason(message: str) -> str:
    low = message.lower()
    if "timeout" in low or "no answer" in low:
        return "no answer within the timeout"
    if "connection" in low and "failed" in low:
        return "connection failed"
    if "after" in low and "already delivered" in low:
        return "the stream broke off"
    if "not json" in low or "not a json" in low or "no content" in low or "malformed" in low:
        return "malformed response"
    return "request failed"


_ANSWER = re.compile(r"answered HTTP \d+: (.*?)(?: \(check the API key\))?"
                     r"(?: \(gave up after \d+ attempts?\))?$", re.S)
MAX_EXCERPT = 160


def summarize_upstream(status: int | None, message: str) -> str:
    """A short, secret-free reason for an upstream failure: the HTTP status and its phrase
    when there was an answer, with the upstream's own error message redacted (`redact`) and
    cut to 160 characters ("context length exceeded" is worth passing on); else what kind of
    failure it was (timeout, connection), never the URL."""
    attempts = re.search(r"gave up after (\d+) attempts?", message)
    tail = f" (after {attempts.group(1)} attempts)" if attempts else ""
    if status is not None:
        try:
            phrase = HTTPStatus(status).phrase
        except ValueError:
            phrase = "error"
        hint = " (check CDR_LLM_API_KEY)" if status in (401, 403) else ""
        m = _ANSWER.search(message)
        excerpt = " ".join(redact(m.group(1)).split())[:MAX_EXCERPT] if m else ""
        return f"HTTP {status} {phrase}{hint}{tail}" + (f": {excerpt}" if excerpt else "")
    return _reason(message) + tail


def upstream_summary(exc: BaseException) -> str:
    """What a stored trace says about a failed window (no URL, no upstream text)."""
    return "upstream LLM failed: " + summarize_upstream(getattr(exc, "status", None), str(exc))
