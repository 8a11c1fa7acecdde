"""Gateway replicas: several `cdr serve` processes on different ports sharing one PostgreSQL
session store and one CKF behave as one gateway.

* One session served alternately, every call on the other replica than the one before,
  gives exactly the envelopes and trace that one replica alone gives.
* Two different submissions for the same window racing on two replicas: exactly one 200 and
  one 409, and the trace holds the winner's text once — no window lost or duplicated.
* A replica killed (SIGKILL by PID) after handing out an envelope loses nothing: the other
  replica accepts that window with the client's token and finishes the session.
* An upload job accepted by one replica is visible, with the same status, from the other.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.gateway_server import CRP, TASK, GatewayServer, base_env, copy_ckf
from tests.pg_server import fresh_schema

pytest_plugins = ["tests.gateway_server", "tests.pg_server"]

START = {"task": TASK, **CRP}
RACES = 6


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def write(envelope: dict[str, Any]) -> str:
    from cdr.writers import get_writer

    return get_writer("extractive").generate(envelope["messages"], envelope["max_tokens"]).text


def replica(tmp: Path, dsn: str, ckf: Path) -> GatewayServer:
    """A `cdr serve` process on its own port, sessions in the shared PostgreSQL."""
    tmp.mkdir(parents=True, exist_ok=True)
    env = base_env(tmp, CDR_SESSION_DB=dsn)
    return GatewayServer(env, via_cli=True, ckf=ckf, workdir=tmp)


@pytest.fixture(scope="module")
def shared(pg_dsn: str, gateway_ckf: Path, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[tuple[str, Path, Path]]:
    """(DSN of a fresh schema, a private CKF copy, a temp root) for this module's replicas."""
    root = tmp_path_factory.mktemp("replicas")
    ckf = copy_ckf(gateway_ckf, root / "ckf")
    with fresh_schema(pg_dsn) as dsn:
        yield dsn, ckf, root


@pytest.fixture(scope="module")
def replicas(shared: tuple[str, Path, Path]) -> Iterator[list[GatewayServer]]:
    dsn, ckf, root = shared
    servers = [replica(root / f"r{i}", dsn, ckf) for i in range(2)]
    try:
        for s in servers:
            s.start()
        assert len({s.port for s in servers}) == 2
        yield servers
    finally:
        for s in servers:
            s.stop()


def run_session(calls: list[GatewayServer], start: dict[str, Any] = START) -> dict[str, Any]:
    """Drive one session to its end; call k (create, envelope, window, envelope, ...) goes to
    `calls[k % len(calls)]`. Returns the etags, texts, statuses and final token."""
    clients = {id(s): httpx.Client(base_url=s.url, timeout=120) for s in calls}
    k = 0

    def nxt() -> httpx.Client:
        nonlocal k
        c = clients[id(calls[k % len(calls)])]
        k += 1
        return c

    try:
        r = nxt().post("/v1/sessions", json=start)
        assert r.status_code == 201, r.text
        sid, token = r.json()["session_id"], r.json()["token"]
        etags, texts, done = [], [], False
        while not done:
            e = nxt().post(f"/v1/sessions/{sid}/envelope", headers=bearer(token))
            assert e.status_code == 200, e.text
            env = e.json()
            if env["done"]:
                token = env["token"]
                break
            text = write(env)
            w = nxt().post(f"/v1/sessions/{sid}/windows", headers=bearer(env["token"]),
                           json={"text": text, "etag": env["etag"]})
            assert w.status_code == 200, w.text
            etags.append(env["etag"])
            texts.append(text)
            token, done = w.json()["token"], w.json()["done"]
        return {"sid": sid, "etags": etags, "texts": texts, "token": token}
    finally:
        for c in clients.values():
            c.close()


