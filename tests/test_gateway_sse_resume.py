"""SSE event ids and `Last-Event-ID` resume of a streamed chat completion, on a real gateway
process and a real upstream chat server, with real dropped connections and a SIGKILLed
gateway: what a browser's EventSource or an SSE client library does by itself on reconnect.

Across the first stream and the resumed one, every window event arrives exactly once, in
order, the final chunk once, and the text concatenated equals the stored document. Ids that
are not the gateway's (garbled, tampered, another key's, another task's) are refused with a
JSON error naming the header, before any work.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from cdr.gateway.errors import ApiError
from cdr.gateway.relay import assemble
from cdr.gateway.session_token import TokenSigner
from cdr.gateway.stream_ids import StreamPosition, event_id, read_position
from tests.chat_server import ChatServer
from tests.gateway_server import GatewayServer, copy_ckf
from tests.test_gateway_owner_hostile import A, B, key_env
from tests.test_gateway_resume import CHAT

pytest_plugins = ["tests.gateway_server"]


@pytest.fixture(scope="module")
def setup(gateway_ckf: Path, tmp_path_factory: pytest.TempPathFactory
          ) -> Iterator[tuple[ChatServer, GatewayServer]]:
    """An upstream that stalls a second in the middle of each answer (after 3 pieces), so a
    stream can be dropped, or the gateway killed, while a window is being written."""
    tmp = tmp_path_factory.mktemp("gateway-sse-resume")
    with ChatServer(body="Exceptions are raised with raise and handled by try statements; "
                         "the with statement runs cleanup code.") as chat:
        env = key_env(tmp, CDR_WRITER="openai", CDR_LLM_BASE_URL=chat.openai_base_url,
                      CDR_LLM_MODEL="upstream-model", CDR_RESUME_WAIT_SECONDS="5")
        server = GatewayServer(env, ckf=copy_ckf(gateway_ckf, tmp / "ckf"), workdir=tmp)
        chat.hang_next(1000, seconds=1.0, after=3)
        try:
            yield chat, server.start()
        finally:
            server.stop()


@dataclass
class Received:
    """What one connection received: text, window numbers, final chunks, the last id."""

    text: str = ""
    windows: list[int] = field(default_factory=list)
    finals: list[dict[str, Any]] = field(default_factory=list)
    usage: list[dict[str, Any]] = field(default_factory=list)
    last_id: str | None = None
    ids: int = 0
    # per window event: its id and how much text had arrived with it
    at_window: dict[int, tuple[str, int]] = field(default_factory=dict)
    events: int = 0
    done: bool = False
    session_id: str | None = None


def read_stream(server: GatewayServer, headers: dict[str, str], body: dict[str, Any],
                stop_after_window: int | None = None) -> Received:
    """Stream until [DONE], or — with `stop_after_window` — until the first event after that
    window's event (a delta of the next window, or its event), then drop the connection."""
    got = Received()
    event_id: str | None = None
    with httpx.Client(base_url=server.url, timeout=120) as c, \
            c.stream("POST", "/v1/chat/completions", json=body, headers=headers) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("id: "):
                event_id = line[4:]
                continue
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                got.done = True
                break
            event = json.loads(line[6:])
            got.events += 1
            if event_id is not None:
                got.ids += 1
                got.last_id, event_id = event_id, None
            crp = event.get("crp") or {}
            got.session_id = crp.get("session_id", got.session_id)
            if event.get("choices"):
                got.text += event["choices"][0]["delta"].get("content") or ""
            if crp.get("event") == "window":
                got.windows.append(crp["window"])
                got.at_window[crp["window"]] = (got.last_id or "", len(got.text))
            elif crp.get("event") == "final":
                got.finals.append(event)
            if event.get("usage") is not None:
                got.usage.append(event["usage"])
            if (stop_after_window is not None and got.windows
                    and got.windows[-1] >= stop_after_window
                    and (crp.get("event") != "window" or crp["window"] > stop_after_window)):
                break
    return got


def trace(server: GatewayServer, sid: str, token: str) -> dict[str, Any]:
    r = httpx.get(f"{server.url}/v1/sessions/{sid}", headers={**A, "CRP-Session": token},
                  timeout=60)
    assert r.status_code == 200, r.text
    return dict(r.json())


def check_resumed(server: GatewayServer, first: Received, rest: Received) -> None:
    """Nothing lost or doubled across the reconnect."""
    assert rest.done and len(first.finals) + len(rest.finals) == 1
    windows = first.windows + rest.windows
    assert windows == list(range(1, len(windows) + 1))
    final = rest.finals[0]
    t = trace(server, final["crp"]["session_id"], final["crp"]["token"])
    assert [w["number"] for w in t["windows"]] == windows
    assert first.text + rest.text == assemble([w["output"] for w in t["windows"]])
    assert t["status"] != "in-progress" and final["choices"][0]["finish_reason"]
    assert rest.ids == rest.events  # every event of the resumed stream carries an id


def test_every_event_has_an_id_and_a_dropped_stream_resumes_mid_window(
        setup: tuple[ChatServer, GatewayServer]) -> None:
    _, server = setup
    first = read_stream(server, A, CHAT, stop_after_window=1)
    assert first.windows == [1] and first.ids == first.events and first.last_id
    rest = read_stream(server, {**A, "Last-Event-ID": first.last_id}, CHAT)
    check_resumed(server, first, rest)


