"""A hostile (and a sloppy) client against a real `cdr serve` process: every probe of issue 10
except the ingest ones, each as a test that failed before its fix.

The server runs with API keys (one `generate`, one `admin`), a private copy of the test CKF,
small limits and a 2-second read deadline, started through the CLI so that the HTTP protocol
guard (JSON 408/431/400 from the connection layer) is the one users get.
"""

from __future__ import annotations

import json
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openai import OpenAI

from cdr.gateway.auth import hash_key
from tests.chat_server import ChatServer
from tests.gateway_server import (
    CRP,
    OUTLINE,
    SECRET,
    TASK,
    GatewayServer,
    child_env,
    cli_in_process,
    copy_ckf,
)

pytest_plugins = ["tests.gateway_server"]

GEN_KEY = "cdr_gen_Xq3vT9LmP2wR8sK4nB7yH1cJ6dF0gA5e"
ADMIN_KEY = "cdr_adm_Zr8pQ2mW5tY1uI7oL3kJ9hG4fD6sA0xC"
READ_TIMEOUT = 2
GEN = {"Authorization": f"Bearer {GEN_KEY}"}
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}


def key_env(tmp: Path, **extra: str) -> dict[str, str]:
    keys = f"generate:{hash_key(GEN_KEY)},admin:{hash_key(ADMIN_KEY)}"
    return {"CDR_SIGNING_SECRET": SECRET, "CDR_SESSION_DB": str(tmp / "sessions.sqlite3"),
            "CDR_API_KEYS": keys, "CDR_MAX_BODY_BYTES": "3000000",
            "CDR_READ_TIMEOUT_SECONDS": str(READ_TIMEOUT), **extra}


