"""The ASGI layer around every request: body-size limit, body read deadline, JSON content
type, metrics, default CRP headers, and the last line of defence that turns an unexpected
exception into a JSON 500.

The read deadline: a client that promises a body and sends it slowly (or never) would hold a
worker and its buffers for ever. Once the headers are in, the whole body must arrive within
`read_timeout` seconds (`CDR_READ_TIMEOUT_SECONDS`); else the answer is a JSON 408 with
`Connection: close`, and the connection is closed. The headers' own deadline lives in the
HTTP protocol (`cdr.gateway.protocol`), where they are read.

Pure ASGI rather than Starlette's `BaseHTTPMiddleware`, so that streamed responses pass
through untouched and the request latency covers the whole stream.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from cdr.gateway.errors import ApiError, BodyReadTimeoutError, BodyTooLargeError
from cdr.gateway.limits import expects_json, header, is_json_content_type
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
        read_timeout: float = 15.0,
        max_header_bytes: int = 32_768,
    ) -> None:
        self.app = app
        self.max_header_bytes = max_header_bytes
        self.read_timeout = read_timeout
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
                template = getattr(route, "path", None)
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
        # The HTTP layer only measures headers that arrive in pieces; a block sent at once
        # is measured here.
        header_bytes = sum(len(k) + len(v) + 4 for k, v in scope.get("headers", []))
        if header_bytes > self.max_header_bytes:
            await send_error(ApiError(
                431, f"the request headers are {header_bytes} bytes; the limit is "
                f"{self.max_header_bytes} (CDR_MAX_HEADER_BYTES)", code="headers_too_large",
                headers={"Connection": "close"}))
            return
        method, path = scope.get("method", "GET"), scope.get("path", "")
        ctype = header(scope, b"content-type")
        has_body = (length or 0) > 0 or header(scope, b"transfer-encoding") is not None
        if has_body and expects_json(method, path) and ctype is not None \
                and not is_json_content_type(ctype):
            await send_error(ApiError(
                415, f"{method} {path} takes a JSON body: send Content-Type: application/json "
                f"(got {ctype[:100]!r})", code="unsupported_media_type"))
            return
        received = 0
        deadline = time.monotonic() + self.read_timeout
        body_done = False

        async def limited_receive() -> Message:
            nonlocal received, body_done
            if body_done:  # waiting for a disconnect: no deadline
                return await receive()
            try:
                message = await asyncio.wait_for(receive(), max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                raise BodyReadTimeoutError(self.read_timeout) from None
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise BodyTooLargeError(limit)
                body_done = not message.get("more_body", False)
            return message

        try:
            await self.app(scope, limited_receive, send_wrapper)
        except BodyTooLargeError as exc:
            if not state["started"]:
                await send_error(ApiError(413, str(exc.detail), code="body_too_large",
                                          limit=limit))
        except BodyReadTimeoutError as exc:
            if not state["started"]:
                await send_error(ApiError(408, str(exc.detail), code=exc.code,
                                          headers=dict(exc.headers or {})))
        except Exception:
            log.exception("unhandled error on %s %s", scope.get("method"), scope.get("path"))
            if not state["started"]:
                await send_error(ApiError(500, "internal error in the gateway (logged)"))
            else:
                raise
        finally:
            observe()


def _content_length(scope: Scope) -> int | None:
    value = header(scope, b"content-length")
    try:
        return None if value is None else int(value)
    except ValueError:
        return None
