"""The ASGI layer around every request: body-size limit, metrics, default CRP headers, and
the last line of defence that turns an unexpected exception into a JSON 500.

Pure ASGI rather than Starlette's `BaseHTTPMiddleware`, so that streamed responses pass
through untouched and the request latency covers the whole stream.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from cdr.gateway.errors import ApiError, BodyTooLargeError
from cdr.gateway.metrics import GatewayMetrics

log = logging.getLogger("cdr.gateway")


class GatewayMiddleware:
    def __init__(
        self,
        app: ASGIApp,
        *,
        metrics: GatewayMetrics,
        max_body_bytes: int,
        default_headers: Callable[[], dict[str, str]],
    ) -> None:
        self.app = app
        self.metrics = metrics
        self.max_body_bytes = max_body_bytes
        self.default_headers = default_headers

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()
        state: dict[str, Any] = {"status": 500, "started": False, "observed": False}
        limit = self.max_body_bytes

        def observe() -> None:
            if not state["observed"]:
                state["observed"] = True
                route = scope.get("route")
                template = getattr(route, "path", None) or "unmatched"
                self.metrics.observe_request(template, scope.get("method", "GET"),
                                             state["status"], time.perf_counter() - t0)

        async def send_wrapper(message: Message) -> None:
            if message["type"] == "http.response.start":
                state["status"] = message["status"]
                state["started"] = True
                present = {k.lower() for k, _ in message.get("headers", [])}
                extra = [(k.lower().encode("latin-1"), v.encode("latin-1"))
                         for k, v in self.default_headers().items()
                         if k.lower().encode("latin-1") not in present]
                if extra:
                    message = {**message, "headers": [*message.get("headers", []), *extra]}
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                observe()

        async def send_error(err: ApiError) -> None:
            resp = err.response()
            await resp(scope, receive, send_wrapper)

        length = _content_length(scope)
        if length is not None and length > limit:
            await send_error(ApiError(413, BodyTooLargeError(limit).detail,
                                      code="body_too_large", limit=limit))
            return
        received = 0

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise BodyTooLargeError(limit)
            return message

        try:
            await self.app(scope, limited_receive, send_wrapper)
        except BodyTooLargeError as exc:
            if not state["started"]:
                await send_error(ApiError(413, str(exc.detail), code="body_too_large",
                                          limit=limit))
        except Exception:
            log.exception("unhandled error on %s %s", scope.get("method"), scope.get("path"))
            if not state["started"]:
                await send_error(ApiError(500, "internal error in the gateway (logged)"))
            else:
                raise
        finally:
            observe()


def _content_length(scope: Scope) -> int | None:
    for k, v in scope.get("headers", []):
        if k == b"content-length":
            try:
                return int(v)
            except ValueError:
                return None
    return None