@pytest.fixture(scope="module")
def hostile(gateway_ckf: Path, tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[GatewayServer]:
    tmp = tmp_path_factory.mktemp("gateway-hostile")
    ckf = copy_ckf(gateway_ckf, tmp / "ckf")
    with GatewayServer(key_env(tmp), via_cli=True, ckf=ckf, workdir=tmp) as server:
        yield server


@pytest.fixture()
def http(hostile: GatewayServer) -> Iterator[httpx.Client]:
    with hostile.client(headers=GEN) as c:
        yield c


def _stored(server: GatewayServer) -> list[tuple[Any, ...]]:
    """Every stored session row (id, version, data): what a refusal must leave as it was."""
    with sqlite3.connect(Path(server.env["CDR_SESSION_DB"])) as conn:
        return conn.execute("SELECT * FROM sessions ORDER BY 1").fetchall()


@pytest.fixture()
def store_unchanged(hostile: GatewayServer) -> Iterator[None]:
    """For tests whose every request is refused: the session store is the same afterwards."""
    before = _stored(hostile)
    yield
    assert _stored(hostile) == before


def no_paths(server: GatewayServer, text: str) -> None:
    """No absolute server path in a response: not the work dir, not the CKF, not /tmp."""
    assert str(server.workdir) not in text
    assert str(server.ckf) not in text
    assert "/tmp/" not in text


def raw_json(obj: Any) -> bytes:
    """JSON with `\\ud800`-style escapes (a lone surrogate cannot be encoded as UTF-8)."""
    return json.dumps(obj).encode("ascii")


def error_of(r: httpx.Response) -> dict[str, Any]:
    assert r.headers["content-type"].startswith("application/json"), r.text
    return r.json()["error"]


def session(http: httpx.Client, **extra: Any) -> dict[str, Any]:
    """A session of the spec loop (the gateway's default, focused, may stop this small task
    after one window), which the protocol tests below move window by window."""
    r = http.post("/v1/sessions", json={"task": TASK, "outline": OUTLINE, "words": 300,
                                        "window_tokens": 300, "profile": "spec", **extra})
    assert r.status_code == 201, r.text
    return r.json()


# ------------------------------------------------------------------ 1. access control


def test_no_key_is_401_with_challenge(hostile: GatewayServer) -> None:
    with hostile.client() as c:
        for method, path in [("POST", "/v1/chat/completions"), ("POST", "/v1/sessions"),
                             ("GET", "/v1/ckf/documents"), ("GET", "/v1/ckf/stats"),
                             ("DELETE", "/v1/ckf/documents/abcdef")]:
            r = c.request(method, path, json={})
            assert r.status_code == 401, (path, r.text)
            assert error_of(r)["code"] == "missing_api_key"
            assert r.headers["www-authenticate"].startswith("Bearer")
        bad = c.post("/v1/sessions", json={"task": TASK},
                     headers={"Authorization": "Bearer cdr_not_a_key_at_all_0000000000"})
        assert bad.status_code == 401 and error_of(bad)["code"] == "invalid_api_key"
        assert c.get("/healthz").status_code == 200  # liveness stays open


def test_cross_site_form_cannot_write_the_ckf(hostile: GatewayServer) -> None:
    """What a page on another origin can make a browser send: a multipart POST, no auth."""
    with hostile.client() as c:
        before = c.get("/v1/ckf/documents", headers=GEN).json()
        r = c.post("/v1/ckf/documents", files={"file": ("evil.txt", b"The answer is 42. " * 20)},
                   headers={"Origin": "https://evil.example"})
        assert r.status_code == 401, r.text
        assert c.get("/v1/ckf/documents", headers=GEN).json() == before


def test_generate_key_cannot_write_but_admin_can(hostile: GatewayServer) -> None:
    with hostile.client() as c:
        files = {"file": ("note.txt", b"Hostile tests upload a small note about try. " * 10)}
        r = c.post("/v1/ckf/documents", files=files, headers=GEN)
        assert r.status_code == 403, r.text
        assert error_of(r)["code"] == "insufficient_scope"
        r = c.delete("/v1/ckf/documents/abcdef", headers=GEN)
        assert r.status_code == 403
        r = c.post("/v1/ckf/documents", files=files, headers=ADMIN)
        assert r.status_code == 202, r.text
        no_paths(hostile, r.text)


def test_openai_client_api_key_just_works(hostile: GatewayServer) -> None:
    client = OpenAI(base_url=hostile.openai_base_url, api_key=GEN_KEY, max_retries=0,
                    timeout=120)
    out = client.chat.completions.create(
        model="cdr", messages=[{"role": "user", "content": TASK}],
        extra_body={"crp": {**CRP, "max_windows": 1}})
    assert out.choices[0].message.content
    bad = OpenAI(base_url=hostile.openai_base_url, api_key="wrong", max_retries=0)
    import openai

    with pytest.raises(openai.AuthenticationError):
        bad.chat.completions.create(model="cdr", messages=[{"role": "user", "content": TASK}])


def test_session_token_moves_to_its_own_header(http: httpx.Client) -> None:
    s = session(http)
    sid, token = s["session_id"], s["token"]
    r = http.post(f"/v1/sessions/{sid}/envelope")  # only the API key in Authorization
    assert r.status_code == 401 and error_of(r)["code"] == "missing_token"
    assert "CRP-Session" in error_of(r)["message"]
    r = http.post(f"/v1/sessions/{sid}/envelope", headers={"CRP-Session": token})
    assert r.status_code == 200, r.text


# ------------------------------------------------------------------ 2. bounded, clean input


@pytest.mark.usefixtures("store_unchanged")
def test_chat_content_has_a_limit(http: httpx.Client) -> None:
    r = http.post("/v1/chat/completions",
                  json={"messages": [{"role": "user", "content": "x" * 1_000_000}]})
    assert r.status_code == 422, r.text[:300]
    err = error_of(r)
    assert err["param"] == "messages.0.content"
    assert "100000" in err["message"]
    r = http.post("/v1/chat/completions",  # the task itself: the sessions' limit
                  json={"messages": [{"role": "user", "content": "x" * 20_001}]})
    assert r.status_code == 422 and "20000" in error_of(r)["message"]
    assert error_of(r)["param"] == "messages.0.content"


@pytest.mark.usefixtures("store_unchanged")
@pytest.mark.parametrize("stream", [False, True])
def test_lone_surrogate_in_chat_is_422(http: httpx.Client, stream: bool) -> None:
    body = {"messages": [{"role": "user", "content": "try \ud800 except"}], "stream": stream}
    r = http.post("/v1/chat/completions", content=raw_json(body),
                  headers={"Content-Type": "application/json"})
    assert r.status_code == 422, r.text
    err = error_of(r)
    assert err["code"] == "invalid_unicode" and err["param"] == "messages.0.content"


@pytest.mark.usefixtures("store_unchanged")
@pytest.mark.parametrize("where", ["chat-outline", "outline-list", "outline-str", "task"])
def test_lone_surrogate_elsewhere_is_422(http: httpx.Client, where: str) -> None:
    if where == "chat-outline":
        path, body = "/v1/chat/completions", {
            "messages": [{"role": "user", "content": TASK}], "crp": {"outline": ["a\udc00"]}}
    else:
        path = "/v1/sessions"
        body = {"task": TASK, "outline": "x\ud800y"}
        if where == "outline-list":
            body["outline"] = ["fine", "bad \udfff"]
        elif where == "task":
            body = {"task": "\ud83d"}
    r = http.post(path, content=raw_json(body), headers={"Content-Type": "application/json"})
    assert r.status_code == 422, r.text
    assert error_of(r)["code"] == "invalid_unicode"


def test_lone_surrogate_in_window_text_is_422(http: httpx.Client,
                                             hostile: GatewayServer) -> None:
    s = session(http)
    sid, tok = s["session_id"], s["token"]
    env = http.post(f"/v1/sessions/{sid}/envelope", headers={"CRP-Session": tok}).json()
    before = _stored(hostile)
    r = http.post(f"/v1/sessions/{sid}/windows", content=raw_json({"text": "a \ud800 b"}),
                  headers={"CRP-Session": env["token"], "Content-Type": "application/json"})
    assert r.status_code == 422 and error_of(r)["code"] == "invalid_unicode"
    assert _stored(hostile) == before


@pytest.mark.parametrize("body,field", [
    ({"task": TASK, "max_windows": True}, "max_windows"),
    ({"task": TASK, "words": "300"}, "words"),
    ({"task": TASK, "words": 300.0}, "words"),
])
@pytest.mark.usefixtures("store_unchanged")
def test_strict_types_in_sessions(http: httpx.Client, body: dict[str, Any], field: str) -> None:
    r = http.post("/v1/sessions", json=body)
    assert r.status_code == 422, r.text
    assert error_of(r)["param"] == field


@pytest.mark.usefixtures("store_unchanged")
def test_strict_bool_in_chat(http: httpx.Client) -> None:
    r = http.post("/v1/chat/completions",
                  json={"messages": [{"role": "user", "content": TASK}], "stream": "yes"})
    assert r.status_code == 422, r.text
    assert error_of(r)["param"] == "stream"


@pytest.mark.usefixtures("store_unchanged")
def test_json_with_wrong_content_type_is_415(http: httpx.Client) -> None:
    r = http.post("/v1/sessions", content=json.dumps({"task": TASK}),
                  headers={"Content-Type": "text/plain"})
    assert r.status_code == 415, r.text
    assert "application/json" in error_of(r)["message"]
    r = http.post("/v1/chat/completions", data={"messages": "x"})  # a form post
    assert r.status_code == 415


def test_huge_header_is_json_431(hostile: GatewayServer) -> None:
    with hostile.client() as c:
        r = c.get("/healthz", headers={"X-Big": "a" * 70_000})
    assert r.status_code == 431, r.text
    assert error_of(r)["code"] == "headers_too_large"


def _read_all(sock: socket.socket) -> bytes:
    sock.settimeout(30)  # a generous bound: the bug is "never", not "slow"
    out = b""
    while True:
        try:
            piece = sock.recv(65536)
        except TimeoutError:
            pytest.fail(f"connection still open 30 s later (read deadline {READ_TIMEOUT} s)")
        if not piece:
            return out
        out += piece


def test_body_that_never_arrives_gets_408_and_close(hostile: GatewayServer) -> None:
    with socket.create_connection(("127.0.0.1", hostile.port)) as s:
        s.sendall(b"POST /v1/sessions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  + f"Authorization: Bearer {GEN_KEY}\r\n".encode()
                  + b"Content-Length: 100\r\n\r\n{\"task\":")
        data = _read_all(s)
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408"), data[:200]
    assert json.loads(body)["error"]["code"] == "request_timeout"


def test_headers_that_never_end_are_closed(hostile: GatewayServer) -> None:
    with socket.create_connection(("127.0.0.1", hostile.port)) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        data = _read_all(s)
    assert data.startswith(b"HTTP/1.1 408"), data[:200]
    assert json.loads(data.partition(b"\r\n\r\n")[2])["error"]["code"] == "request_timeout"


def test_an_idle_keep_alive_connection_outlives_the_clients_own_expiry(
        hostile: GatewayServer) -> None:
    """httpx (and so the `openai` package) keeps an idle connection for 5 s. A server that
    closes idle connections at 5 s too races the client's next request on a busy machine:
    the request meets a closing socket ("connection reset by peer") and, being a POST, is
    not retried. The server keeps idle connections longer than that (CDR_KEEPALIVE_SECONDS)."""
    request = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
    with socket.create_connection(("127.0.0.1", hostile.port)) as s:
        s.settimeout(30)
        s.sendall(request)
        assert _read_response(s).startswith(b"HTTP/1.1 200")
        time.sleep(6.5)  # idle past the 5 s a client allows itself
        s.sendall(request)
        again = _read_response(s)
    assert again.startswith(b"HTTP/1.1 200"), again[:200]


def _read_response(sock: socket.socket) -> bytes:
    """One whole response (headers, then content-length bytes); b"" if the server closed."""
    data = b""
    while b"\r\n\r\n" not in data:
        piece = sock.recv(65536)
        if not piece:
            return data
        data += piece
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length:")))
    while len(body) < length:
        piece = sock.recv(65536)
        if not piece:
            break
        body += piece
    return head + b"\r\n\r\n" + body


# ------------------------------------------------------------------ 3. nothing leaks


def test_no_server_paths_in_responses(hostile: GatewayServer, http: httpx.Client) -> None:
    for path in ("/healthz", "/v1/ckf/stats", "/v1/ckf/documents"):
        r = http.get(path)
        assert r.status_code == 200
        no_paths(hostile, r.text)
    docs = http.get("/v1/ckf/documents").json()["documents"]
    assert docs and all(not str(d.get("source", "")).startswith("/") for d in docs)
    r = http.delete("/v1/ckf/documents/%2Fetc%2Fpasswd", headers=ADMIN)
    assert r.status_code == 404
    no_paths(hostile, r.text)


def test_metrics_labels_are_a_fixed_set(hostile: GatewayServer) -> None:
    with socket.create_connection(("127.0.0.1", hostile.port)) as s:
        s.settimeout(10)
        for i in range(40):
            s.sendall(f"FOO{i} /made/up/{i} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            s.recv(65536)
    with hostile.client() as c:
        text = c.get("/metrics").text
    lines = [ln for ln in text.splitlines() if ln.startswith("cdr_http_requests_total{")]
    methods = {ln.split('method="')[1].split('"')[0] for ln in lines}
    routes = {ln.split('route="')[1].split('"')[0] for ln in lines}
    assert methods <= {"GET", "POST", "DELETE", "HEAD", "OPTIONS", "PUT", "PATCH", "other"}
    assert "other" in methods
    assert not any("made" in r for r in routes)


@pytest.fixture(scope="module")
def upstream() -> Iterator[ChatServer]:
    with ChatServer() as server:
        yield server


UPSTREAM_KEY = "sk-upstream-Zm9vYmFyYmF6cXV4MTIzNDU2Nzg5"


@pytest.fixture(scope="module")
def llm_gateway(gateway_ckf: Path, upstream: ChatServer,
                tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayServer]:
    tmp = tmp_path_factory.mktemp("gateway-hostile-llm")
    env = key_env(tmp, CDR_WRITER="openai", CDR_LLM_BASE_URL=upstream.openai_base_url,
                  CDR_LLM_MODEL="m", CDR_LLM_API_KEY=UPSTREAM_KEY)
    with GatewayServer(env, ckf=copy_ckf(gateway_ckf, tmp / "ckf"), workdir=tmp) as server:
        yield server


@pytest.mark.parametrize("stream", [False, True])
def test_upstream_errors_are_summarised_and_redacted(
        llm_gateway: GatewayServer, upstream: ChatServer, stream: bool) -> None:
    upstream.reset()
    echo = (f"bad request; you sent Authorization: Bearer {UPSTREAM_KEY} to "
            f"{upstream.openai_base_url}/chat/completions")
    upstream.fail_next(5, status=400, message=echo)
    with llm_gateway.client(headers=GEN) as c:
        r = c.post("/v1/chat/completions", json={
            "messages": [{"role": "user", "content": TASK}], "stream": stream,
            "crp": {**CRP, "max_windows": 1}})
        text = r.text
        sid, tok = r.headers.get("crp-session-id"), r.headers.get("crp-set-session")
        if sid and tok:
            text += c.get(f"/v1/sessions/{sid}", headers={"CRP-Session": tok}).text
    assert UPSTREAM_KEY not in text and "Zm9vYmFy" not in text
    assert upstream.url not in text and "127.0.0.1" not in text
    if not stream:
        assert r.status_code == 502
        err = error_of(r)
        assert err["upstream_status"] == 400 and "400" in err["message"]
    else:
        assert "upstream" in text and "400" in text


# ------------------------------------------------------------------ 4. idempotent windows

WINDOW_TEXT = ("The try statement specifies exception handlers and cleanup code. " * 12)


def _envelope(http: httpx.Client) -> tuple[str, str]:
    s = session(http)
    sid = s["session_id"]
    env = http.post(f"/v1/sessions/{sid}/envelope", headers={"CRP-Session": s["token"]})
    assert env.status_code == 200, env.text
    return sid, env.json()["token"]


def test_resent_window_returns_the_original_result(http: httpx.Client) -> None:
    sid, tok = _envelope(http)
    first = http.post(f"/v1/sessions/{sid}/windows", json={"text": WINDOW_TEXT},
                      headers={"CRP-Session": tok})
    assert first.status_code == 200, first.text
    again = http.post(f"/v1/sessions/{sid}/windows", json={"text": WINDOW_TEXT},
                      headers={"CRP-Session": tok})
    assert again.status_code == 200, again.text
    a, b = first.json(), again.json()
    assert {k: v for k, v in a.items() if k not in ("token", "headers")} == \
           {k: v for k, v in b.items() if k not in ("token", "headers")}
    assert again.headers["crp-set-session"] == b["token"]
    # the replayed token is current: it moves the session on
    nxt = http.post(f"/v1/sessions/{sid}/envelope", headers={"CRP-Session": b["token"]})
    assert nxt.status_code == 200, nxt.text
    other = http.post(f"/v1/sessions/{sid}/windows", json={"text": WINDOW_TEXT + " changed"},
                      headers={"CRP-Session": tok})
    assert other.status_code == 409 and error_of(other)["code"] == "stale_token"
    trace = http.get(f"/v1/sessions/{sid}", headers={"CRP-Session": nxt.json()["token"]})
    assert len(trace.json()["windows"]) == 1
    assert "submission" not in trace.text


def test_concurrent_duplicates_make_one_window(http: httpx.Client, hostile: GatewayServer
                                                ) -> None:
    sid, tok = _envelope(http)
    results: list[httpx.Response] = []

    def send() -> None:
        with hostile.client(headers=GEN) as c:
            results.append(c.post(f"/v1/sessions/{sid}/windows", json={"text": WINDOW_TEXT},
                                  headers={"CRP-Session": tok}))

    threads = [threading.Thread(target=send) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [r.status_code for r in results] == [200] * 6, [r.text for r in results]
    assert {r.json()["window"] for r in results} == {1}
    token = results[0].json()["token"]
    trace = http.get(f"/v1/sessions/{sid}", headers={"CRP-Session": token}).json()
    assert len(trace["windows"]) == 1


# ------------------------------------------------------------------ 5. configuration


def _serve(tmp: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cdr.cli", "serve", "--port", "1", *args],
        env=child_env(env), cwd=tmp, capture_output=True, text=True, timeout=120)


# Values refused as the settings load, before `cdr serve` configures logging, and values
# refused as the gateway is built, after it has: one of each kind (a zero token lifetime, a
# short signing secret) is checked in a real `cdr serve` process, the others in-process
# (`cli_in_process`: the same command, stderr and exit status, without a Python start-up
# and the gateway's imports each).
IN_A_PROCESS = ({"CDR_TOKEN_TTL_SECONDS": "0"}, {"CDR_SIGNING_SECRET": "aaaaaaaaaaaaaaaa"})
REFUSED_AS_SETTINGS_LOAD = ({"CDR_TOKEN_TTL_SECONDS": "abc"}, {"CDR_MAX_BODY_BYTES": "0"},
                            {"CDR_READ_TIMEOUT_SECONDS": "0"})


@pytest.mark.parametrize("extra,needle", [
    ({"CDR_TOKEN_TTL_SECONDS": "0"}, "CDR_TOKEN_TTL_SECONDS"),
    ({"CDR_TOKEN_TTL_SECONDS": "abc"}, "CDR_TOKEN_TTL_SECONDS"),
    ({"CDR_MAX_BODY_BYTES": "0"}, "CDR_MAX_BODY_BYTES"),
    ({"CDR_SIGNING_SECRET": "aaaaaaaaaaaaaaaa"}, "CDR_SIGNING_SECRET"),
    ({"CDR_API_KEYS": ""}, "CDR_API_KEYS"),
    ({"CDR_API_KEYS": "root:abc"}, "CDR_API_KEYS"),
    ({"CDR_API_KEYS": "admin:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"}, "CDR_API_KEYS"),
    ({"CDR_API_KEYS": "admin:sha256:1234"}, "CDR_API_KEYS"),
    ({"CDR_READ_TIMEOUT_SECONDS": "0"}, "CDR_READ_TIMEOUT_SECONDS"),
])
def test_config_errors_are_one_line_exit_2(tmp_path: Path, extra: dict[str, str],
                                           needle: str, monkeypatch: pytest.MonkeyPatch
                                           ) -> None:
    env = {**key_env(tmp_path), **extra}
    env = {k: v for k, v in env.items() if v}
    if extra in IN_A_PROCESS:
        proc = _serve(tmp_path, env)
        status, stderr = proc.returncode, proc.stderr
    else:
        status, _, stderr = cli_in_process(
            tmp_path, ["serve", "--port", "1"], env, monkeypatch,
            logging_allowed=extra not in REFUSED_AS_SETTINGS_LOAD)
    assert status == 2, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], lines


def test_dev_mode_binds_loopback_only(tmp_path: Path) -> None:
    env = {"CDR_DEV": "1", "CDR_SESSION_DB": str(tmp_path / "s.db")}
    proc = _serve(tmp_path, env, "--host", "0.0.0.0")
    assert proc.returncode == 2
    assert "loopback" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_keygen_prints_a_key_and_its_hash(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "cdr.cli", "keygen", "--scope", "admin"],
                          env=child_env({}), cwd=tmp_path, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    out = dict(line.split("=", 1) for line in proc.stdout.strip().splitlines())
    assert out["CDR_API_KEYS"] == f"admin:{hash_key(out['key'])}"


# ------------------------------------------------------------------ refusals leave no trace


def test_refused_session_creation_stores_nothing(hostile: GatewayServer,
                                                 http: httpx.Client) -> None:
    before = _stored(hostile)
    for body in ({"task": "x" * 20_001}, {"task": "\ud800"}, {"task": TASK, "words": True}):
        r = http.post("/v1/sessions", content=raw_json(body),
                      headers={"Content-Type": "application/json"})
        assert r.status_code == 422
    assert _stored(hostile) == before


# ------------------------------------------------------------------ hypothesis over text fields

# Any code point (lone surrogates included), control characters, and sizes at the limits.
_ANY_CHAR = st.characters(exclude_categories=())
TEXTS = st.one_of(
    st.text(_ANY_CHAR, max_size=40),
    st.text(st.sampled_from("\x00\x01\x08\x0b\x1b\x7f\x85\u2028\ufeff\ufffe\ud800\udfff a."),
            min_size=1, max_size=40),
    st.builds(lambda c, n: c * n, st.sampled_from(["a ", "\x1b", "\ud83d", "é"]),
              st.sampled_from([0, 10_000, 10_001, 50_001, 200_001])),
)
FUZZ = settings(max_examples=25, deadline=None, derandomize=True,
                suppress_health_check=list(HealthCheck))


def _post(c: httpx.Client, path: str, body: Any, **headers: str) -> httpx.Response:
    r = c.post(path, content=raw_json(body),
               headers={"Content-Type": "application/json", **headers})
    assert r.status_code < 500, r.text[:500]
    assert r.headers["content-type"].startswith("application/json")
    return r


def _sessions(server: GatewayServer) -> int:
    return len(_stored(server))


@FUZZ
@given(task=TEXTS, outline=st.one_of(st.none(), TEXTS, st.lists(TEXTS, max_size=3)))
def test_fuzz_session_text(hostile: GatewayServer, task: str, outline: Any) -> None:
    body: dict[str, Any] = {"task": task, "words": 300, "window_tokens": 300}
    if outline is not None:
        body["outline"] = outline
    before = _sessions(hostile)
    with hostile.client(headers=GEN, timeout=60) as c:
        r = _post(c, "/v1/sessions", body)
    assert _sessions(hostile) == before + (1 if r.status_code == 201 else 0)
    if r.status_code != 201:
        assert r.json()["error"]["message"]


@FUZZ
@given(content=TEXTS)
def test_fuzz_chat_content(hostile: GatewayServer, content: str) -> None:
    before = _sessions(hostile)
    body = {"messages": [{"role": "system", "content": content},
                         {"role": "user", "content": content}],
            "crp": {"max_windows": 1, "words": 100, "window_tokens": 100}}
    with hostile.client(headers=GEN, timeout=120) as c:
        r = _post(c, "/v1/chat/completions", body)
    if r.status_code == 422:
        assert _sessions(hostile) == before


@FUZZ
@given(text=TEXTS)
def test_fuzz_window_text(hostile: GatewayServer, text: str) -> None:
    with hostile.client(headers=GEN, timeout=120) as c:
        sid, tok = _envelope(c)
        r = _post(c, f"/v1/sessions/{sid}/windows", {"text": text}, **{"CRP-Session": tok})
        token = r.json()["token"] if r.status_code == 200 else tok
        trace = c.get(f"/v1/sessions/{sid}", headers={"CRP-Session": token}).json()
    assert len(trace["windows"]) == (1 if r.status_code == 200 else 0)


def test_headers_over_the_limit_in_pieces_get_json_431(hostile: GatewayServer) -> None:
    """Headers still incomplete past CDR_MAX_HEADER_BYTES: refused by the HTTP layer."""
    with socket.create_connection(("127.0.0.1", hostile.port)) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        for _ in range(5):
            s.sendall(b"X-Pad: " + b"p" * 10_000 + b"\r\n")
        data = _read_all(s)
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 431"), data[:200]
    assert json.loads(body)["error"]["code"] == "headers_too_large"
