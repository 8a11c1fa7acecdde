"""Admission control (`cdr.gateway.admission`): the bounds exactly, and on a real gateway with
one chat thread, one waiting place and one run per key, against a real upstream that stalls:
a key's second run is 429, a run past the waiting place is 503, both at once with
`Retry-After` and a JSON body, nothing stored for them; `/readyz` and `/healthz` answer while
every thread is held; the metrics count the queue and the refusals."""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from cdr.gateway.admission import MAX_RETRY_SECONDS, MIN_RETRY_SECONDS, Admission
from cdr.gateway.auth import hash_key
from cdr.gateway.errors import ApiError
from cdr.gateway.metrics import GatewayMetrics, render_metrics
from tests.chat_server import ChatServer
from tests.gateway_server import CRP, SECRET, TASK, GatewayServer, copy_ckf

pytest_plugins = ["tests.gateway_server"]

KEYS = {name: f"cdr_gen_{name * 32}"[:40] for name in ("a", "b", "c")}


def test_the_bounds_exactly() -> None:
    metrics = GatewayMetrics()
    adm = Admission(capacity=2, max_waiting=1, per_key=2, metrics=metrics)
    t1, t2 = adm.enter("a"), adm.enter("a")
    with pytest.raises(ApiError) as err:
        adm.enter("a")  # the key's bound comes first
    assert err.value.status == 429 and err.value.code == "too_many_runs"
    t3 = adm.enter("b")  # the waiting place
    assert (adm.admitted, adm.waiting) == (3, 1)
    with pytest.raises(ApiError) as err:
        adm.enter("c")
    assert err.value.status == 503 and err.value.code == "server_busy"
    assert err.value.headers["Retry-After"] == "5"  # the initial mean run time
    t1.release(100.0)
    t1.release(100.0)  # idempotent
    assert (adm.admitted, adm.waiting) == (2, 0)
    assert adm.retry_after() == 24  # 5 + 0.2 * (100 - 5), rounded up
    t4 = adm.enter("c")
    for t in (t2, t3, t4):
        t.release(0.0)
    assert adm.admitted == 0 and adm._by_key == {}
    text = render_metrics(metrics.registry)[0].decode()
    assert 'cdr_runs_refused_total{reason="key"} 1.0' in text
    assert 'cdr_runs_refused_total{reason="busy"} 1.0' in text
    assert "cdr_runs_admitted 0.0" in text and "cdr_runs_waiting 0.0" in text
    slow = Admission(1, 0, 1)
    for _ in range(60):
        slow.enter("x").release(10_000.0)
    assert slow.retry_after() == MAX_RETRY_SECONDS
    for _ in range(60):
        slow.enter("x").release(0.0)
    assert slow.retry_after() == MIN_RETRY_SECONDS
    with pytest.raises(ValueError):
        Admission(0, 0, 1)


@pytest.fixture(scope="module")
def upstream() -> Iterator[ChatServer]:
    with ChatServer(body="A paragraph about exceptions.") as s:
        yield s


@pytest.fixture(scope="module")
def busy(gateway_ckf: Path, upstream: ChatServer,
         tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayServer]:
    tmp = tmp_path_factory.mktemp("gateway-admission")
    keys = ",".join(f"generate:{hash_key(k)}" for k in KEYS.values())
    env = {"CDR_SIGNING_SECRET": SECRET, "CDR_SESSION_DB": str(tmp / "sessions.sqlite3"),
           "CDR_API_KEYS": keys, "CDR_WRITER": "openai",
           "CDR_LLM_BASE_URL": upstream.openai_base_url, "CDR_LLM_MODEL": "test-model",
           "CDR_CHAT_THREADS": "1", "CDR_MAX_WAITING_RUNS": "1", "CDR_MAX_RUNS_PER_KEY": "1"}
    with GatewayServer(env, ckf=copy_ckf(gateway_ckf, tmp / "ckf"), workdir=tmp) as server:
        yield server


def _chat(stream: bool) -> dict[str, object]:
    return {"model": "cdr", "messages": [{"role": "user", "content": TASK}],
            "stream": stream, "crp": CRP}


def _sessions(server: GatewayServer) -> int:
    with sqlite3.connect(Path(server.env["CDR_SESSION_DB"])) as conn:
        return int(conn.execute("SELECT COUNT(*) FROM sessions").fetchone()[0])


def _auth(name: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS[name]}"}


def test_past_its_bounds_the_gateway_says_busy_at_once(busy: GatewayServer,
                                                       upstream: ChatServer) -> None:
    upstream.reset()
    upstream.hang_next(2, seconds=8)  # the first run's first window, then the second's
    with busy.client(timeout=30) as http:
        with http.stream("POST", "/v1/chat/completions", json=_chat(True),
                         headers=_auth("a")) as first:
            assert first.status_code == 200  # writing: holds the one chat thread
            r = http.post("/v1/chat/completions", json=_chat(False), headers=_auth("a"))
            assert r.status_code == 429, r.text
            assert int(r.headers["Retry-After"]) >= 1
            assert r.json()["error"]["code"] == "too_many_runs"
            waiting: list[httpx.Response] = []
            second = threading.Thread(target=lambda: waiting.append(httpx.post(
                f"{busy.url}/v1/chat/completions", json=_chat(False), headers=_auth("b"),
                timeout=120)), daemon=True)
            second.start()  # admitted, waiting for the thread
            deadline = time.monotonic() + 30
            while "cdr_runs_waiting 1.0" not in http.get("/metrics").text:
                assert time.monotonic() < deadline, "the second run was never admitted"
                time.sleep(0.1)
            t0 = time.monotonic()
            r = http.post("/v1/chat/completions", json=_chat(False), headers=_auth("c"))
            assert r.status_code == 503, r.text
            assert r.json()["error"]["code"] == "server_busy"
            assert "CDR_MAX_WAITING_RUNS" in r.json()["error"]["message"]
            assert int(r.headers["Retry-After"]) >= 1
            ready = http.get("/readyz")
            health = http.get("/healthz")
            assert time.monotonic() - t0 < 10  # at once, not after a run
            assert ready.status_code == 200 and health.status_code == 200
            text = http.get("/metrics").text
            assert 'cdr_runs_refused_total{reason="key"} 1.0' in text
            assert 'cdr_runs_refused_total{reason="busy"} 1.0' in text
            assert "cdr_runs_admitted 2.0" in text
            assert _sessions(busy) == 1  # the refused runs stored nothing
        second.join(timeout=120)
        assert waiting and waiting[0].status_code == 200, waiting
        deadline = time.monotonic() + 60
        while "cdr_runs_admitted 0.0" not in http.get("/metrics").text:
            assert time.monotonic() < deadline
            time.sleep(0.2)
        r = http.post("/v1/chat/completions", json=_chat(False), headers=_auth("c"))
        assert r.status_code == 200, r.text  # room again