def test_a_resume_after_the_gateway_is_killed_goes_on_from_the_stored_windows(
        setup: tuple[ChatServer, GatewayServer]) -> None:
    _, server = setup
    first = read_stream(server, A, CHAT, stop_after_window=1)
    assert server.proc is not None
    os.kill(server.proc.pid, signal.SIGKILL)
    server.proc.wait(timeout=30)
    server.proc = None
    server.start()  # the same session store and signing secret, a new process and port
    # What the killed process streamed of window 2 is not stored; the id of window 1's event
    # (everything the store holds) resumes.
    last_id, chars = first.at_window[1]
    had = Received(text=first.text[:chars], windows=[1])
    rest = read_stream(server, {**A, "Last-Event-ID": last_id}, CHAT)
    check_resumed(server, had, rest)


def test_an_id_past_what_the_store_holds_is_a_409_after_a_crash(
        setup: tuple[ChatServer, GatewayServer]) -> None:
    """The client saw text of a window the killed gateway never stored: continuing would
    repeat or contradict it, so the answer says how to go on instead."""
    chat, server = setup
    # Window 2's answer stalls long after its first pieces, so the kill lands mid-window
    # however slow the machine is between the drop and the kill.
    chat.clear_script()
    chat.hang_next(1, seconds=1.0, after=3)
    chat.hang_next(1, seconds=120.0, after=3)
    try:
        first = read_stream(server, A, CHAT, stop_after_window=1)
        assert first.text != first.text[:first.at_window[1][1]]  # text of window 2 arrived
        assert server.proc is not None
        os.kill(server.proc.pid, signal.SIGKILL)
        server.proc.wait(timeout=30)
        server.proc = None
        server.start()
    finally:
        chat.clear_script()
        chat.hang_next(1000, seconds=1.0, after=3)
    r = httpx.post(f"{server.url}/v1/chat/completions", json=CHAT, timeout=300,
                   headers={**A, "Last-Event-ID": first.last_id or ""})
    assert r.status_code == 409, r.text
    assert r.json()["error"]["code"] == "stream_ahead_of_store"
    assert r.json()["error"]["param"] == "Last-Event-ID"


def test_a_finished_stream_resumed_from_its_final_chunk_sends_only_done(
        setup: tuple[ChatServer, GatewayServer]) -> None:
    _, server = setup
    body = {**CHAT, "stream_options": {"include_usage": True}}
    whole = read_stream(server, A, body)
    assert whole.done and len(whole.finals) == 1 and len(whole.usage) == 1
    again = read_stream(server, {**A, "Last-Event-ID": whole.last_id or ""}, body)
    assert again.done and again.events == 0  # the usage chunk was the last event: nothing more


@pytest.mark.parametrize("value", ["", "garbage", "a:1:2:0:default:" + "x" * 22,
                                   "x" * 5000, "0" * 32 + ":0:0:0:default:" + "A" * 22])
def test_ids_that_are_not_ours_are_a_400_naming_the_header(
        setup: tuple[ChatServer, GatewayServer], value: str) -> None:
    _, server = setup
    r = httpx.post(f"{server.url}/v1/chat/completions", json=CHAT, timeout=60,
                   headers={**A, "Last-Event-ID": value})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == "invalid_last_event_id" and err["param"] == "Last-Event-ID"


def test_tampered_other_key_other_task_and_unstreamed_resumes_are_refused(
        setup: tuple[ChatServer, GatewayServer]) -> None:
    _, server = setup
    first = read_stream(server, A, CHAT, stop_after_window=1)
    last_id, _ = first.at_window[1]
    sid, windows, chars, phase, kid, mac = last_id.split(":")

    def post(headers: dict[str, str], body: dict[str, Any] = CHAT) -> httpx.Response:
        return httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=300,
                          headers=headers)

    skipped = ":".join([sid, windows, str(int(chars) + 10), phase, kid, mac])
    assert post({**A, "Last-Event-ID": skipped}).status_code == 400  # the MAC binds the place
    other_key = post({**B, "Last-Event-ID": last_id})
    assert other_key.status_code == 404, other_key.text  # another key's session: not found
    other = {**CHAT, "messages": [{"role": "user", "content": "Write about loops"}]}
    mismatch = post({**A, "Last-Event-ID": last_id}, other)
    assert mismatch.status_code == 409 and mismatch.json()["error"]["code"] == \
        "last_event_id_mismatch"
    unstreamed = post({**A, "Last-Event-ID": last_id}, {**CHAT, "stream": False})
    assert unstreamed.status_code == 400
    # and the session is still resumable by its owner, all of it once
    rest = read_stream(server, {**A, "Last-Event-ID": last_id}, CHAT)
    check_resumed(server, Received(text=first.text[:first.at_window[1][1]], windows=[1]), rest)


SIGNER = TokenSigner({"old": b"o" * 32, "new": b"n" * 32}, "new")


@given(st.text("abcdef0123456789", min_size=1, max_size=64), st.integers(0, 10**6),
       st.integers(0, 10**9), st.sampled_from([0, 1, 2]))
def test_an_id_reads_back_to_its_position_and_any_change_is_refused(
        sid: str, windows: int, chars: int, phase: int) -> None:
    pos = StreamPosition(sid, windows, chars, phase)
    text = event_id(SIGNER, pos)
    assert "\n" not in text and read_position(SIGNER, text) == pos
    parts = text.split(":")
    for i, changed in ((1, str(windows + 1)), (2, str(chars + 1)), (3, str((phase + 1) % 3)),
                       (4, "old")):
        bad = ":".join([*parts[:i], changed, *parts[i + 1:]])
        with pytest.raises(ApiError) as e:
            read_position(SIGNER, bad)
        assert e.value.status == 400


def test_an_id_signed_before_a_key_rotation_still_reads() -> None:
    before = TokenSigner({"old": b"o" * 32}, "old")
    pos = StreamPosition("abc", 2, 40, 0)
    assert read_position(SIGNER, event_id(before, pos)) == pos  # "old" is still in the ring
    with pytest.raises(ApiError):
        read_position(TokenSigner({"new": b"n" * 32}, "new"), event_id(before, pos))
