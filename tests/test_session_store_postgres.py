"""The PostgreSQL session store on a real server: what the shared contract tests in
test_session_store.py cannot show — processes, SIGKILL, schema migration, the job table,
configuration, and connection errors that name the server but never the password."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cdr.errors import InvalidInputError, NotFoundError
from cdr.gateway.job_store import job_store_for, jobs_path
from cdr.gateway.session_store import (
    MemorySessionStore,
    SessionExistsError,
    SessionStore,
    SessionStoreBusyError,
    SQLiteSessionStore,
    VersionConflictError,
    update_with_retry,
)
from cdr.gateway.session_store_postgres import (
    POSTGRES_SCHEMA_VERSION,
    PostgresSessionStore,
    is_postgres_url,
)
from cdr.gateway.settings import GatewaySettings
from tests.gateway_server import child_env, free_port
from tests.pg_server import fresh_schema

pytest_plugins = ["tests.pg_server"]
psycopg = pytest.importorskip("psycopg", reason="PostgreSQL tests need psycopg "
                              "(pip install 'psycopg[binary,pool]')")


RACE_RETRIES = 100_000


def increment(data: str) -> str:
    obj = json.loads(data)
    obj["n"] += 1
    return json.dumps(obj)


def tables(dsn: str) -> set[str]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = "
                            "current_schema()").fetchall()
    return {r[0] for r in rows}


def test_schema_is_created_with_its_version_and_satisfies_the_protocol(pg_schema_dsn):
    assert tables(pg_schema_dsn) == set()
    with PostgresSessionStore(pg_schema_dsn) as s:
        assert isinstance(s, SessionStore)
        assert s.schema_version() == POSTGRES_SCHEMA_VERSION == 2
    assert tables(pg_schema_dsn) == {"cdr_sessions", "cdr_jobs", "cdr_schema_version"}
    with psycopg.connect(pg_schema_dsn) as conn:
        assert conn.execute("SELECT version FROM cdr_schema_version").fetchall() == [(2,)]


def test_replicas_opening_at_once_migrate_once(pg_schema_dsn):
    stores: list[PostgresSessionStore] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(6)

    def open_one() -> None:
        try:
            barrier.wait()
            stores.append(PostgresSessionStore(pg_schema_dsn))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=open_one) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and len(stores) == 6
    with psycopg.connect(pg_schema_dsn) as conn:
        assert conn.execute("SELECT version FROM cdr_schema_version").fetchall() == [(2,)]
    for s in stores:
        s.close()


def test_a_newer_schema_is_refused_naming_both_versions(pg_schema_dsn):
    PostgresSessionStore(pg_schema_dsn).close()
    with psycopg.connect(pg_schema_dsn, autocommit=True) as conn:
        conn.execute("UPDATE cdr_schema_version SET version = 99")
    with pytest.raises(InvalidInputError, match="schema version 99; this cdr understands up to 2"):
        PostgresSessionStore(pg_schema_dsn)


def test_version_zero_database_is_migrated_and_rows_survive_reopen(pg_schema_dsn):
    with psycopg.connect(pg_schema_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE cdr_schema_version (version int NOT NULL)")  # empty: v0
    with PostgresSessionStore(pg_schema_dsn) as s:
        s.create("a", '{"n": 0}')
        s.create("b", "gone")
        kept = s.cas("a", 1, '{"n": 1, "text": "é ✓ \\u0000"}')
        s.delete("b")
        assert s.create("nul", "a\x00b").data == "a\x00b"
    with PostgresSessionStore(pg_schema_dsn) as s:
        assert s.get("a") == kept
        assert s.list_ids() == ["a", "nul"]
        got = s.get("nul")
        assert got is not None and got.data == "a\x00b"
        assert s.cas("a", 2, "{}").version == 3


def test_jobs_table_is_separate_and_shares_the_pool(pg_schema_dsn):
    with PostgresSessionStore(pg_schema_dsn) as s:
        jobs = job_store_for(s)
        assert isinstance(jobs, PostgresSessionStore)
        s.create("same-id", "session")
        jobs.create("same-id", "job")
        assert (s.get("same-id").data, jobs.get("same-id").data) == ("session", "job")  # type: ignore[union-attr]
        assert jobs.cas("same-id", 1, "job2").version == 2
        jobs.close()  # not the owner: the pool stays open
        assert s.get("same-id") is not None
    with pytest.raises(InvalidInputError, match="closed"):
        jobs.get("same-id")


def test_job_store_follows_the_session_store_kind(tmp_path):
    sqlite = SQLiteSessionStore(tmp_path / "sessions.sqlite3")
    jobs = job_store_for(sqlite)
    assert isinstance(jobs, SQLiteSessionStore)
    assert jobs.path == tmp_path / "sessions.jobs.sqlite3" == jobs_path(sqlite.path)
    assert isinstance(job_store_for(MemorySessionStore()), MemorySessionStore)
    jobs.close()
    sqlite.close()


def _process_worker(dsn: str, count: int, store: PostgresSessionStore) -> None:
    # `store` crossed a fork with the parent's pool inside; the store must open its own.
    # Five processes race on one row: retries are unbounded in effect, since the claim here
    # is no lost update, not how soon a writer gets through on a loaded machine.
    for _ in range(count):
        update_with_retry(store, "hot", increment, retries=RACE_RETRIES)
    store.close()


def test_four_processes_lose_no_update(pg_schema_dsn):
    store = PostgresSessionStore(pg_schema_dsn)
    store.create("hot", '{"n": 0}')
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_process_worker, args=(pg_schema_dsn, 100, store))
             for _ in range(4)]
    for p in procs:
        p.start()
    for _ in range(50):
        update_with_retry(store, "hot", increment, retries=RACE_RETRIES)
    for p in procs:
        p.join(600)
    assert [p.exitcode for p in procs] == [0, 0, 0, 0]
    final = store.get("hot")
    assert final is not None and json.loads(final.data) == {"n": 450}
    assert final.version == 451
    store.close()


def test_committed_writes_survive_sigkill(pg_schema_dsn):
    code = (
        "import os, signal, sys\n"
        "from cdr.gateway.session_store import update_with_retry\n"
        "from cdr.gateway.session_store_postgres import PostgresSessionStore\n"
        "s = PostgresSessionStore(sys.argv[1])\n"
        "s.create('a', '0')\n"
        "for _ in range(25):\n"
        "    update_with_retry(s, 'a', lambda d: str(int(d) + 1))\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1] / "src")}
    proc = subprocess.run([sys.executable, "-c", code, pg_schema_dsn], env=env, timeout=120)
    assert proc.returncode == -signal.SIGKILL
    with PostgresSessionStore(pg_schema_dsn) as s:
        got = s.get("a")
        assert got is not None and (got.data, got.version) == ("25", 26)


def test_unreachable_server_names_it_but_not_the_password():
    port = free_port()  # nothing listens there
    dsn = f"postgresql://cdr:hunter2@127.0.0.1:{port}/cdrdb?connect_timeout=2"
    with pytest.raises(SessionStoreBusyError) as err:
        PostgresSessionStore(dsn, timeout=3)
    message = str(err.value)
    assert f"127.0.0.1:{port}/cdrdb" in message and "hunter2" not in message
    assert err.value.http_status == 503


def test_missing_driver_is_named(monkeypatch):
    monkeypatch.setitem(sys.modules, "psycopg_pool", None)  # import now raises ImportError
    with pytest.raises(InvalidInputError, match=r"needs psycopg 3 .*pip install"):
        PostgresSessionStore("postgresql://127.0.0.1:1/x")


def test_cdr_serve_on_an_unreachable_store_exits_with_one_line(tmp_path):
    port = free_port()
    env = {**child_env({"CDR_SESSION_DB": f"postgresql://cdr:hunter2@127.0.0.1:{port}/db"
                                          "?connect_timeout=2",
                        "CDR_SIGNING_SECRET": "Q7vK2mX9pL4wR8tZ1nB6yH3cJ5dF0gA",
                        "CDR_DEV": "1"})}
    proc = subprocess.run([sys.executable, "-m", "cdr.cli", "serve", "--port", str(port)],
                          env=env, cwd=tmp_path, capture_output=True, text=True, timeout=180)
    assert proc.returncode != 0
    message = " ".join(proc.stderr.split())  # the console wraps long lines
    assert "Traceback" not in message and message.startswith("error: "), proc.stderr
    assert f"cannot connect to the PostgreSQL session store at 127.0.0.1:{port}/db" in message
    assert "hunter2" not in message


def test_bad_configuration_is_refused(pg_schema_dsn):
    with pytest.raises(InvalidInputError, match="postgresql:// URL"):
        PostgresSessionStore("/tmp/sessions.sqlite3")
    with pytest.raises(InvalidInputError, match="pool sizes"):
        PostgresSessionStore(pg_schema_dsn, min_size=4, max_size=2)
    with PostgresSessionStore(pg_schema_dsn) as s, \
            pytest.raises(InvalidInputError, match="NUL"):
        s.create("a\x00b", "x")
    assert is_postgres_url("postgres://h/db") and not is_postgres_url("postgresql.db")


def test_settings_select_postgres_by_url_and_sqlite_otherwise(pg_schema_dsn, tmp_path):
    pg = GatewaySettings(_env_file=None, session_db=pg_schema_dsn).session_store()
    assert isinstance(pg, PostgresSessionStore)
    pg.close()
    path = tmp_path / "s.sqlite3"
    lite = GatewaySettings(_env_file=None, session_db=str(path)).session_store()
    assert isinstance(lite, SQLiteSessionStore) and lite.path == path
    lite.close()


def test_closed_store_refuses_use(pg_schema_dsn):
    s = PostgresSessionStore(pg_schema_dsn)
    s.create("a", "x")
    s.close()
    with pytest.raises(InvalidInputError, match="closed"):
        s.get("a")


ops = st.lists(
    st.tuples(
        st.sampled_from(["create", "cas", "delete", "get"]),
        st.sampled_from(["a", "b", "B", "é"]),
        st.integers(0, 4),
        st.text(max_size=8),
    ),
    max_size=30,
)


@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seq=ops)
def test_property_postgres_matches_a_dict_model(pg_dsn, seq):
    with fresh_schema(pg_dsn) as dsn, PostgresSessionStore(dsn) as s:
        model: dict[str, tuple[int, str]] = {}
        for op, sid, version, data in seq:
            if op == "create":
                if sid in model:
                    with pytest.raises(SessionExistsError):
                        s.create(sid, data)
                else:
                    assert s.create(sid, data).version == 1
                    model[sid] = (1, data)
            elif op == "cas":
                if sid not in model:
                    with pytest.raises(NotFoundError):
                        s.cas(sid, version, data)
                elif model[sid][0] != version:
                    with pytest.raises(VersionConflictError):
                        s.cas(sid, version, data)
                else:
                    assert s.cas(sid, version, data).version == version + 1
                    model[sid] = (version + 1, data)
            elif op == "delete":
                assert s.delete(sid) is (sid in model)
                model.pop(sid, None)
            got = s.get(sid)
            assert (None if got is None else (got.version, got.data)) == model.get(sid)
            assert s.list_ids() == sorted(model)
