"""Operations around the API on a real `cdr serve` process: JSON logs with one object per
request and its id echoed, no secret in the log whatever the client puts where, `/readyz`,
per-key rate limits (429 + Retry-After, per scope), `--root-path`, `--workers`, and the
refusals of bad settings (one line, exit 2)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from cdr.gateway.auth import hash_key
from cdr.gateway.ops import load_rate_limits, readiness
from cdr.gateway.settings import GatewayConfigError
from tests.gateway_server import SECRET, GatewayServer, child_env, cli_in_process, free_port

pytest_plugins = ["tests.gateway_server"]

GEN_KEY = "cdr_gEnErAtEkEyQ7vT9LmP2wR8sK4nB7yH1"
ADMIN_KEY = "cdr_aDmInKeYcJ6dF0gA5eXq3vT9LmP2wR8"
LIMITED_KEY = "cdr_lImItEdKeYr8sK4nB7yH1cJ6dF0gA5e"  # used by the rate-limit test only
BODY_SECRET = "sk-bodysecret-9f8e7d6c5b4a3f2e1d0c"
QUERY_SECRET = "sk-querysecret-1a2b3c4d5e6f7a8b9c0d"
HEADER_SECRET = "sk-headersecret-0f1e2d3c4b5a69788796"


class CliServer(GatewayServer):
    """`cdr serve` with extra command-line options; its stderr (the log) in `log_path`."""

    def __init__(self, env: dict[str, str], args: list[str], *, ckf: Path,
                 workdir: Path) -> None:
        super().__init__(env, via_cli=True, ckf=ckf, workdir=workdir)
        self.args = args

    def start(self, timeout: float = 240.0) -> CliServer:
        self.port = free_port()
        cmd = [sys.executable, "-m", "cdr.cli", "serve", "--host", "127.0.0.1", "--port",
               str(self.port), "--ckf", str(self.ckf), *self.args]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(cmd, env=child_env(self.env), cwd=self.workdir,
                                         stdout=log, stderr=subprocess.STDOUT)
        self._wait_ready(timeout)
        return self

    def records(self) -> list[dict[str, object]]:
        lines = self.log_path.read_text(errors="replace").splitlines()
        return [json.loads(x) for x in lines if x.startswith("{")]

    def request_records(self, ids: list[str], wait: float = 30.0) -> dict[str, dict[str, object]]:
        """The request log's records by id, once all of `ids` are in (a record is written
        after its response went out, so the client can be a moment ahead of the log)."""
        deadline = time.monotonic() + wait
        while True:
            found = {str(x["request_id"]): x for x in self.records()
                     if x["logger"] == "cdr.request"}
            if set(ids) <= set(found) or time.monotonic() > deadline:
                return found
            time.sleep(0.1)


def _env(tmp: Path, **extra: str) -> dict[str, str]:
    return {"CDR_SIGNING_SECRET": SECRET, "CDR_SESSION_DB": str(tmp / "sessions.sqlite3"),
            "CDR_API_KEYS": f"generate:{hash_key(GEN_KEY)},admin:{hash_key(ADMIN_KEY)},"
                            f"generate:{hash_key(LIMITED_KEY)}",
            **extra}


@pytest.fixture(scope="module")
def server(gateway_ckf: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[CliServer]:
    tmp = tmp_path_factory.mktemp("gw-ops")
    env = _env(tmp, CDR_RATE_LIMITS="generate=3/minute")
    with CliServer(env, ["--log-format", "json", "--log-level", "info", "--root-path", "/cdr"],
                   ckf=gateway_ckf, workdir=tmp) as s:
        yield s


def test_request_log_is_one_json_object_per_request_with_its_id(server: CliServer) -> None:
    ids = []
    with server.client() as c:
        r = c.get("/readyz", headers={"X-Request-ID": "trace-42.a_b"})
        assert r.headers["x-request-id"] == "trace-42.a_b"  # a plain token is kept
        ids.append("trace-42.a_b")
        r = c.get("/healthz", headers={"X-Request-ID": b"bad id\xe9<script>"})
        assert len(r.headers["x-request-id"]) == 32 and r.headers["x-request-id"].isalnum()
        ids.append(r.headers["x-request-id"])
        r = c.get("/v1/ckf/stats", headers={"Authorization": f"Bearer {ADMIN_KEY}"})
        assert r.status_code == 200
        ids.append(r.headers["x-request-id"])
    by_id = server.request_records(ids)
    requests = [x for x in server.records() if x["logger"] == "cdr.request"]
    assert [by_id[i]["path"] for i in ids] == ["/readyz", "/healthz", "/v1/ckf/stats"]
    assert by_id[ids[2]]["status"] == 200 and by_id[ids[2]]["scope"] == "admin"
    assert by_id[ids[2]]["key_id"] == hash_key(ADMIN_KEY).split(":")[1][:8]
    assert len([x for x in requests if x["request_id"] in ids]) == 3  # one each


def test_no_secret_reaches_the_log(server: CliServer) -> None:
    """Hostile: keys in the Authorization header, the query and the JSON body, on refused and
    on accepted requests, with an error path that quotes input; then grep the whole log."""
    with server.client() as c:
        c.get(f"/v1/ckf/stats?api_key={QUERY_SECRET}",
              headers={"Authorization": f"Bearer {HEADER_SECRET}"})
        c.post(f"/v1/sessions?key={QUERY_SECRET}", headers={"Authorization": f"Bearer {GEN_KEY}",
                                                              "X-Api-Key": HEADER_SECRET},
               json={"task": f"write {BODY_SECRET}", "outline": [BODY_SECRET],
                     "api_key": BODY_SECRET})
        c.post("/v1/chat/completions", headers={"Authorization": f"Bearer {ADMIN_KEY}"},
               content=f'{{"model": "x", "messages": "{BODY_SECRET}"}}')
        last = c.get(f"/nope/{QUERY_SECRET}?token={QUERY_SECRET}",
                     headers={"Authorization": f"Bearer {ADMIN_KEY}"})
    server.request_records([last.headers["x-request-id"]])
    log = server.log_path.read_text(errors="replace")
    for secret in (GEN_KEY, ADMIN_KEY, LIMITED_KEY, BODY_SECRET, QUERY_SECRET, HEADER_SECRET,
                   SECRET):
        assert secret not in log
    assert "/nope/" in log and "cdr.request" in log  # the requests were logged


def test_the_log_says_plainly_where_the_gateway_listens(server: CliServer) -> None:
    """The bind lines (ours and uvicorn's) keep the address an operator needs; the masking of
    URLs and addresses stays on for every other line."""
    messages = {(r["logger"], str(r["message"])) for r in server.records()}
    where = f"http://127.0.0.1:{server.port}"
    assert any(n == "cdr.gateway" and m.startswith(f"cdr gateway on {where}")
               for n, m in messages), messages
    assert any(n == "uvicorn.error" and where in m for n, m in messages), messages


def test_bind_lines_keep_addresses_but_not_secrets() -> None:
    from cdr.gateway.redact import redact, register_secret

    register_secret("s3cr3t-value-for-the-bind-line-test")
    line = "cdr gateway on http://10.0.0.5:8088 (writer s3cr3t-value-for-the-bind-line-test)"
    kept = redact(line, keep_addresses=True)
    assert "http://10.0.0.5:8088" in kept and "s3cr3t" not in kept
    assert "10.0.0.5" not in redact(line)  # every other line: masked as before


def test_readyz_reports_the_kb_and_the_store(server: CliServer) -> None:
    r = httpx.get(f"{server.url}/readyz", timeout=30)  # open: no key needed
    assert r.status_code == 200
    assert r.json() == {"kbs": {"default": "ok"}, "store": "ok", "status": "ready"}


def test_readiness_names_what_failed() -> None:
    class Broken:
        def get(self, _: str) -> None:
            raise OSError("database is locked")

    class NoSnapshot:
        name = "docs"

        class kb:  # stands in for the KB handle
            @staticmethod
            def current() -> None:
                return None

    ready, report = readiness([NoSnapshot()], Broken())
    assert not ready and report == {"kbs": {"docs": "RuntimeError: no snapshot loaded"},
                                    "store": "OSError: database is locked",
                                    "status": "not ready"}


def test_rate_limit_per_scope_with_retry_after(server: CliServer) -> None:
    gen = {"Authorization": f"Bearer {LIMITED_KEY}"}
    with server.client() as c:
        codes = [c.get("/v1/models", headers=gen).status_code for _ in range(4)]
        assert codes[:3] == [200, 200, 200] and codes[3] == 429
        r = c.get("/v1/models", headers=gen)
        assert r.status_code == 429 and 1 <= int(r.headers["retry-after"]) <= 60
        assert r.json()["error"]["code"] == "rate_limited"
        # Another key of the scope, another scope's key and the open paths: not limited.
        for other in (GEN_KEY, ADMIN_KEY):
            assert c.get("/v1/models", headers={"Authorization": f"Bearer {other}"}
                         ).status_code == 200
        assert all(c.get("/healthz").status_code == 200 for _ in range(5))


def test_root_path_serves_the_same_routes_and_describes_the_prefix(server: CliServer) -> None:
    r = httpx.get(f"{server.url}/openapi.json", timeout=30)
    assert r.status_code == 200 and r.json()["servers"] == [{"url": "/cdr"}]


@pytest.mark.parametrize(("args", "env", "needle"), [
    (["--log-format", "xml"], {}, "--log-format must be one of text, json"),
    (["--log-level", "loud"], {}, "--log-level must be one of"),
    ([], {"CDR_RATE_LIMITS": "generate=lots"}, "CDR_RATE_LIMITS: 'lots' is not a rate"),
    ([], {"CDR_RATE_LIMITS": "root=1/second"}, "CDR_RATE_LIMITS: 'root=1/second' is not"),
])
def test_bad_ops_settings_are_one_line_exit_2(tmp_path: Path, args: list[str],
                                              env: dict[str, str], needle: str,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A bad log option is refused before `cdr serve` configures logging, a bad rate limit
    after: the first of each kind in a real `cdr serve` process, the other in this one
    (`cli_in_process`: the same exit and stderr, without a process start-up)."""
    port = str(free_port())
    if args == ["--log-format", "xml"] or env == {"CDR_RATE_LIMITS": "generate=lots"}:
        proc = subprocess.run(
            [sys.executable, "-m", "cdr.cli", "serve", "--port", port, *args],
            env={**{k: v for k, v in os.environ.items() if not k.startswith("CDR_")},
                 **_env(tmp_path), **env},
            capture_output=True, text=True, timeout=120, cwd=tmp_path)
        status, stderr = proc.returncode, proc.stderr
    else:
        status, _, stderr = cli_in_process(tmp_path, ["serve", "--port", port, *args],
                                           {**_env(tmp_path), **env}, monkeypatch,
                                           logging_allowed="CDR_RATE_LIMITS" in env)
    assert status == 2, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], stderr


