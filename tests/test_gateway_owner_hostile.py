"""The hostile findings of issue 23 against a real `cdr serve` process, each a test that failed
before its fix: sessions owned by their key, stale tokens that may read but never write, the
current token in every streamed window, upload names bounded by bytes, API docs off by
default, query strings kept out of the access log, non-streamed runs cancelled when their
client goes, and a dev-mode gateway that refuses foreign hosts and cross-site writes.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from cdr.gateway.auth import hash_key
from tests.chat_server import ChatServer
from tests.gateway_server import (
    OUTLINE,
    SECRET,
    TASK,
    GatewayServer,
    base_env,
    copy_ckf,
)

pytest_plugins = ["tests.gateway_server"]

KEY_A = "cdr_teamA_Hq7vR2mX9pL4wT6yK1nB8cJ3dF5gS0eZ"
KEY_B = "cdr_teamB_Wm3xQ8rT1vY6uN9oP2kL5hG7fD4sA0cV"
ADMIN_KEY = "cdr_admin_Jp5tY2wQ9mR7uK1oL4nH8gF3dS6aZ0xB"
A = {"Authorization": f"Bearer {KEY_A}"}
B = {"Authorization": f"Bearer {KEY_B}"}
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
# The spec loop's windows (the default, focused, may end this small task after one).
SESSION = {"task": TASK, "outline": OUTLINE, "words": 300, "window_tokens": 300,
           "max_windows": 4, "profile": "spec"}


def key_env(tmp: Path, **extra: str) -> dict[str, str]:
    keys = (f"generate:{hash_key(KEY_A)},generate:{hash_key(KEY_B)},"
            f"admin:{hash_key(ADMIN_KEY)}")
    staging = tmp / "tmpdir"
    staging.mkdir(exist_ok=True)
    return {"CDR_SIGNING_SECRET": SECRET, "CDR_SESSION_DB": str(tmp / "sessions.sqlite3"),
            "CDR_API_KEYS": keys, "TMPDIR": str(staging), **extra}


@pytest.fixture(scope="module")
def server(gateway_ckf: Path, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[GatewayServer]:
    tmp = tmp_path_factory.mktemp("gateway-owner")
    ckf = copy_ckf(gateway_ckf, tmp / "ckf")
    with GatewayServer(key_env(tmp), via_cli=True, ckf=ckf, workdir=tmp) as s:
        yield s


def error_of(r: httpx.Response) -> dict[str, Any]:
    assert r.headers["content-type"].startswith("application/json"), r.text
    return dict(r.json()["error"])


def start(c: httpx.Client, key: dict[str, str]) -> dict[str, Any]:
    r = c.post("/v1/sessions", json=SESSION, headers=key)
    assert r.status_code == 201, r.text
    return dict(r.json())


def stored_rows(server: GatewayServer) -> list[tuple[Any, ...]]:
    with sqlite3.connect(Path(server.env["CDR_SESSION_DB"])) as conn:
        return conn.execute("SELECT id, version, data FROM sessions ORDER BY 1").fetchall()


def _same_refusal(r: httpx.Response, missing: httpx.Response, sid: str, other: str) -> None:
    """`r` (a session that exists but is not the caller's) is exactly `missing` (one that
    does not exist), up to the id named in the message."""
    assert r.status_code == missing.status_code == 404, (r.text, missing.text)
    assert r.json() == json.loads(missing.text.replace(other, sid))


# ------------------------------------------------------------------ 1. sessions have owners


def test_another_key_with_a_stolen_token_sees_nothing(server: GatewayServer) -> None:
    with server.client() as c:
        s = start(c, A)
        sid, token = s["session_id"], s["token"]
        before = stored_rows(server)
        calls = [("GET", f"/v1/sessions/{sid}", None),
                 ("POST", f"/v1/sessions/{sid}/envelope", None),
                 ("POST", f"/v1/sessions/{sid}/windows", {"text": "stolen words " * 20}),
                 ("DELETE", f"/v1/sessions/{sid}", None),
                 ("GET", f"/ui/api/sessions/{sid}", None)]
        for method, path, body in calls:
            r = c.request(method, path, json=body, headers={**B, "CRP-Session": token})
            assert r.status_code == 404, (path, r.text)
            assert sid in error_of(r)["message"] or path.startswith("/ui/")
        assert stored_rows(server) == before  # nothing written, nothing deleted
        # The owner and an admin still reach it.
        assert c.get(f"/v1/sessions/{sid}", headers={**A, "CRP-Session": token}).status_code \
            == 200
        assert c.get(f"/v1/sessions/{sid}",
                     headers={**ADMIN, "CRP-Session": token}).status_code == 200
        assert c.get(f"/ui/api/sessions/{sid}", headers=ADMIN).status_code == 200


def test_not_yours_is_indistinguishable_from_does_not_exist(server: GatewayServer) -> None:
    with server.client() as c:
        mine, gone = start(c, A), start(c, A)
        sid, other = mine["session_id"], gone["session_id"]
        assert c.delete(f"/v1/sessions/{other}",
                        headers={**A, "CRP-Session": gone["token"]}).status_code == 200
        for method, path in [("GET", ""), ("POST", "/envelope"), ("DELETE", "")]:
            r = c.request(method, f"/v1/sessions/{sid}{path}",
                          headers={**B, "CRP-Session": mine["token"]})
            missing = c.request(method, f"/v1/sessions/{other}{path}",
                                headers={**B, "CRP-Session": gone["token"]})
            _same_refusal(r, missing, sid, other)


def test_the_owner_is_stored_as_the_keys_id_never_the_key(server: GatewayServer) -> None:
    with server.client() as c:
        sid = start(c, A)["session_id"]
    data = dict((row[0], row[2]) for row in stored_rows(server))[sid]
    record = json.loads(data)
    assert record["owner"] == hash_key(KEY_A).removeprefix("sha256:")[:16]
    assert KEY_A not in data and hash_key(KEY_A).removeprefix("sha256:") not in data


def test_chat_sessions_are_owned_too(server: GatewayServer) -> None:
    with server.client() as c:
        r = c.post("/v1/chat/completions", headers=A, json={
            "model": "cdr", "messages": [{"role": "user", "content": TASK}],
            "crp": {"outline": OUTLINE, "words": 300, "window_tokens": 300, "max_windows": 1}})
        assert r.status_code == 200, r.text
        crp = r.json()["crp"]
        sid, token = crp["session_id"], crp["token"]
        assert c.get(f"/v1/sessions/{sid}", headers={**B, "CRP-Session": token}
                     ).status_code == 404
        assert c.get(f"/v1/sessions/{sid}", headers={**A, "CRP-Session": token}
                     ).status_code == 200


# ------------------------------------------------------------------ 2. stale tokens, resume


def test_a_stale_token_reads_the_trace_and_learns_the_current_token(
        server: GatewayServer) -> None:
    with server.client(headers=A) as c:
        s = start(c, A)
        sid, t0 = s["session_id"], s["token"]
        env = c.post(f"/v1/sessions/{sid}/envelope", headers={"CRP-Session": t0})
        assert env.status_code == 200, env.text
        r = c.post(f"/v1/sessions/{sid}/windows",
                   headers={"CRP-Session": env.json()["token"]},
                   json={"text": "The try statement handles exceptions. " * 10})
        assert r.status_code == 200, r.text
        current = r.json()["token"]
        before = stored_rows(server)
        trace = c.get(f"/v1/sessions/{sid}", headers={"CRP-Session": t0})
        assert trace.status_code == 200, trace.text
        assert len(trace.json()["windows"]) == 1
        fresh = trace.headers["CRP-Set-Session"]
        # Stale: still no write with it.
        stale = c.post(f"/v1/sessions/{sid}/envelope", headers={"CRP-Session": t0})
        assert stale.status_code == 409 and error_of(stale)["code"] == "stale_token"
        assert stored_rows(server) == before
        # The learned token is the current one: it writes.
        nxt = c.post(f"/v1/sessions/{sid}/envelope", headers={"CRP-Session": fresh})
        assert nxt.status_code == 200, nxt.text
        assert c.post(f"/v1/sessions/{sid}/envelope",
                      headers={"CRP-Session": current}).status_code == 200


def _events(r: httpx.Response) -> list[dict[str, Any]]:
    out = []
    for line in r.iter_lines():
        if line.startswith("data: ") and line != "data: [DONE]":
            out.append(json.loads(line[6:]))
    return out


def test_every_streamed_window_carries_the_current_token(server: GatewayServer) -> None:
    with server.client(headers=A) as c, c.stream("POST", "/v1/chat/completions", json={
            "model": "cdr", "stream": True, "messages": [{"role": "user", "content": TASK}],
            "crp": {"outline": OUTLINE, "words": 300, "window_tokens": 300,
                    "max_windows": 3}}) as r:
        assert r.status_code == 200
        events = _events(r)
    windows = [e["crp"] for e in events if e.get("crp", {}).get("event") == "window"]
    assert windows
    sid = windows[0]["session_id"]
    for w in windows:
        assert w["session_id"] == sid and w["token"]
        assert w["headers"]["CRP-Set-Session"] == w["token"]
    with server.client(headers=A) as c:
        # The last window's token is the session's current one: the trace answers with it.
        r = c.get(f"/v1/sessions/{sid}", headers={"CRP-Session": windows[-1]["token"]})
        assert r.status_code == 200 and len(r.json()["windows"]) == len(windows)


# ------------------------------------------------------------------ 3. upload names


def _staging_dirs(server: GatewayServer) -> list[Path]:
    return sorted(Path(server.env["TMPDIR"]).glob("cdr-upload-*"))


def _wait_no_staging(server: GatewayServer, timeout: float = 60.0) -> list[Path]:
    deadline = time.monotonic() + timeout
    while _staging_dirs(server) and time.monotonic() < deadline:
        time.sleep(0.1)
    return _staging_dirs(server)


@pytest.mark.parametrize("name", ["é" * 250 + ".md", "😀" * 63 + ".txt", "a" * 251 + "é.md"])
def test_upload_names_are_bounded_by_encoded_bytes(server: GatewayServer, name: str) -> None:
    assert len(name) <= 255 < len(name.encode("utf-8"))
    with server.client(headers=ADMIN) as c:
        docs = c.get("/v1/ckf/documents").json()
        r = c.post("/v1/ckf/documents", files=[
            ("file", ("fine.md", b"# Fine\n\nA fine note about the try statement.\n" * 5)),
            ("file", (name, b"# Long\n\nA note with a long name about exceptions.\n" * 5))])
        assert r.status_code == 422, r.text
        err = error_of(r)
        assert err["code"] == "invalid_file_name" and err["param"] == "file"
        assert "255 bytes" in err["message"]
        assert _staging_dirs(server) == []
        assert c.get("/v1/ckf/documents").json() == docs


def test_staging_is_removed_after_a_successful_upload(server: GatewayServer) -> None:
    with server.client(headers=ADMIN) as c:
        r = c.post("/v1/ckf/documents", files=[
            ("file", ("é" * 100 + ".md", b"# Accents\n\nA note about raise statements.\n" * 5))])
        assert r.status_code == 202, r.text
        job = r.json()["id"]
        deadline = time.monotonic() + 120
        while c.get(f"/v1/ckf/jobs/{job}").json()["status"] in ("queued", "running"):
            assert time.monotonic() < deadline
            time.sleep(0.2)
    assert _wait_no_staging(server) == []


# ------------------------------------------------------------------ 4. API docs


def test_api_docs_are_off_by_default(server: GatewayServer) -> None:
    with server.client() as c:
        for path in ("/docs", "/redoc"):
            r = c.get(path)
            assert r.status_code == 404, (path, r.text[:200])
            assert "cdn" not in r.text.lower()
        assert c.get("/openapi.json").status_code == 200  # the description itself stays


def test_api_docs_when_on_have_a_strict_csp(gateway_ckf: Path, tmp_path: Path) -> None:
    env = key_env(tmp_path, CDR_API_DOCS="1")
    with GatewayServer(env, ckf=gateway_ckf, workdir=tmp_path) as s, s.client() as c:
        for path in ("/docs", "/redoc"):
            r = c.get(path)
            assert r.status_code == 200, path
            csp = dict(d.strip().partition(" ")[::2]
                       for d in r.headers["content-security-policy"].split(";"))
            assert csp["default-src"] == "'none'" and csp["frame-ancestors"] == "'none'"
            assert csp["connect-src"] == "'self'" and csp["form-action"] == "'none'"
            inline = re.findall(r"<script>(.*?)</script>", r.text, re.S)
            hashes = [f"'sha256-{base64.b64encode(hashlib.sha256(s.encode()).digest()).decode()}'"
                      for s in inline]
            # Scripts: the CDN and exactly the page's own inline scripts, nothing else.
            assert sorted(csp["script-src"].split()) == sorted(
                [*hashes, "https://cdn.jsdelivr.net"])
            assert len(inline) == (1 if path == "/docs" else 0)
            assert r.headers["x-content-type-options"] == "nosniff"


# ------------------------------------------------------------------ 5. the access log


def test_query_strings_never_reach_the_access_log(server: GatewayServer) -> None:
    secret = "cdr_leaked_in_query_Tq8wE3rY6uI1oP4aS7dF"
    with server.client() as c:
        r = c.get(f"/v1/ckf/stats?api_key={secret}&x=1")
        assert r.status_code == 401
        ok = c.get(f"/v1/ckf/stats?key={secret}", headers=A)
        assert ok.status_code == 200
    deadline = time.monotonic() + 5
    while "/v1/ckf/stats" not in server.log() and time.monotonic() < deadline:
        time.sleep(0.05)
    log = server.log()
    assert "GET /v1/ckf/stats" in log  # the access log is on and logged the path
    assert secret not in log
    assert "api_key" not in log


# ------------------------------------------------------------------ 6. abandoned runs


def test_a_non_streamed_run_stops_when_its_client_goes(gateway_ckf: Path,
                                                        tmp_path: Path) -> None:
    with ChatServer(body="Exceptions are raised and handled by try statements.") as chat:
        env = key_env(tmp_path, CDR_WRITER="openai", CDR_LLM_BASE_URL=chat.openai_base_url,
                      CDR_LLM_MODEL="upstream-model")
        with GatewayServer(env, ckf=copy_ckf(gateway_ckf, tmp_path / "ckf"),
                           workdir=tmp_path) as s:
            chat.hang_next(10, seconds=2.0)
            with s.client(headers=A, timeout=1.0) as c, pytest.raises(httpx.ReadTimeout):
                c.post("/v1/chat/completions", json={
                    "model": "cdr", "messages": [{"role": "user", "content": TASK}],
                    "crp": {"outline": OUTLINE, "words": 300, "window_tokens": 300,
                            "max_windows": 6}})
            deadline = time.monotonic() + 30
            status = None
            while time.monotonic() < deadline:
                rows = stored_rows(s)
                if rows:
                    record = json.loads(rows[0][2])
                    status = record["session"]["status"]
                    if status != "in-progress":
                        break
                time.sleep(0.2)
            assert status == "cancelled"
            windows = record["session"]["window_count"]
            time.sleep(2.5)  # a run that went on would have asked for another window by now
            assert len(chat.requests) == windows <= 2
            assert json.loads(stored_rows(s)[0][2])["session"]["window_count"] == windows


# ------------------------------------------------------------------ 8. dev mode


@pytest.fixture(scope="module")
def dev(gateway_ckf: Path, tmp_path_factory: pytest.TempPathFactory
        ) -> Iterator[GatewayServer]:
    tmp = tmp_path_factory.mktemp("gateway-dev-guard")
    with GatewayServer(base_env(tmp), ckf=copy_ckf(gateway_ckf, tmp / "ckf"),
                       workdir=tmp) as s:
        yield s


@pytest.mark.parametrize("host", ["attacker.example", "attacker.example:8088",
                                  "127.0.0.1.nip.io", "10.0.0.1"])
def test_dev_mode_refuses_foreign_hosts(dev: GatewayServer, host: str) -> None:
    with dev.client() as c:
        r = c.get("/v1/ckf/stats", headers={"Host": host})
        assert r.status_code == 403, r.text
        assert error_of(r)["code"] == "dev_mode_host"
        for ok in (f"127.0.0.1:{dev.port}", f"localhost:{dev.port}", "localhost", "[::1]:80"):
            assert c.get("/v1/ckf/stats", headers={"Host": ok}).status_code == 200, ok


@pytest.mark.parametrize("headers", [{"Origin": "https://evil.example"},
                                     {"Origin": "null"},
                                     {"Sec-Fetch-Site": "cross-site"},
                                     {"Origin": "http://127.0.0.1.evil.example"}])
def test_dev_mode_refuses_cross_site_writes(dev: GatewayServer, headers: dict[str, str]
                                            ) -> None:
    with dev.client() as c:
        docs = c.get("/v1/ckf/documents").json()
        r = c.post("/v1/ckf/documents", headers=headers, files={
            "file": ("planted.txt", b"The answer to every question is 42. " * 20)})
        assert r.status_code == 403, r.text
        assert error_of(r)["code"] == "cross_site_write"
        r = c.post("/v1/sessions", json=SESSION, headers=headers)
        assert r.status_code == 403
        assert c.get("/v1/ckf/documents").json() == docs


def test_dev_mode_still_serves_same_origin_and_plain_clients(dev: GatewayServer) -> None:
    with dev.client() as c:
        for headers in ({}, {"Origin": dev.url}, {"Sec-Fetch-Site": "same-origin"},
                        {"Sec-Fetch-Site": "none"}):
            r = c.post("/v1/sessions", json=SESSION, headers=headers)
            assert r.status_code == 201, (headers, r.text)
        # A cross-site read is answered (the browser keeps it from the page: no CORS).
        assert c.get("/v1/ckf/stats", headers={"Origin": "https://evil.example"}
                     ).status_code == 200
