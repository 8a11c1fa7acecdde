"""Real gateway processes for tests: `python -m uvicorn --factory cdr.gateway.app:create_app`
(or `python -m cdr.cli serve`) in a subprocess on a loopback port, ready when `/healthz`
answers, stopped by PID.

The uvicorn mode hands the child a socket already bound to a free port (`--fd`), so there is
no race for the port; the CLI mode (which takes `--port`) binds a port found free just before.
The child gets a clean environment (no inherited `CDR_*` but the run's embedding cache,
`tests/conftest.py`) and runs in a temp directory (no stray `.env`).

Fixtures (session-scoped, shared by every gateway test module; a test module pulls them in
with `pytest_plugins = ["tests.gateway_server"]`):

* `gateway_ckf` — a CKF built once with the real MiniLM model from ten Python language
  reference topics (`pydoc_data.topics`: try, exceptions, with, raise, loops, ...), ~100 facts.
* `gateway` — an extractive-writer gateway on that CKF (sessions in their own SQLite file,
  signing secret `SECRET`, bodies limited to `MAX_BODY_BYTES`).

Test modules import constants from here before pytest loads it as a plugin, so assertion
rewriting is off for it (PYTEST_DONT_REWRITE), which also keeps pytest from warning.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import built_once, run_settings

SECRET = "gateway-test-secret-0123456789abcdef"
MAX_BODY_BYTES = 200_000
TOKEN_TTL = 900
TOPICS = ("try", "exceptions", "with", "raise", "for", "while", "break", "continue",
          "context-managers", "assert")
# A task the extractive writer completes in two windows on this CKF (task-complete) under the
# spec's loop; small windows (~200 words) keep the DPE's embedding of each window cheap. The
# gateway tests are about the protocol over the spec loop, so CRP names the spec profile (the
# gateway's default is `focused`, cdr.options.FACES_PROFILE; tests/test_default_profile.py).
TASK = "Write a guide to Python exception handling"
OUTLINE = ["The try statement", "Raising exceptions", "The with statement"]
WORDS = 300
WINDOW_TOKENS = 300
CRP = {"outline": OUTLINE, "words": WORDS, "window_tokens": WINDOW_TOKENS, "max_windows": 4,
       "profile": "spec"}
SRC = Path(__file__).resolve().parents[1] / "src"


def child_env(extra: Mapping[str, str]) -> dict[str, str]:
    """The environment of a child process: ours without `CDR_*` (but the run's settings,
    `tests.conftest.RUN_SETTINGS`), then `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CDR_")} | run_settings()
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SRC), env.get("PYTHONPATH")]))
    env.update(extra)
    return env


def keepalive_seconds(env: Mapping[str, str]) -> int:
    """How long the server keeps an idle keep-alive connection: `CDR_KEEPALIVE_SECONDS` from
    `env`, else the gateway's default (whole seconds: uvicorn's option is an int)."""
    from cdr.gateway.settings import GatewaySettings

    default = GatewaySettings.model_fields["keepalive_seconds"].default
    return max(1, round(float(env.get("CDR_KEEPALIVE_SECONDS", default))))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])



def stop_process(proc: subprocess.Popen[bytes], grace: float) -> None:
    """Stop a child server by its PID: SIGTERM, so it shuts down cleanly, then SIGKILL if it
    is still running after `grace` seconds."""
    if proc.poll() is not None:
        return
    os.kill(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=5)


def delta_text(chunks: Iterable[Any]) -> str:
    """What a streamed chat completion says: its chunks' first-choice deltas, joined (chunks
    without choices, such as the final usage chunk, carry no text)."""
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)

class GatewayServer:
    """One gateway process. `env` holds its `CDR_*` settings."""

    def __init__(self, env: Mapping[str, str], *, via_cli: bool = False,
                 ckf: Path | None = None, workdir: Path | None = None) -> None:
        self.env = dict(env)
        self.via_cli = via_cli
        self.ckf = ckf
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="cdr-gw-"))
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = self.workdir / "server.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def openai_base_url(self) -> str:
        return f"{self.url}/v1"

    def start(self, timeout: float = 90.0) -> GatewayServer:
        log = open(self.log_path, "ab")  # noqa: SIM115 - the child owns it until it exits
        sock = None
        if self.via_cli:
            self.port = free_port()
            cmd = [sys.executable, "-m", "cdr.cli", "serve", "--host", "127.0.0.1",
                   "--port", str(self.port)]
            if self.ckf is not None:
                cmd += ["--ckf", str(self.ckf)]
            pass_fds: tuple[int, ...] = ()
        else:
            sock = socket.socket()
            # uvicorn wraps an `--fd` socket as AF_UNIX, so asyncio never sets TCP_NODELAY on
            # the connections it accepts; Linux copies it from the listener instead. Without
            # it a response written in two sends waits ~40 ms for the client's delayed ACK.
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.bind(("127.0.0.1", 0))
            sock.listen(256)
            self.port = int(sock.getsockname()[1])
            # uvicorn's own default keeps an idle connection 5 s, as long as httpx keeps one:
            # a client then reuses a socket the server is closing ("connection reset by
            # peer" on a POST, which is not retried), which a loaded machine makes likely.
            # `cdr serve` keeps them CDR_KEEPALIVE_SECONDS; so does this process.
            cmd = [sys.executable, "-m", "uvicorn", "--factory", "cdr.gateway.app:create_app",
                   "--fd", str(sock.fileno()), "--log-level", "warning", "--no-access-log",
                   "--timeout-keep-alive", str(keepalive_seconds(self.env))]
            pass_fds = (sock.fileno(),)
        env = child_env(self.env)
        if self.ckf is not None and not self.via_cli:
            env["CDR_CKF"] = str(self.ckf)
        try:
            self.proc = subprocess.Popen(cmd, env=env, cwd=self.workdir, stdout=log,
                                         stderr=subprocess.STDOUT, pass_fds=pass_fds)
        finally:
            log.close()
            if sock is not None:
                sock.close()  # the child holds its own copy
        self._wait_ready(timeout)
        return self

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"gateway exited with {self.proc.returncode}:\n{self.log()}")
            try:
                if httpx.get(f"{self.url}/healthz", timeout=2.0).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"gateway not ready after {timeout} s:\n{self.log()}")

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-5000:]
        except OSError:
            return ""

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None:
            stop_process(proc, grace=15)

    def restart(self) -> GatewayServer:
        self.stop()
        return self.start()

    def client(self, **kw: Any) -> httpx.Client:
        kw.setdefault("timeout", 120.0)
        return httpx.Client(base_url=self.url, **kw)

    def __enter__(self) -> GatewayServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def write_topics(root: Path, names: tuple[str, ...] = TOPICS) -> Path:
    from pydoc_data.topics import topics

    root.mkdir(parents=True, exist_ok=True)
    for name in names:
        (root / f"{name}.txt").write_text(topics[name], encoding="utf-8")
    return root


def build_ckf(path: Path, docs: Path) -> Path:
    from cdr.ckf.handle import CKF
    from cdr.ckf.ingest import ingest

    with CKF.create(path) as ckf:
        report = ingest(ckf, [docs])
        assert report.facts_added > 50, report
    return path


def copy_ckf(src: Path, dst: Path) -> Path:
    """A private copy (for a server whose tests write to its CKF)."""
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("sessions.sqlite3*"))
    return dst


def base_env(tmp: Path, **extra: str) -> dict[str, str]:
    """Dev mode (no API keys, loopback only): these servers test the API, not access control,
    which tests/test_gateway_hostile.py covers with keys."""
    return {"CDR_DEV": "1", "CDR_SIGNING_SECRET": SECRET,
            "CDR_SESSION_DB": str(tmp / "sessions.sqlite3"),
            "CDR_TOKEN_TTL_SECONDS": str(TOKEN_TTL), **extra}


@pytest.fixture(scope="session")
def gateway_ckf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return built_once(tmp_path_factory, "gateway-ckf",
                      lambda root: build_ckf(root / "ckf", write_topics(root / "docs")))


@pytest.fixture(scope="session")
def gateway(gateway_ckf: Path, tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[GatewayServer]:
    tmp = tmp_path_factory.mktemp("gateway-main")
    env = base_env(tmp, CDR_MAX_BODY_BYTES=str(MAX_BODY_BYTES))
    with GatewayServer(env, ckf=gateway_ckf, workdir=tmp) as server:
        yield server


# ------------------------------------------------------------------ `cdr serve` in this process

def cli_in_process(tmp: Path, args: list[str], env: Mapping[str, str],
                   monkeypatch: pytest.MonkeyPatch, *, logging_allowed: bool = False
                   ) -> tuple[int, str, str]:
    """`cdr ARGS` run by typer's CliRunner in this process, with `env` as its only `CDR_*`
    variables and `tmp` as its working directory (no stray `.env`), as a child from
    `child_env` would have them: (exit status, stdout, stderr).

    For the command-line checks that refuse a bad option or setting before anything starts:
    the same command, exit status and stderr as a `cdr` process, without a Python start-up
    and the imports of one (each about a second of CPU, tens of them in a run). Each kind of
    refusal keeps one case in a real process, where a wrong exit path would show.

    It never serves: `uvicorn.run` fails the test if reached. A refusal that comes before
    `cdr serve` configures logging stops there (`logging_allowed` False: configuring it fails
    the test, as it would reconfigure this test worker's logging). With `logging_allowed`,
    `cdr serve` configures logging as it does in a process (its handlers write to the
    captured stderr, so a stray log line shows in the stderr checked), and this worker's
    logging is put back afterwards."""
    import logging.config

    import uvicorn
    from typer.testing import CliRunner

    from cdr.cli import app

    for name in [k for k in os.environ if k.startswith("CDR_")]:
        monkeypatch.delenv(name)
    monkeypatch.chdir(tmp)

    def past_the_check(*_args: object, **_kw: object) -> None:
        raise AssertionError(f"cdr {' '.join(args)} got past its configuration check")

    monkeypatch.setattr(uvicorn, "run", past_the_check)
    if not logging_allowed:
        monkeypatch.setattr(logging.config, "dictConfig", past_the_check)
    with _logging_restored():
        result = CliRunner().invoke(app, args, env=dict(env))
    if isinstance(result.exception, AssertionError):
        raise result.exception
    return result.exit_code, result.stdout, result.stderr


@contextlib.contextmanager
def _logging_restored() -> Iterator[None]:
    """Puts every logger's level, handlers, filters, propagation and disabled flag back as
    they were (`logging.config.dictConfig`, run by `cdr serve` in `cli_in_process`, changes
    them), and closes the handlers it added."""
    import logging

    def loggers() -> dict[str, logging.Logger]:
        found = {name: lg for name, lg in logging.root.manager.loggerDict.items()
                 if isinstance(lg, logging.Logger)}
        return {**found, "": logging.root}

    saved = {name: (lg.level, list(lg.handlers), list(lg.filters), lg.propagate, lg.disabled)
             for name, lg in loggers().items()}
    try:
        yield
    finally:
        for name, lg in loggers().items():
            level, handlers, filters, propagate, disabled = saved.get(
                name, (logging.NOTSET, [], [], True, False))
            for handler in lg.handlers:
                if handler not in handlers:
                    handler.close()
            lg.setLevel(level)
            lg.handlers[:], lg.filters[:] = handlers, filters
            lg.propagate, lg.disabled = propagate, disabled
