"""The access log without query strings.

Why: a client that sends its API key as `?api_key=...` is refused (keys go in
`Authorization`), but uvicorn's access log writes the request line before anyone looks at it,
so the key would sit in the log for whoever reads it. No route of the gateway takes a secret
in the query, and few take a query at all, so the log keeps the path and replaces any query
with `?<redacted>`: the line still shows that a query was sent.
"""

from __future__ import annotations

import logging

__all__ = ["REDACTED", "RedactQuery", "install_access_log_filter", "redact_query"]

REDACTED = "?<redacted>"
ACCESS_LOGGER = "uvicorn.access"


def redact_query(target: str) -> str:
    """`/path?a=b` → `/path?<redacted>`; a target without a query is returned unchanged."""
    path, sep, _ = target.partition("?")
    return path + REDACTED if sep else target


class RedactQuery(logging.Filter):
    """Rewrites the request target in uvicorn's access records (`'%s - "%s %s HTTP/%s" %d'`,
    the target third), and any other string argument that carries a query."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and args:
            record.args = tuple(redact_query(a) if isinstance(a, str) and "?" in a else a
                                for a in args)
        elif isinstance(record.msg, str) and "?" in record.msg and not args:
            record.msg = " ".join(redact_query(w) if w.startswith("/") else w
                                  for w in record.msg.split(" "))
        return True


def install_access_log_filter() -> None:
    """Add the filter to uvicorn's access logger once (idempotent: apps built in one process,
    as tests do, share the logger)."""
    logger = logging.getLogger(ACCESS_LOGGER)
    if not any(isinstance(f, RedactQuery) for f in logger.filters):
        logger.addFilter(RedactQuery())
