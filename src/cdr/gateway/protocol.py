"""uvicorn's h11 protocol with the two guards it lacks, used by `cdr serve`.

1. A header deadline. uvicorn times out idle keep-alive connections, but not a client that
   opens a connection and sends its request line and headers a byte at a time (slowloris):
   such a connection is held for ever. Here, while a request's headers are incomplete, a
   timer runs; when it fires the client gets a JSON 408 and the connection is closed.
2. JSON bodies for the errors raised before the app sees a request. uvicorn answers a
   malformed request, or headers over `h11_max_incomplete_event_size`, with a plain-text 400;
   here they are `{"error": {...}}` like every other refusal, and oversized headers are 431.

It also turns Nagle's algorithm off on every connection (TCP_NODELAY). asyncio does that only
for sockets it knows are TCP: a listening socket handed over as a file descriptor
(`uvicorn --fd`, which wraps it as AF_UNIX) or created without an explicit protocol (gunicorn)
yields connections with Nagle on, and uvicorn writes a response's headers and body in two
sends, so the body waits for the client's delayed ACK: ~40 ms on every keep-alive response
(bench/results/gateway.md).

Running the app under plain `uvicorn` works too, without these two guards (the body deadline
and everything else live in the app).
"""

from __future__ import annotations

import asyncio
import json
import socket
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

__all__ = ["guarded_h11", "set_nodelay"]


def _raw_response(status: int, reason: str, code: str, message: str) -> bytes:
    body = json.dumps({"error": {"type": reason.lower().replace(" ", "_"), "message": message,
                                 "param": None, "code": code}}).encode()
    head = (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n").encode()
    return head + body


def set_nodelay(transport: Any) -> bool:
    """Turn Nagle's algorithm off on a transport's socket, whatever family Python believes it
    has (an inherited descriptor may be labelled AF_UNIX); True if it is now on. A socket that
    is not TCP (a Unix socket) refuses the option, which is fine: it has no Nagle."""
    sock = transport.get_extra_info("socket")
    if sock is None:
        return False
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except OSError:
        return False
    return True


class _GuardedH11Protocol(H11Protocol):
    header_timeout: float = 15.0
    _header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        set_nodelay(transport)
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        # Their side is IDLE until a request's headers are complete: keep the clock running.
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self._arm()
        else:
            self._disarm()

    def _arm(self) -> None:
        if self._header_timer is None:
            self._header_timer = self.loop.call_later(self.header_timeout, self._expired)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _expired(self) -> None:
        self._header_timer = None
        if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
            return
        if self.conn.trailing_data[0]:  # a request started and never finished its headers
            self.transport.write(_raw_response(
                408, "Request Timeout", "request_timeout",
                f"the request headers did not arrive within {self.header_timeout:g} s "
                "(CDR_READ_TIMEOUT_SECONDS)"))
        self.transport.close()

    def send_400_response(self, msg: str) -> None:
        limit = getattr(self.conn, "_max_incomplete_event_size", None)
        if limit is not None and len(self.conn.trailing_data[0]) > limit:
            out = _raw_response(431, "Request Header Fields Too Large", "headers_too_large",
                                f"the request line and headers exceed {limit} bytes "
                                "(CDR_MAX_HEADER_BYTES)")
        else:
            out = _raw_response(400, "Bad Request", "invalid_http",
                                "malformed HTTP request")
        self._disarm()
        self.transport.write(out)
        self.transport.close()


def guarded_h11(header_timeout: float) -> type[H11Protocol]:
    """The protocol class to give `uvicorn.run(http=...)`."""
    return type("GuardedH11Protocol", (_GuardedH11Protocol,),
                {"header_timeout": float(header_timeout)})
