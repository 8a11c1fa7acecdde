"""A real PostgreSQL for tests and benchmarks: `CDR_TEST_PG_DSN` when set, else a private
server started from the PostgreSQL binaries on this machine, else a visible skip.

The private server: `initdb` into a temp directory (as the `postgres` user via `runuser`
when we are root, since PostgreSQL refuses to run as root), `pg_ctl -w start` listening only
on 127.0.0.1 on a free port, trust authentication (loopback only, throwaway data). It is
stopped by the postmaster's PID (SIGINT = fast shutdown) and its directory removed.

Fixtures (a test module pulls them in with `pytest_plugins = ["tests.pg_server"]`):

* `pg_dsn` (session) — the server's DSN.
* `pg_schema_dsn` (function) — the same server with a fresh, empty schema first on the
  `search_path`, so each test sees its own tables; the schema is dropped afterwards.

PYTEST_DONT_REWRITE
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import quote

import pytest

from tests.gateway_server import free_port

DSN_ENV = "CDR_TEST_PG_DSN"
BIN_DIRS = ("/usr/lib/postgresql/15/bin", "/usr/lib/postgresql/16/bin",
            "/usr/lib/postgresql/17/bin")


def find_bin_dir() -> Path | None:
    """Where `initdb` and `pg_ctl` are: PATH first, then Debian's versioned directories."""
    found = shutil.which("initdb")
    if found and shutil.which("pg_ctl"):
        return Path(found).resolve().parent  # /usr/local/bin/initdb may be a symlink
    for d in BIN_DIRS:
        if (Path(d) / "initdb").exists() and (Path(d) / "pg_ctl").exists():
            return Path(d)
    return None


class LocalPostgres:
    """One private PostgreSQL server; `start()` then `dsn`, `stop()` by PID."""

    def __init__(self, bin_dir: Path, *, fsync: bool = False) -> None:
        self.bin_dir = bin_dir
        self.fsync = fsync
        self.root = Path(tempfile.mkdtemp(prefix="cdr-pg-"))
        self.data = self.root / "data"
        self.port = 0
        self.pid: int | None = None

    @property
    def dsn(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _as_owner(self, cmd: list[str]) -> list[str]:
        if os.geteuid() == 0:
            return ["runuser", "-u", "postgres", "--", *cmd]
        return cmd

    def start(self, timeout: float = 120.0) -> LocalPostgres:
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres", "postgres")
        os.chmod(self.root, 0o700)
        run = {"check": True, "capture_output": True, "timeout": timeout}
        subprocess.run(self._as_owner([
            str(self.bin_dir / "initdb"), "-D", str(self.data), "-U", "postgres",
            "--auth=trust", "--encoding=UTF8", "--locale=C", "--no-sync"]), **run)
        self.port = free_port()
        opts = (f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.root} "
                f"-c max_connections=200 -c fsync={'on' if self.fsync else 'off'}")
        try:
            subprocess.run(self._as_owner([
                str(self.bin_dir / "pg_ctl"), "-D", str(self.data), "-w", "-t",
                str(int(timeout)), "-o", opts, "-l", str(self.root / "server.log"), "start"]),
                **run)
        except subprocess.CalledProcessError as exc:
            log = (self.root / "server.log").read_text(errors="replace")[-3000:]
            raise RuntimeError(f"PostgreSQL did not start: {exc.stderr!r}\n{log}") from exc
        self.pid = int((self.data / "postmaster.pid").read_text().split()[0])
        return self

    def stop(self) -> None:
        """Fast shutdown by PID; SIGKILL if it lingers; then remove the data directory."""
        pid, self.pid = self.pid, None
        if pid is not None:
            try:
                os.kill(pid, signal.SIGINT)
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline:
                    os.kill(pid, 0)
                    time.sleep(0.05)
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        shutil.rmtree(self.root, ignore_errors=True)


def with_schema(dsn: str, schema: str, **server_settings: str) -> str:
    """The DSN with `schema` first on the search path (and other per-connection settings,
    e.g. `synchronous_commit="off"`)."""
    sep = "&" if "?" in dsn else "?"
    opts = " ".join(f"-c{k}={v}" for k, v in {"search_path": schema, **server_settings}.items())
    return f"{dsn}{sep}options={quote(opts, safe='')}"


@pytest.fixture(scope="session")
def pg_dsn() -> Iterator[str]:
    if dsn := os.environ.get(DSN_ENV, "").strip():
        yield dsn
        return
    try:
        import psycopg  # noqa: F401
    except ImportError:
        pytest.skip("PostgreSQL tests need psycopg (pip install 'psycopg[binary,pool]')")
    bin_dir = find_bin_dir()
    if bin_dir is None:
        pytest.skip(f"PostgreSQL tests skipped: no {DSN_ENV} and no initdb/pg_ctl found "
                    "(apt-get install postgresql, or set CDR_TEST_PG_DSN)")
    server = LocalPostgres(bin_dir)
    try:
        server.start()
    except (OSError, subprocess.SubprocessError, RuntimeError) as exc:
        server.stop()
        pytest.skip(f"PostgreSQL tests skipped: could not start a local server ({exc})")
    try:
        yield server.dsn
    finally:
        server.stop()


@contextmanager
def fresh_schema(dsn: str, **server_settings: str) -> Iterator[str]:
    """A new empty schema on the server; yields a DSN that uses it (with `server_settings`
    per connection), drops it afterwards."""
    import psycopg

    schema = f"t_{uuid.uuid4().hex[:16]}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    try:
        yield with_schema(dsn, schema, **server_settings)
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


@pytest.fixture
def pg_schema_dsn(pg_dsn: str) -> Iterator[str]:
    with fresh_schema(pg_dsn) as dsn:
        yield dsn
