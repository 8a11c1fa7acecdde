"""Joining a Ray head that cannot be reached fails fast with a message naming the address,
instead of Ray's own retry loop (20 rounds of ~40 s: a hang to whoever waits on it).

Two ways to get there: no head at the address (it died, or the port is wrong), and a head on
127.0.0.1 joined by a process that imported `ray` before `RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`
was set: Ray reads that variable once, on import, and otherwise rewrites a loopback address
to the machine's routable one, where a loopback head does not listen. Both run `connect` in
a child process (its own import order, no Ray state shared with this one) under a timeout, so
a regression fails here rather than hanging the suite. No Ray head is started.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from importlib.util import find_spec

import pytest

pytestmark = pytest.mark.skipif(
    find_spec("ray") is None, reason="Ray is not installed: pip install 'cdr-retrieval[ray]'")

CHILD_TIMEOUT = 240  # seconds: far beyond the bounded waits below, far below Ray's own loop


def run_child(code: str) -> subprocess.CompletedProcess[str]:
    """`code` in a fresh interpreter whose environment has none of Ray's own variables (as a
    user's shell that never exported them)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=CHILD_TIMEOUT)


def unused_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def loopback_listener() -> Iterator[int]:
    """A TCP port on 127.0.0.1 that accepts connections (a stand-in for a head's GCS port:
    it answers a connect, nothing more)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        yield int(s.getsockname()[1])


def test_connect_to_an_address_where_no_head_listens_fails_naming_it() -> None:
    port = unused_port()
    done = run_child(
        "from cdr.cluster.ray_index import connect\n"
        f"connect('127.0.0.1:{port}', wait_seconds=1.0)\n")
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("cdr.cluster.ray_index.RayHeadUnreachableError")
    assert f"127.0.0.1:{port}" in last and "no Ray head answers" in last


def test_connect_after_ray_was_imported_without_the_loopback_setting_names_the_fix(
        loopback_listener: int) -> None:
    done = run_child(
        "import ray\n"  # before connect() could export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0
        "from ray._private import services\n"
        "if services.is_localhost(services.get_node_ip_address()):\n"
        "    print('SKIP: this machine has no address but loopback'); raise SystemExit(0)\n"
        "from cdr.cluster.ray_index import connect\n"
        f"connect('127.0.0.1:{loopback_listener}', wait_seconds=1.0)\n")
    if done.stdout.startswith("SKIP"):
        pytest.skip(done.stdout.strip())
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("cdr.cluster.ray_index.RayHeadUnreachableError")
    assert f"127.0.0.1:{loopback_listener}" in last
    assert "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0" in last and "before importing ray" in last


def test_cdr_generate_on_a_dead_ray_address_exits_with_one_line_naming_it(tmp_path) -> None:
    """The real CLI, the address a user typed: no hang, no traceback, nothing written."""
    port = unused_port()
    out = tmp_path / "doc.md"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    done = subprocess.run(
        [sys.executable, "-m", "cdr", "generate", "a task", "--ckf",
         f"ray://127.0.0.1:{port}/srv/kb", "--out", str(out)],
        env=env, capture_output=True, text=True, timeout=CHILD_TIMEOUT)
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    assert f"127.0.0.1:{port}" in done.stderr and "no Ray head answers" in done.stderr
    assert not out.exists() and list(tmp_path.iterdir()) == []