def get_trace(server: GatewayServer, sid: str, token: str) -> dict[str, Any]:
    r = httpx.get(f"{server.url}/v1/sessions/{sid}", headers=bearer(token), timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def comparable(trace: dict[str, Any]) -> list[tuple[Any, ...]]:
    """Per window: number, text, the envelope's facts with their scores, the CRP headers."""
    return [(w["number"], w["output"], w["envelope"], w["headers"]) for w in trace["windows"]]


def test_citation_numbers_are_one_sessions_across_replicas(replicas):
    """A citing session served alternately numbers its citations as one replica does: the
    numbers so far travel with the session (`Session.cited_sources`)."""
    a, b = replicas
    citing = {**START, "profile": "focused"}
    alone, alternating = run_session([a], citing), run_session([a, b], citing)
    one = get_trace(a, alone["sid"], alone["token"])
    two = get_trace(b, alternating["sid"], alternating["token"])
    assert one["sources"] and one["sources"] == two["sources"]
    assert [w["citations"] for w in one["windows"]] == [w["citations"] for w in two["windows"]]
    numbers = [n for w in two["windows"] if "citations" in w
               for s in w["citations"]["sentences"] for n in s["numbers"]]
    assert sorted(set(numbers)) == [s["number"] for s in two["sources"]]


def test_one_session_served_alternately_equals_one_replica_alone(replicas):
    a, b = replicas
    alone = run_session([a])
    alternating = run_session([a, b])  # every call on the other replica
    assert len(alternating["etags"]) >= 2
    assert alternating["etags"] == alone["etags"]
    assert alternating["texts"] == alone["texts"]
    t_a = get_trace(a, alternating["sid"], alternating["token"])
    t_b = get_trace(b, alternating["sid"], alternating["token"])
    assert t_a == t_b
    assert t_a["status"] == get_trace(a, alone["sid"], alone["token"])["status"]
    assert [w["output"] for w in t_a["windows"]] == alternating["texts"]
    assert comparable(t_a) == comparable(get_trace(a, alone["sid"], alone["token"]))


def submit(server: GatewayServer, sid: str, env: dict[str, Any], text: str) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/sessions/{sid}/windows", headers=bearer(env["token"]),
                      json={"text": text, "etag": env["etag"]}, timeout=120)


def race(fns: list[Any]) -> list[httpx.Response]:
    barrier = threading.Barrier(len(fns))

    def go(fn: Any) -> httpx.Response:
        barrier.wait()
        return fn()

    with ThreadPoolExecutor(len(fns)) as pool:
        return list(pool.map(go, fns))


def test_racing_submissions_on_two_replicas_one_wins_none_lost(replicas):
    a, b = replicas
    outcomes: list[tuple[int, int]] = []
    for i in range(RACES):
        r = httpx.post(f"{a.url}/v1/sessions", json=START, timeout=120)
        sid, token = r.json()["session_id"], r.json()["token"]
        accepted: list[str] = []
        done = False
        while not done:
            e = httpx.post(f"{(a, b)[i % 2].url}/v1/sessions/{sid}/envelope",
                           headers=bearer(token), timeout=120)
            assert e.status_code == 200, e.text
            env = e.json()
            if env["done"]:
                token = env["token"]
                break
            text = write(env)
            texts = [text, text + "\n\nIn short: handle the errors you expect."]

            pair = race([partial(submit, a, sid, env, texts[0]),
                         partial(submit, b, sid, env, texts[1])])
            codes = [p.status_code for p in pair]
            outcomes.append((min(codes), max(codes)))
            assert sorted(codes) == [200, 409], [p.text for p in pair]
            loser = pair[codes.index(409)].json()["error"]
            assert loser["message"], loser
            winner = codes.index(200)
            accepted.append(texts[winner])
            token, done = pair[winner].json()["token"], pair[winner].json()["done"]
        trace = get_trace(b, sid, token)
        # Zero lost or duplicated windows: the trace is exactly the winners, in order.
        assert [w["output"] for w in trace["windows"]] == accepted
        assert [w["number"] for w in trace["windows"]] == list(range(1, len(accepted) + 1))
    assert len(outcomes) >= RACES and set(outcomes) == {(200, 409)}


