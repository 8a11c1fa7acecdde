"""Session stores: CAS semantics, no lost update under thread and process contention,
durability across reopen and process kill."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cdr.errors import InvalidInputError, NotFoundError
from cdr.gateway.session_store import (
    MemorySessionStore,
    SessionExistsError,
    SessionStore,
    SQLiteSessionStore,
    StoredSession,
    VersionConflictError,
    update_with_retry,
)
from cdr.gateway.session_store_postgres import PostgresSessionStore

pytest_plugins = ["tests.pg_server"]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SessionStore]:
    s: SessionStore
    if request.param == "memory":
        s = MemorySessionStore(clock=Clock())
    elif request.param == "postgres":  # a real server; skips with the reason when absent
        s = PostgresSessionStore(request.getfixturevalue("pg_schema_dsn"), clock=Clock())
    else:
        s = SQLiteSessionStore(tmp_path / "s.sqlite3", clock=Clock())
    yield s
    s.close()


def increment(data: str) -> str:
    obj = json.loads(data)
    obj["n"] += 1
    return json.dumps(obj)


def test_both_stores_satisfy_the_protocol(tmp_path: Path) -> None:
    assert isinstance(MemorySessionStore(), SessionStore)
    with SQLiteSessionStore(tmp_path / "p.sqlite3") as s:
        assert isinstance(s, SessionStore)


CONTRACT = {"get", "create", "cas", "delete", "list_ids", "take_lease", "renew_lease",
            "lease_of", "expire_lease", "expired_ids", "close"}


def test_the_contract_includes_the_leases_and_every_store_keeps_it(store: SessionStore) -> None:
    """One protocol, leases included, and each store (and the job store beside it) has every
    method of it."""
    from cdr.gateway.job_store import job_store_for

    members = {n for n in vars(SessionStore) if not n.startswith("_")}
    assert members == CONTRACT
    assert isinstance(store, SessionStore)
    jobs = job_store_for(store)
    try:
        assert isinstance(jobs, SessionStore)
    finally:
        if jobs is not store:
            jobs.close()


def test_leases_round_trip_on_every_store(store: SessionStore) -> None:
    """The lease half of the contract, the same assertions on each kind of store, as the
    upload jobs use it (`job_store_for`: PostgreSQL keeps leases in its jobs table only): a
    lease needs its row, has one owner, is renewed only by it, ends once when it ran out, and
    goes with its row."""
    from cdr.gateway.job_store import job_store_for

    jobs = job_store_for(store)
    try:
        _lease_round_trip(jobs)
    finally:
        if jobs is not store:
            jobs.close()


def _lease_round_trip(jobs: SessionStore) -> None:
    assert not jobs.take_lease("r", "A", 10.0) and jobs.lease_of("r") is None
    jobs.create("r", '{"n": 0}')
    assert jobs.take_lease("r", "A", 10.0) and not jobs.take_lease("r", "B", 20.0)
    assert not jobs.renew_lease("r", "B", 30.0)
    assert jobs.renew_lease("r", "A", 15.0) and jobs.lease_of("r") == ("A", 15.0)
    assert jobs.expired_ids(12.0) == [] and jobs.expired_ids(16.0) == ["r"]
    row = jobs.get("r")
    assert row is not None
    assert not jobs.expire_lease("r", row.version + 1, '{"n": 9}', 16.0)  # a changed row
    assert not jobs.expire_lease("r", row.version, '{"n": 9}', 14.0)  # not run out yet
    assert jobs.expire_lease("r", row.version, '{"n": 9}', 16.0)
    after = jobs.get("r")
    assert after is not None and after.data == '{"n": 9}' and after.version == row.version + 1
    assert jobs.lease_of("r") == ("A", None)
    assert not jobs.expire_lease("r", after.version, '{"n": 10}', 99.0)  # once only
    assert jobs.delete("r") and jobs.lease_of("r") is None


def test_create_get_cas_semantics(store: SessionStore) -> None:
    created = store.create("a", '{"n": 0}')
    assert created == StoredSession("a", 1, '{"n": 0}', 1001.0, 1001.0)
    assert store.get("a") == created
    second = store.cas("a", 1, '{"n": 1}')
    assert second == StoredSession("a", 2, '{"n": 1}', 1001.0, 1002.0)
    assert store.get("a") == second
    third = store.cas("a", 2, '{"n": 2}')
    assert (third.version, third.data, third.created) == (3, '{"n": 2}', 1001.0)


def test_cas_with_stale_version_conflicts_and_changes_nothing(store: SessionStore) -> None:
    store.create("a", "v1")
    store.cas("a", 1, "v2")
    with pytest.raises(VersionConflictError) as err:
        store.cas("a", 1, "lost")
    assert (err.value.session_id, err.value.expected, err.value.actual) == ("a", 1, 2)
    assert err.value.http_status == 409
    assert "expected version 1, found 2" in str(err.value)
    current = store.get("a")
    assert current is not None and (current.version, current.data) == (2, "v2")


def test_create_existing_is_refused(store: SessionStore) -> None:
    store.create("a", "first")
    with pytest.raises(SessionExistsError, match="already exists"):
        store.create("a", "second")
    got = store.get("a")
    assert got is not None and got.data == "first"


def test_unknown_id_delete_and_list(store: SessionStore) -> None:
    assert store.get("missing") is None
    with pytest.raises(NotFoundError, match="'missing'"):
        store.cas("missing", 1, "x")
    assert store.delete("missing") is False
    for sid in ("c", "a", "b"):
        store.create(sid, "{}")
    assert store.list_ids() == ["a", "b", "c"]
    assert store.delete("b") is True
    assert store.get("b") is None
    assert store.list_ids() == ["a", "c"]
    assert store.delete("b") is False
    # A deleted id can be created again, starting over at version 1.
    assert store.create("b", "new").version == 1


@pytest.mark.parametrize(("sid", "data"), [("", "x"), (None, "x"), ("a", b"bytes"), ("a", None)])
def test_bad_input_is_refused(store: SessionStore, sid: object, data: object) -> None:
    with pytest.raises(InvalidInputError):
        store.create(sid, data)  # type: ignore[arg-type]


def test_update_with_retry_applies_fn_and_reports_unknown(store: SessionStore) -> None:
    store.create("a", '{"n": 41}')
    out = update_with_retry(store, "a", increment)
    assert (out.version, json.loads(out.data)) == (2, {"n": 42})
    with pytest.raises(NotFoundError):
        update_with_retry(store, "nope", increment)


def test_update_with_retry_gives_up_after_retries(store: SessionStore) -> None:
    store.create("a", '{"n": 0}')
    calls = []

    def racing(data: str) -> str:
        # Another writer commits between our read and our CAS, every time.
        calls.append(data)
        update_with_retry(store, "a", increment)
        return increment(data)

    with pytest.raises(VersionConflictError):
        update_with_retry(store, "a", racing, retries=3, backoff_seconds=0)
    assert len(calls) == 4
    got = store.get("a")
    assert got is not None and json.loads(got.data) == {"n": 4}


def test_update_with_retry_retries_after_one_conflict(store: SessionStore) -> None:
    store.create("a", '{"n": 0}')
    raced = []

    def racing_once(data: str) -> str:
        if not raced:
            raced.append(True)
            update_with_retry(store, "a", increment)
        return increment(data)

    out = update_with_retry(store, "a", racing_once, backoff_seconds=0)
    assert json.loads(out.data) == {"n": 2} and out.version == 3


@pytest.mark.parametrize("local_lock", [True, False])
def test_fifty_threads_lose_no_update(store: SessionStore, local_lock: bool) -> None:
    store.create("hot", '{"n": 0}')
    errors: list[BaseException] = []
    barrier = threading.Barrier(50)

    def yielding_increment(data: str) -> str:
        time.sleep(0)  # let other threads run between our read and our CAS
        return increment(data)

    def worker() -> None:
        try:
            barrier.wait()
            for _ in range(20):
                if local_lock:
                    update_with_retry(store, "hot", yielding_increment)
                else:  # pure CAS: every thread races; only retries bound the wait
                    update_with_retry(
                        store, "hot", yielding_increment, retries=100_000, local_lock=False
                    )
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    final = store.get("hot")
    assert final is not None
    assert json.loads(final.data) == {"n": 1000}
    assert final.version == 1001


def _process_worker(path: str, count: int, store: SQLiteSessionStore) -> None:
    # `store` crossed a fork with the parent's connection inside; the store must open its own.
    for _ in range(count):
        update_with_retry(store, "hot", increment)
    assert SQLiteSessionStore(path).get("hot") is not None


def test_four_processes_on_one_file_lose_no_update(tmp_path: Path) -> None:
    path = tmp_path / "shared.sqlite3"
    store = SQLiteSessionStore(path)
    store.create("hot", '{"n": 0}')
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_process_worker, args=(str(path), 100, store)) for _ in range(4)]
    for p in procs:
        p.start()
    # The parent writes at the same time through its own (pre-fork) connection.
    for _ in range(50):
        update_with_retry(store, "hot", increment)
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0, 0, 0]
    final = store.get("hot")
    assert final is not None and json.loads(final.data) == {"n": 450}
    assert final.version == 451
    store.close()


def test_persistence_across_reopen(tmp_path: Path) -> None:
    path = tmp_path / "nested" / "dir" / "s.sqlite3"
    with SQLiteSessionStore(path) as s:
        s.create("a", '{"n": 0}')
        s.create("b", "gone")
        kept = s.cas("a", 1, '{"n": 1, "text": "é ✓"}')
        s.delete("b")
    with SQLiteSessionStore(path) as s:
        assert s.get("a") == kept
        assert s.list_ids() == ["a"]
        assert s.cas("a", 2, "{}").version == 3
    with sqlite3.connect(path) as raw:
        assert raw.execute("PRAGMA journal_mode").fetchone() == ("wal",)


def test_committed_writes_survive_sigkill(tmp_path: Path) -> None:
    path = tmp_path / "k.sqlite3"
    code = (
        "import os, signal, sys\n"
        "from cdr.gateway.session_store import SQLiteSessionStore, update_with_retry\n"
        "s = SQLiteSessionStore(sys.argv[1])\n"
        "s.create('a', '0')\n"
        "for _ in range(25):\n"
        "    update_with_retry(s, 'a', lambda d: str(int(d) + 1))\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1] / "src")}
    proc = subprocess.run([sys.executable, "-c", code, str(path)], env=env, timeout=60)
    assert proc.returncode == -signal.SIGKILL
    with SQLiteSessionStore(path) as s:
        got = s.get("a")
        assert got is not None and (got.data, got.version) == ("25", 26)


def test_synchronous_mode_is_applied_and_checked(tmp_path: Path) -> None:
    for mode, level in (("NORMAL", 1), ("FULL", 2)):
        with SQLiteSessionStore(tmp_path / f"{mode}.sqlite3", synchronous=mode) as s:
            assert s._connect().execute("PRAGMA synchronous").fetchone() == (level,)
    with pytest.raises(InvalidInputError, match="synchronous"):
        SQLiteSessionStore(tmp_path / "x.sqlite3", synchronous="OFF")  # type: ignore[arg-type]


def test_closed_store_refuses_use(tmp_path: Path) -> None:
    s = SQLiteSessionStore(tmp_path / "c.sqlite3")
    s.create("a", "x")
    s.close()
    with pytest.raises(InvalidInputError, match="closed"):
        s.get("a")


def test_bad_paths_and_files_are_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidInputError, match="MemorySessionStore"):
        SQLiteSessionStore(":memory:")
    with pytest.raises(InvalidInputError, match="directory"):
        SQLiteSessionStore(tmp_path)
    junk = tmp_path / "junk.sqlite3"
    junk.write_bytes(b"this is not a database file at all" * 200)
    with pytest.raises(InvalidInputError, match="not a usable SQLite session store"):
        SQLiteSessionStore(junk)
    future = tmp_path / "future.sqlite3"
    with sqlite3.connect(future) as raw:
        raw.execute("PRAGMA user_version = 99")
    with pytest.raises(InvalidInputError, match="schema version 99"):
        SQLiteSessionStore(future)


ops = st.lists(
    st.tuples(
        st.sampled_from(["create", "cas", "delete", "get"]),
        st.sampled_from(["a", "b", "c"]),
        st.integers(0, 4),
        st.text(max_size=8),
    ),
    max_size=40,
)


@settings(max_examples=60, deadline=None)
@given(ops)
def test_property_stores_match_a_dict_model(seq: list[tuple[str, str, int, str]]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        stores: list[SessionStore] = [
            MemorySessionStore(),
            SQLiteSessionStore(Path(tmp) / "m.sqlite3"),
        ]
        model: dict[str, tuple[int, str]] = {}
        for op, sid, version, data in seq:
            if op == "create":
                expect_ok = sid not in model
                if expect_ok:
                    model[sid] = (1, data)
                for s in stores:
                    if expect_ok:
                        assert (s.create(sid, data).version, s.get(sid).data) == (1, data)  # type: ignore[union-attr]
                    else:
                        with pytest.raises(SessionExistsError):
                            s.create(sid, data)
            elif op == "cas":
                for s in stores:
                    if sid not in model:
                        with pytest.raises(NotFoundError):
                            s.cas(sid, version, data)
                    elif model[sid][0] != version:
                        with pytest.raises(VersionConflictError):
                            s.cas(sid, version, data)
                    else:
                        assert s.cas(sid, version, data).version == version + 1
                if sid in model and model[sid][0] == version:
                    model[sid] = (version + 1, data)
            elif op == "delete":
                for s in stores:
                    assert s.delete(sid) is (sid in model)
                model.pop(sid, None)
            for s in stores:
                got = s.get(sid)
                assert (None if got is None else (got.version, got.data)) == model.get(sid)
                assert s.list_ids() == sorted(model)
        for s in stores:
            s.close()