def test_rate_limit_settings_parse() -> None:
    assert load_rate_limits({}) is None
    limits = load_rate_limits({"CDR_RATE_LIMITS": "generate=2/second; admin=5/minute"})
    assert limits is not None and set(limits.per_scope) == {"generate", "admin"}
    assert [limits.hit("generate", "k1") for _ in range(2)] == [None, None]
    wait = limits.hit("generate", "k1")
    assert wait is not None and wait >= 1.0
    assert limits.hit("generate", "k2") is None  # counted per key
    with pytest.raises(GatewayConfigError, match="CDR_RATE_LIMIT_STORAGE"):
        load_rate_limits({"CDR_RATE_LIMITS": "admin=1/second",
                          "CDR_RATE_LIMIT_STORAGE": "nosuch://x"})


def test_two_workers_share_sessions(gateway_ckf: Path, tmp_path: Path) -> None:
    env = {"CDR_DEV": "1", "CDR_SIGNING_SECRET": SECRET}
    with CliServer(env, ["--workers", "2", "--log-format", "json"], ckf=gateway_ckf,
                   workdir=tmp_path) as s, s.client() as c:
        deadline = time.monotonic() + 240  # the second worker may still be starting

        def started() -> int:
            return sum("Application startup complete" in str(x.get("message"))
                       for x in s.records())

        while started() < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert started() == 2, s.log()
        assert c.get("/readyz").status_code == 200
        created = c.post("/v1/sessions", json={"task": "Write a guide to Python exceptions"})
        assert created.status_code in (200, 201), created.text
        sid, token = created.json()["session_id"], created.json()["token"]
        # Fresh connections spread over the workers: every one finds the session.
        for _ in range(6):
            r = httpx.get(f"{s.url}/v1/sessions/{sid}", timeout=60,
                          headers={"CRP-Session": token, "Connection": "close"})
            assert r.status_code == 200, r.text
