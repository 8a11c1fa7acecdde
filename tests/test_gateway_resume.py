"""Resuming a streamed chat completion after a real dropped connection and after a SIGKILLed
gateway: the client keeps the last `crp` window chunk's token, reads the trace with it (a
stale token may read), learns the current token and finishes the document with the sidecar
API. No window is lost or written twice: the final trace numbers its windows 1..n, and the
windows the stream delivered are in it exactly as streamed.

The upstream LLM (a real local chat server) stalls a second per window, so the stream is
dropped, or the gateway killed, while the run is still going.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from cdr.gateway.relay import assemble
from tests.chat_server import ChatServer
from tests.gateway_server import OUTLINE, TASK, GatewayServer, copy_ckf
from tests.test_gateway_owner_hostile import A, key_env

pytest_plugins = ["tests.gateway_server"]

CHAT = {"model": "cdr", "stream": True, "messages": [{"role": "user", "content": TASK}],
        "crp": {"outline": OUTLINE, "words": 3000, "window_tokens": 300, "max_windows": 6,
                "profile": "spec"}}  # six windows of the spec loop (the default is focused)


@pytest.fixture(scope="module")
def setup(gateway_ckf: Path, tmp_path_factory: pytest.TempPathFactory
          ) -> Iterator[tuple[ChatServer, GatewayServer]]:
    """One upstream and one gateway for both tests: each resumes a session of its own (the
    first leaves the process running, the second kills it and starts it again on the same
    store), so they share the process start-up and the CKF copy."""
    tmp = tmp_path_factory.mktemp("gateway-resume")
    with ChatServer(body="Exceptions are raised with raise and handled by try statements; "
                         "the with statement runs cleanup code.") as chat:
        env = key_env(tmp, CDR_WRITER="openai", CDR_LLM_BASE_URL=chat.openai_base_url,
                      CDR_LLM_MODEL="upstream-model")
        server = GatewayServer(env, ckf=copy_ckf(gateway_ckf, tmp / "ckf"), workdir=tmp)
        chat.hang_next(100, seconds=1.0)
        try:
            yield chat, server.start()
        finally:
            server.stop()


def stream_until_first_window(server: GatewayServer) -> tuple[str, dict[str, Any]]:
    """Stream the chat completion until the first window's `crp` chunk; return the text
    streamed so far and that chunk's `crp`. Leaving the `with` blocks closes the socket."""
    text = ""
    with httpx.Client(base_url=server.url, timeout=120, headers=A) as c, \
            c.stream("POST", "/v1/chat/completions", json=CHAT) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            crp = event.get("crp")
            if crp is not None and crp.get("event") == "window":
                return text, crp
            if event.get("choices"):
                text += event["choices"][0]["delta"].get("content") or ""
    raise AssertionError("the stream ended before its first window")


def settled_trace(server: GatewayServer, sid: str, token: str) -> httpx.Response:
    """The trace once the run has stopped moving (the server stops after the window it was
    writing when the client went away)."""
    last, since = None, time.monotonic()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        r = httpx.get(f"{server.url}/v1/sessions/{sid}", headers={**A, "CRP-Session": token},
                      timeout=60)
        assert r.status_code == 200, r.text  # a stale token reads
        count = len(r.json()["windows"])
        if count != last:
            last, since = count, time.monotonic()
        elif time.monotonic() - since > 3.0:
            return r
        time.sleep(0.2)
    raise AssertionError("the run never stopped after its client went away")


def finish(server: GatewayServer, sid: str, token: str) -> dict[str, Any]:
    """Go on with the sidecar API until the session ends; the client writes its windows
    (here with the extractive writer)."""
    from cdr.writers import get_writer

    writer = get_writer("extractive")
    with httpx.Client(base_url=server.url, timeout=120, headers=A) as c:
        for _ in range(10):
            e = c.post(f"/v1/sessions/{sid}/envelope", headers={"CRP-Session": token})
            assert e.status_code == 200, e.text
            env = e.json()
            token = env["token"]
            if env["done"]:
                break
            text = writer.generate(env["messages"], env["max_tokens"]).text
            w = c.post(f"/v1/sessions/{sid}/windows", headers={"CRP-Session": token},
                       json={"text": text, "etag": env["etag"]})
            assert w.status_code == 200, w.text
            token = w.json()["token"]
            if w.json()["done"]:
                break
        r = c.get(f"/v1/sessions/{sid}", headers={"CRP-Session": token})
        assert r.status_code == 200, r.text
        return dict(r.json())


def check_whole(trace: dict[str, Any], streamed: str) -> None:
    numbers = [w["number"] for w in trace["windows"]]
    assert numbers == list(range(1, len(numbers) + 1))  # none lost, none doubled
    assert trace["status"] != "in-progress"
    assert assemble([trace["windows"][0]["output"]]) == streamed.strip()


def test_resume_after_a_dropped_stream(setup: tuple[ChatServer, GatewayServer]) -> None:
    _, server = setup
    streamed, crp = stream_until_first_window(server)
    sid, token = crp["session_id"], crp["token"]
    assert crp["window"] == 1 and token
    r = settled_trace(server, sid, token)
    trace = r.json()
    assert trace["status"] == "in-progress"  # a dropped stream is resumable, not cancelled
    assert len(trace["windows"]) < CHAT["crp"]["max_windows"]  # the run stopped
    current = r.headers["CRP-Set-Session"]
    check_whole(finish(server, sid, current), streamed)


def test_resume_after_the_gateway_is_killed(setup: tuple[ChatServer, GatewayServer]) -> None:
    _, server = setup
    streamed, crp = stream_until_first_window(server)
    sid, token = crp["session_id"], crp["token"]
    assert server.proc is not None
    os.kill(server.proc.pid, signal.SIGKILL)
    server.proc.wait(timeout=30)
    assert server.proc.returncode == -signal.SIGKILL
    server.proc = None
    server.start()  # the same session store and signing secret, a new process and port
    r = settled_trace(server, sid, token)
    assert r.json()["status"] == "in-progress" and len(r.json()["windows"]) >= 1
    check_whole(finish(server, sid, r.headers["CRP-Set-Session"]), streamed)
