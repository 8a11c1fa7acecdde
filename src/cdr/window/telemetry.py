"""OpenTelemetry spans of the loop, when the optional `otel` extra is installed
(`cdr-retrieval[otel]`).

One span per window (`window_span`, from `Generator.complete`, the one place every window
ends: written, unwritten or submitted by a sidecar client; the gateway's request spans are
`cdr.gateway.tracing`), whose
attributes are the window's CRP headers (`crp.context.window`, `crp.context.coverage.score`,
...) with its status, finish reason and duration. cdr only creates spans through the
OpenTelemetry API; where they go (OTLP, console, a test's in-memory exporter) is the
application's `TracerProvider`, so without one configured the spans cost next to nothing,
and without the package installed these functions do nothing at all.
"""

from __future__ import annotations

import time
from typing import Any

try:
    from opentelemetry import trace
    from opentelemetry.trace import Status, StatusCode
except ImportError:  # the extra is not installed: every hook below is a no-op
    trace = None  # type: ignore[assignment]

__all__ = ["available", "crp_attributes", "window_span"]

TRACER = "cdr"


def available() -> bool:
    return trace is not None


def crp_attributes(headers: dict[str, str]) -> dict[str, str]:
    """`CRP-Context-Coverage-Score` → `crp.context.coverage.score` (OpenTelemetry's dotted,
    lower-case attribute names); the session token is left out (it is a credential)."""
    return {name.lower().replace("-", "."): value for name, value in headers.items()
            if name.lower() != "crp-set-session"}


def window_span(event: Any) -> None:
    """A finished span for one window, back-dated to when the window started."""
    if trace is None:
        return
    end = time.time_ns()
    seconds = float(getattr(event, "seconds", 0.0) or 0.0)
    span = trace.get_tracer(TRACER).start_span(
        "cdr.window", start_time=end - int(seconds * 1e9))
    span.set_attributes({
        "cdr.window.number": int(event.number),
        "cdr.window.status": str(event.status),
        "cdr.window.finish_reason": str(event.finish_reason),
        "cdr.window.completeness": float(event.completeness),
        "cdr.window.facts": len(event.prepared.envelope),
        **crp_attributes(event.headers),
    })
    if event.error is not None:
        span.set_status(Status(StatusCode.ERROR, "upstream error"))
    span.end(end_time=end)