def test_killed_replica_loses_nothing(replicas, shared):
    a, _ = replicas
    dsn, ckf, root = shared
    reference = run_session([a])
    doomed = replica(root / "doomed", dsn, ckf).start()
    try:
        with doomed.client() as c:
            r = c.post("/v1/sessions", json=START)
            sid, token = r.json()["session_id"], r.json()["token"]
            e1 = c.post(f"/v1/sessions/{sid}/envelope", headers=bearer(token)).json()
            w1 = c.post(f"/v1/sessions/{sid}/windows", headers=bearer(e1["token"]),
                        json={"text": write(e1), "etag": e1["etag"]})
            assert w1.status_code == 200 and not w1.json()["done"], w1.text
            e2 = c.post(f"/v1/sessions/{sid}/envelope",
                        headers=bearer(w1.json()["token"])).json()
        assert doomed.proc is not None
        pid = doomed.proc.pid
        os.kill(pid, signal.SIGKILL)
        doomed.proc.wait(timeout=30)
        assert doomed.proc.returncode == -signal.SIGKILL
        with pytest.raises(httpx.TransportError):
            httpx.get(f"{doomed.url}/healthz", timeout=2)
    finally:
        doomed.stop()
    # The client goes on at the other replica with the token the dead one gave it.
    texts = [write(e1), write(e2)]
    w2 = httpx.post(f"{a.url}/v1/sessions/{sid}/windows", headers=bearer(e2["token"]),
                    json={"text": texts[1], "etag": e2["etag"]}, timeout=120)
    assert w2.status_code == 200, w2.text
    token, done = w2.json()["token"], w2.json()["done"]
    while not done:
        e = httpx.post(f"{a.url}/v1/sessions/{sid}/envelope", headers=bearer(token),
                       timeout=120).json()
        if e["done"]:
            token = e["token"]
            break
        texts.append(write(e))
        w = httpx.post(f"{a.url}/v1/sessions/{sid}/windows", headers=bearer(e["token"]),
                       json={"text": texts[-1], "etag": e["etag"]}, timeout=120)
        assert w.status_code == 200, w.text
        token, done = w.json()["token"], w.json()["done"]
    trace = get_trace(a, sid, token)
    assert [w["output"] for w in trace["windows"]] == texts == reference["texts"]
    assert [e1["etag"], e2["etag"]] == reference["etags"][:2]


def test_upload_job_is_visible_from_the_other_replica(replicas):
    a, b = replicas
    body = ("# Tide pools\n\nTide pools are rocky pools on the seashore, filled with seawater "
            "when the tide goes out. Anemones, limpets and small crabs live in them.\n")
    r = httpx.post(f"{a.url}/v1/ckf/documents", timeout=120,
                   files={"file": ("tide-pools.md", body.encode(), "text/markdown")})
    assert r.status_code == 202, r.text
    job_id = r.json()["id"]
    seen = httpx.get(f"{b.url}/v1/ckf/jobs/{job_id}", timeout=60)
    assert seen.status_code == 200, seen.text
    assert seen.json()["id"] == job_id and seen.json()["files"] == ["tide-pools.md"]
    deadline = time.monotonic() + 180
    while seen.json()["status"] not in ("succeeded", "failed"):
        assert time.monotonic() < deadline, seen.json()
        time.sleep(0.2)
        seen = httpx.get(f"{b.url}/v1/ckf/jobs/{job_id}", timeout=60)
    assert seen.json()["status"] == "succeeded", seen.json()
    assert seen.json() == httpx.get(f"{a.url}/v1/ckf/jobs/{job_id}", timeout=60).json()
    assert [d["source"] for d in seen.json()["documents"]] == ["upload/tide-pools.md"]
    assert seen.json()["documents"][0]["facts"] >= 1
    missing = httpx.get(f"{b.url}/v1/ckf/jobs/{'0' * 32}", timeout=60)
    assert missing.status_code == 404 and "no ingest job" in missing.json()["error"]["message"]
