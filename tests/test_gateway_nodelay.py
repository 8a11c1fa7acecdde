"""`cdr.gateway.protocol.set_nodelay`: every connection the guarded protocol accepts has Nagle's
algorithm off, including sockets Python mislabels (uvicorn's `--fd` wraps a TCP listener as
AF_UNIX, and asyncio then skips TCP_NODELAY: ~40 ms per keep-alive response). Real sockets."""

from __future__ import annotations

import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from cdr.gateway.protocol import set_nodelay


class _Transport:
    """The one transport method the helper uses, over a real socket."""

    def __init__(self, sock: socket.socket | None) -> None:
        self.sock = sock

    def get_extra_info(self, name: str) -> socket.socket | None:
        return self.sock if name == "socket" else None


def _nodelay(sock: socket.socket) -> int:
    return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)


@pytest.fixture
def accepted() -> Iterator[socket.socket]:
    """A loopback TCP connection accepted from a listener created without TCP_NODELAY."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        with socket.create_connection(listener.getsockname()):
            conn, _ = listener.accept()
            with conn:
                yield conn


def test_sets_nodelay_on_accepted_tcp(accepted: socket.socket) -> None:
    assert _nodelay(accepted) == 0  # the case the helper exists for
    assert set_nodelay(_Transport(accepted)) is True
    assert _nodelay(accepted) != 0


def test_sets_nodelay_on_tcp_socket_labelled_unix(accepted: socket.socket) -> None:
    # what `uvicorn --fd` does with the listener, and so with the connections it accepts
    labelled = socket.fromfd(accepted.fileno(), socket.AF_UNIX, socket.SOCK_STREAM)
    with labelled:
        assert labelled.family == socket.AF_UNIX
        assert set_nodelay(_Transport(labelled)) is True
        assert _nodelay(accepted) != 0


def test_unix_socket_and_missing_socket_are_left_alone() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = str(Path(tmp) / "s")
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
            server.bind(path)
            server.listen(1)
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
                client.connect(path)
                assert set_nodelay(_Transport(client)) is False
    assert set_nodelay(_Transport(None)) is False
