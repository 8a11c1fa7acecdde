"""A server span per HTTP request of the gateway (method, route path, status, request id, the
CRP headers), when the optional `otel` extra is installed; the loop's window spans and the
tracer's name are `cdr.window.telemetry`'s."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from cdr.window.telemetry import TRACER

try:
    from opentelemetry import trace
    from opentelemetry.trace import SpanKind, Status, StatusCode
except ImportError:  # the extra is not installed: the middleware passes requests through
    trace = None  # type: ignore[assignment]


class TracingMiddleware:
    """A server span per HTTP request: `HTTP <method> <path>`, with status and request id.
    The path is the route's, without the query (where keys could travel)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if trace is None or scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        method, path = scope.get("method", ""), scope.get("path", "")
        tracer = trace.get_tracer(TRACER)
        with tracer.start_as_current_span(f"HTTP {method} {path}", kind=SpanKind.SERVER,
                                          record_exception=False) as span:
            span.set_attributes({"http.request.method": method, "url.path": path})

            async def send_status(message: Message) -> None:
                if message["type"] == "http.response.start":
                    status = int(message["status"])
                    span.set_attribute("http.response.status_code", status)
                    headers = dict(message.get("headers") or [])
                    rid = scope.get("state", {}).get("request_id")  # cdr.gateway.ops
                    if rid:
                        span.set_attribute("cdr.request_id", rid)
                    for key, value in headers.items():
                        if key.startswith(b"crp-") and key != b"crp-set-session":
                            span.set_attribute(key.decode().replace("-", "."),
                                               value.decode("latin-1"))
                    if status >= 500:
                        span.set_status(Status(StatusCode.ERROR))
                await send(message)

            await self.app(scope, receive, send_status)
