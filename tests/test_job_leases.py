"""Job leases in every store kind (memory, SQLite, PostgreSQL): the replica running an upload
job owns it and renews a lease; whoever looks at a job whose lease ran out marks it failed,
atomically against a renewal — and never a job whose owner is still renewing. Plus the
schema migrations that add the lease columns, with the rows already stored kept.

`reap_job` is exercised here on real stores with jobs written the way a replica writes
them, and `IngestJobs`' heartbeat keeps a live owner's job from being reaped; the SIGKILL of a
real replica mid-upload is in `test_gateway_job_crash.py`.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from cdr.gateway.job_store import LEASE_EXPIRED, reap_job
from cdr.gateway.session_store import MemorySessionStore, SessionStore, SQLiteSessionStore

pytest_plugins = ["tests.pg_server"]


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def jobs(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SessionStore]:
    if request.param == "memory":
        yield MemorySessionStore()  # type: ignore[misc]
    elif request.param == "sqlite":
        s = SQLiteSessionStore(tmp_path / "sessions.jobs.sqlite3")
        yield s  # type: ignore[misc]
        s.close()
    else:
        from cdr.gateway.session_store_postgres import PostgresSessionStore

        dsn = request.getfixturevalue("pg_schema_dsn")
        with PostgresSessionStore(dsn) as sessions:
            yield sessions.job_store()  # type: ignore[misc]


def job(status: str, jid: str = "j1") -> str:
    return json.dumps({"id": jid, "status": status, "files": ["a.md"], "created": 1.0,
                       "started": 2.0, "finished": None, "report": None, "documents": [],
                       "error": None})


def test_one_owner_takes_a_lease_and_only_it_renews_or_releases(jobs) -> None:
    assert not jobs.take_lease("nope", "A", 10.0)  # no such job
    jobs.create("j1", job("queued"))
    assert jobs.lease_of("j1") is None
    assert jobs.take_lease("j1", "A", 10.0)
    assert not jobs.take_lease("j1", "B", 99.0)  # owned: B cannot steal it
    assert jobs.lease_of("j1") == ("A", 10.0)
    assert not jobs.renew_lease("j1", "B", 50.0)
    assert jobs.renew_lease("j1", "A", 20.0) and jobs.lease_of("j1") == ("A", 20.0)
    assert jobs.get("j1").version == 1  # a renewal is not a data write
    assert jobs.renew_lease("j1", "A", None)  # released at the end of the job
    assert jobs.lease_of("j1") == ("A", None)
    assert not jobs.renew_lease("j1", "A", 30.0)  # a released lease stays released
    assert jobs.expired_ids(1e12) == []


def test_an_expired_lease_is_ended_once_and_a_renewal_in_between_wins(jobs) -> None:
    jobs.create("j1", job("running"))
    jobs.create("j2", job("running", "j2"))
    jobs.take_lease("j1", "A", 10.0)
    jobs.take_lease("j2", "B", 100.0)
    assert jobs.expired_ids(50.0) == ["j1"]
    v = jobs.get("j1").version
    # A renewal lands after the reaper read the row: the reaper's write must not happen.
    assert jobs.renew_lease("j1", "A", 60.0)
    assert not jobs.expire_lease("j1", v, job("failed"), 50.0)
    assert json.loads(jobs.get("j1").data)["status"] == "running"
    # Expired for real: one of two racing reapers wins, the other sees nothing to do.
    results: list[bool] = []
    barrier = threading.Barrier(2)

    def reap() -> None:
        barrier.wait()
        results.append(jobs.expire_lease("j1", v, job("failed"), 70.0))

    threads = [threading.Thread(target=reap) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == [False, True]
    row = jobs.get("j1")
    assert row.version == v + 1 and json.loads(row.data)["status"] == "failed"
    assert jobs.lease_of("j1") == ("A", None)
    assert not jobs.renew_lease("j1", "A", 99.0)  # the dead owner cannot revive it
    assert jobs.expired_ids(70.0) == []
    assert jobs.lease_of("j2") == ("B", 100.0)  # the other job is untouched


@pytest.mark.parametrize("status", ["queued", "running"])
def test_reaping_marks_an_abandoned_job_failed_with_a_clear_error(jobs, status: str) -> None:
    jobs.create("j1", job(status))
    jobs.take_lease("j1", "A", 10.0)
    assert reap_job(jobs, "j1", now=9.0) is None  # lease not yet out: nothing changes
    out = reap_job(jobs, "j1", now=11.0)
    assert out is not None and out["status"] == "failed" and out["finished"] == 11.0
    assert LEASE_EXPIRED in out["error"] and "upload the same files again" in out["error"]
    assert json.loads(jobs.get("j1").data) == out
    assert reap_job(jobs, "j1", now=99.0) is None  # once


def test_a_finished_job_with_a_stale_lease_is_left_alone(jobs) -> None:
    """The owner stored `succeeded` but died before releasing its lease."""
    jobs.create("j1", job("succeeded"))
    jobs.take_lease("j1", "A", 10.0)
    assert reap_job(jobs, "j1", now=50.0) is None
    assert json.loads(jobs.get("j1").data)["status"] == "succeeded"


def test_sqlite_version_1_file_is_migrated_keeping_its_rows(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite3"
    with sqlite3.connect(path) as raw:  # exactly what schema version 1 created
        raw.execute("CREATE TABLE sessions (id TEXT PRIMARY KEY, version INTEGER NOT NULL, "
                    "data TEXT NOT NULL, created REAL NOT NULL, updated REAL NOT NULL)")
        raw.execute("INSERT INTO sessions VALUES ('s1', 3, '{\"x\": 1}', 1.0, 2.0)")
        raw.execute("PRAGMA user_version = 1")
    with SQLiteSessionStore(path) as s:
        row = s.get("s1")
        assert (row.version, row.data, row.created, row.updated) == (3, '{"x": 1}', 1.0, 2.0)
        assert s.lease_of("s1") is None and s.take_lease("s1", "A", 5.0)
    with sqlite3.connect(path) as raw:
        assert raw.execute("PRAGMA user_version").fetchone() == (2,)
        cols = [r[1] for r in raw.execute("PRAGMA table_info(sessions)")]
    assert cols == ["id", "version", "data", "created", "updated", "owner", "lease_until"]
    SQLiteSessionStore(path).close()  # reopening a migrated file changes nothing


def test_postgres_version_1_schema_is_migrated_keeping_its_rows(pg_schema_dsn: str) -> None:
    import psycopg

    from cdr.gateway.session_store_postgres import MIGRATIONS, PostgresSessionStore

    with psycopg.connect(pg_schema_dsn, autocommit=True) as conn:  # a v1 database
        conn.execute("CREATE TABLE cdr_schema_version (version int NOT NULL)")
        for sql in MIGRATIONS[0]:
            conn.execute(sql)
        conn.execute("INSERT INTO cdr_schema_version VALUES (1)")
        conn.execute("INSERT INTO cdr_jobs VALUES ('j1', 4, %s, 1.0, 2.0)",
                     (job("running").encode(),))
    with PostgresSessionStore(pg_schema_dsn) as s:
        assert s.schema_version() == 2
        jobs = s.job_store()
        assert jobs.get("j1").version == 4 and json.loads(jobs.get("j1").data)["id"] == "j1"
        assert jobs.lease_of("j1") is None and jobs.take_lease("j1", "A", 5.0)
        with pytest.raises(Exception, match="upload jobs only"):
            s.take_lease("j1", "A", 5.0)  # the sessions table has no leases


def test_a_live_owner_keeps_its_job_and_a_stopped_one_loses_it(tmp_path: Path) -> None:
    """The heartbeat renews past several lease lengths; once it stops (as when the process
    dies), the job is reaped."""
    import time

    from cdr.gateway.jobs import IngestJobs

    store = SQLiteSessionStore(tmp_path / "jobs.sqlite3")
    jobs = IngestJobs(None, store=store, lease_seconds=3.0)  # type: ignore[arg-type]
    store.create("j1", job("running"))
    jobs._lease("j1")
    time.sleep(7.0)  # more than two lease lengths
    assert jobs.reap("j1") is None
    assert jobs.get("j1").status == "running"
    jobs.close()  # the heartbeat stops: the owner is gone
    owner, until = store.lease_of("j1")
    assert owner == jobs.owner and until is not None
    time.sleep(max(0.0, until - time.time()) + 0.2)
    assert jobs.get("j1").status == "failed"  # a read reaps it
    assert jobs.get("j1").to_json()["error"].startswith(LEASE_EXPIRED)
    store.close()
