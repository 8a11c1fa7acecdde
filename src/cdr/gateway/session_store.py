"""Session stores: a versioned blob per session, written only by compare-and-set.

Why compare-and-set: two requests on one session (a retried client, two sidecar calls, two
replicas) each read the session, update it and write it back. A plain `put` lets the second
writer erase the first one's window. With `cas(id, expected_version, data)` the second writer
gets `VersionConflictError`, re-reads and re-applies its change (`update_with_retry`), so no
update is ever lost. The store does not interpret `data`: it is the session's JSON text.

The routes only see the `SessionStore` protocol, so back ends slot in unchanged. Two exist:
this module's SQLite store (the default) and the PostgreSQL store that gateway replicas share
(`cdr.gateway.session_store_postgres`, whose docstring shows its tables); the contract tests
run against both.

`SQLiteSessionStore` is the default: WAL mode (readers never block the writer), one
connection per thread, every write in `BEGIN IMMEDIATE` (takes the write lock up front, so a
writer never upgrades a read lock and deadlocks), and `busy_timeout` so concurrent writers from
other threads or processes wait instead of failing. `synchronous=NORMAL` by default: a
committed write survives a process crash or kill (a gateway restart loses nothing) and the
file is never corrupted; only an OS crash or power cut may roll back the last commits.
`synchronous="FULL"` closes that gap at one fsync per write (measured 5.5 ms vs 0.07 ms per
20 kB update on this machine's disk), which would cap the gateway near 180 session writes/s.
"""

from __future__ import annotations

import contextlib
import os
import random
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol, TypeVar, runtime_checkable

from cdr.errors import CdrError, InvalidInputError, NotFoundError

__all__ = [
    "MemorySessionStore",
    "SQLiteSessionStore",
    "SessionExistsError",
    "SessionStore",
    "SessionStoreBusyError",
    "StoredSession",
    "VersionConflictError",
    "update_with_retry",
]

# 1: sessions(id, version, data, created, updated). 2: + owner, lease_until (job leases).
SCHEMA_VERSION = 2
_T = TypeVar("_T")


class VersionConflictError(CdrError):
    """The session changed since it was read; re-read and re-apply (HTTP 409)."""

    http_status = 409

    def __init__(self, session_id: str, expected: int, actual: int | None) -> None:
        self.session_id = session_id
        self.expected = expected
        self.actual = actual
        super().__init__(
            f"session {session_id!r} was modified concurrently: expected version {expected}, "
            f"found {actual}"
        )


class SessionExistsError(VersionConflictError):
    """`create` for an id already in the store (HTTP 409)."""

    def __init__(self, session_id: str, actual: int) -> None:
        super().__init__(session_id, 0, actual)
        self.args = (f"session {session_id!r} already exists (version {actual})",)


class SessionStoreBusyError(CdrError):
    """The store stayed locked past its busy timeout (HTTP 503: retry later)."""

    http_status = 503


@dataclass(frozen=True, slots=True)
class StoredSession:
    """One stored version of a session. `version` starts at 1 and grows by 1 per write."""

    id: str
    version: int
    data: str
    created: float
    updated: float


@runtime_checkable
class SessionStore(Protocol):
    """The store contract: what the gateway needs from a session (and job) store. Every method
    is safe to call from any thread, and `cas` and the lease writes are atomic against every
    other writer of the same store. The memory, SQLite and PostgreSQL stores implement all of
    it, and `tests/test_session_store.py` runs the same assertions against each.

    Leases are part of the contract because the upload jobs' store is a store of the same
    kind as the sessions' (`cdr.gateway.job_store.job_store_for`): a lease is an owner and an
    expiry kept beside a row, written only by these methods."""

    def get(self, session_id: str) -> StoredSession | None:
        """The stored version, or None."""
        ...

    def create(self, session_id: str, data: str) -> StoredSession:
        """Version 1 of a new row; `SessionExistsError` if the id is taken."""
        ...

    def cas(self, session_id: str, expected_version: int, data: str) -> StoredSession:
        """The next version, only if the stored one is `expected_version`
        (`VersionConflictError` otherwise, `NotFoundError` for an unknown id)."""
        ...

    def delete(self, session_id: str) -> bool:
        """Remove the row and its lease; False if there was none."""
        ...

    def list_ids(self) -> list[str]:
        """Every stored id, sorted."""
        ...

    def take_lease(self, job_id: str, owner: str, until: float) -> bool:
        """Lease an existing row to `owner` until `until`; False if it is missing or leased."""
        ...

    def renew_lease(self, job_id: str, owner: str, until: float | None) -> bool:
        """Move `owner`'s live lease to `until` (None releases it: the job finished); False
        if another owner holds it, or it was released or ended."""
        ...

    def lease_of(self, job_id: str) -> tuple[str, float | None] | None:
        """(owner, expiry or None once released) of the row's lease, or None."""
        ...

    def expire_lease(self, job_id: str, expected_version: int, data: str, now: float) -> bool:
        """End a lease that ran out before `now` and write `data` as the next version, in one
        conditional write: only if the row is still `expected_version` and the lease still
        expired (a renewal in between wins). True if it was written."""
        ...

    def expired_ids(self, now: float) -> list[str]:
        """The ids whose live lease ran out before `now`, sorted."""
        ...

    def close(self) -> None:
        """Release connections; the store refuses use afterwards (the memory store keeps
        working: it holds nothing to release)."""
        ...


def _check(session_id: object, data: object = "") -> None:
    if not isinstance(session_id, str) or not session_id:
        raise InvalidInputError(f"session id must be a non-empty string, got {session_id!r}")
    if not isinstance(data, str):
        raise InvalidInputError(f"session data must be a JSON string, got {type(data).__name__}")


def _not_found(session_id: str) -> NotFoundError:
    return NotFoundError(f"session {session_id!r} does not exist")


# Writers in one process queue on a lock stripe per session before the CAS, so threads of
# one gateway do not starve each other in retry storms; CAS still guards other processes.
_STRIPES = tuple(threading.RLock() for _ in range(256))


def update_with_retry(
    store: SessionStore,
    session_id: str,
    fn: Callable[[str], str],
    retries: int = 20,
    *,
    backoff_seconds: float = 0.002,
    max_backoff_seconds: float = 0.1,
    local_lock: bool = True,
) -> StoredSession:
    """Read, apply `fn` to the data, CAS; on conflict, re-read and re-apply.

    `fn` may run several times, so it must be a fast, pure function of the data it is given
    (no LLM call, no write to another session: it runs under this process's lock stripe for
    the session). Between attempts it sleeps a random, doubling backoff so that writers in
    other processes spread out. With `local_lock`, threads of this process updating the same
    session take turns, so conflicts only come from other processes or replicas. Raises
    `NotFoundError` for an unknown id and the last `VersionConflictError` after `retries`
    failed retries.
    """
    if retries < 0:
        raise InvalidInputError(f"retries must be >= 0, got {retries}")
    _check(session_id)
    lock = _STRIPES[hash(session_id) % len(_STRIPES)] if local_lock else contextlib.nullcontext()
    for attempt in range(retries + 1):
        with lock:
            current = store.get(session_id)
            if current is None:
                raise _not_found(session_id)
            try:
                return store.cas(session_id, current.version, fn(current.data))
            except VersionConflictError:
                if attempt == retries:
                    raise
        time.sleep(random.uniform(0, min(max_backoff_seconds, backoff_seconds * 2**attempt)))
    raise AssertionError("unreachable")  # pragma: no cover


class MemorySessionStore:
    """In-process store for tests and `CDR_DEV`; loses everything on exit."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._rows: dict[str, StoredSession] = {}
        self._leases: dict[str, tuple[str, float | None]] = {}
        self._lock = threading.Lock()
        self._clock = clock

    def get(self, session_id: str) -> StoredSession | None:
        _check(session_id)
        with self._lock:
            return self._rows.get(session_id)

    def create(self, session_id: str, data: str) -> StoredSession:
        _check(session_id, data)
        with self._lock:
            if (old := self._rows.get(session_id)) is not None:
                raise SessionExistsError(session_id, old.version)
            now = self._clock()
            row = self._rows[session_id] = StoredSession(session_id, 1, data, now, now)
            return row

    def cas(self, session_id: str, expected_version: int, data: str) -> StoredSession:
        _check(session_id, data)
        with self._lock:
            old = self._rows.get(session_id)
            if old is None:
                raise _not_found(session_id)
            if old.version != expected_version:
                raise VersionConflictError(session_id, expected_version, old.version)
            row = StoredSession(session_id, old.version + 1, data, old.created, self._clock())
            self._rows[session_id] = row
            return row

    def delete(self, session_id: str) -> bool:
        _check(session_id)
        with self._lock:
            self._leases.pop(session_id, None)
            return self._rows.pop(session_id, None) is not None

    def list_ids(self) -> list[str]:
        with self._lock:
            return sorted(self._rows)

    # Job leases (see `cdr.gateway.job_store`): owner and expiry beside each row.

    def take_lease(self, job_id: str, owner: str, until: float) -> bool:
        _check(job_id)
        with self._lock:
            if job_id not in self._rows or job_id in self._leases:
                return False
            self._leases[job_id] = (owner, until)
            return True

    def renew_lease(self, job_id: str, owner: str, until: float | None) -> bool:
        _check(job_id)
        with self._lock:
            held = self._leases.get(job_id)
            if held is None or held[0] != owner or held[1] is None:
                return False
            self._leases[job_id] = (owner, until)
            return True

    def lease_of(self, job_id: str) -> tuple[str, float | None] | None:
        _check(job_id)
        with self._lock:
            return self._leases.get(job_id)

    def expire_lease(self, job_id: str, expected_version: int, data: str, now: float) -> bool:
        _check(job_id, data)
        with self._lock:
            old, held = self._rows.get(job_id), self._leases.get(job_id)
            if old is None or old.version != expected_version or held is None \
                    or held[1] is None or held[1] >= now:
                return False
            self._rows[job_id] = StoredSession(job_id, old.version + 1, data, old.created,
                                               self._clock())
            self._leases[job_id] = (held[0], None)
            return True

    def expired_ids(self, now: float) -> list[str]:
        with self._lock:
            return sorted(i for i, (_, until) in self._leases.items()
                          if until is not None and until < now and i in self._rows)

    def close(self) -> None:
        """Nothing to release; present for the protocol."""


class SQLiteSessionStore:
    """Durable store in one SQLite file, shared safely by threads and processes."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        busy_timeout_ms: int = 30_000,
        synchronous: Literal["NORMAL", "FULL"] = "NORMAL",
        clock: Callable[[], float] = time.time,
    ) -> None:
        if str(path) in ("", ":memory:") or str(path).startswith("file::memory:"):
            raise InvalidInputError(
                "SQLiteSessionStore needs a file path (each thread opens its own connection, "
                "so an in-memory database would not be shared); use MemorySessionStore"
            )
        if synchronous not in ("FULL", "NORMAL"):
            raise InvalidInputError(f"synchronous must be FULL or NORMAL, got {synchronous!r}")
        self.path = Path(path)
        if self.path.is_dir():
            raise InvalidInputError(f"session store path {self.path} is a directory")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._busy_timeout_ms = int(busy_timeout_ms)
        self._synchronous = synchronous
        self._clock = clock
        self._local = threading.local()
        self._all: list[tuple[int, sqlite3.Connection]] = []
        self._all_lock = threading.Lock()
        self._closed = False
        self._init_schema()

    def _connect(self) -> sqlite3.Connection:
        """This thread's connection; a fresh one after a fork (a connection must never cross
        a process boundary)."""
        if self._closed:
            raise InvalidInputError(f"session store {self.path} is closed")
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is not None and self._local.pid == os.getpid():
            return conn
        conn = sqlite3.connect(
            self.path,
            timeout=self._busy_timeout_ms / 1000,
            isolation_level=None,  # autocommit; transactions are explicit BEGIN IMMEDIATE
            check_same_thread=False,  # only so close() may close it from another thread
        )
        conn.execute(f"PRAGMA busy_timeout = {self._busy_timeout_ms}")
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute(f"PRAGMA synchronous = {self._synchronous}")
        self._local.conn, self._local.pid = conn, os.getpid()
        with self._all_lock:
            self._all.append((os.getpid(), conn))
        return conn

    def _init_schema(self) -> None:
        def init(conn: sqlite3.Connection) -> None:
            (found,) = conn.execute("PRAGMA user_version").fetchone()
            if found > SCHEMA_VERSION:
                raise InvalidInputError(
                    f"session store {self.path} has schema version {found}; this cdr "
                    f"understands up to {SCHEMA_VERSION}"
                )
            conn.execute(
                "CREATE TABLE IF NOT EXISTS sessions (id TEXT PRIMARY KEY, "
                "version INTEGER NOT NULL, data TEXT NOT NULL, "
                "created REAL NOT NULL, updated REAL NOT NULL)"
            )
            # Migration 1 -> 2 (inside this BEGIN IMMEDIATE, so once across processes):
            # a job's owning replica and lease expiry. Sessions leave them NULL.
            cols = {r[1] for r in conn.execute("PRAGMA table_info(sessions)")}
            if "owner" not in cols:
                conn.execute("ALTER TABLE sessions ADD COLUMN owner TEXT")
            if "lease_until" not in cols:
                conn.execute("ALTER TABLE sessions ADD COLUMN lease_until REAL")
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

        try:
            self._write(init)
        except sqlite3.DatabaseError as exc:
            raise InvalidInputError(
                f"{self.path} is not a usable SQLite session store: {exc}"
            ) from exc

    def _write(self, body: Callable[[sqlite3.Connection], _T]) -> _T:
        conn = self._connect()
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            raise SessionStoreBusyError(
                f"session store {self.path} is locked ({exc}); retry later"
            ) from exc
        try:
            result = body(conn)
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        return result

    def get(self, session_id: str) -> StoredSession | None:
        _check(session_id)
        row = (
            self._connect()
            .execute(
                "SELECT id, version, data, created, updated FROM sessions WHERE id = ?",
                (session_id,),
            )
            .fetchone()
        )
        return None if row is None else StoredSession(*row)

    def create(self, session_id: str, data: str) -> StoredSession:
        _check(session_id, data)
        now = self._clock()

        def body(conn: sqlite3.Connection) -> StoredSession:
            old = conn.execute("SELECT version FROM sessions WHERE id = ?", (session_id,))
            if (found := old.fetchone()) is not None:
                raise SessionExistsError(session_id, found[0])
            conn.execute(
                "INSERT INTO sessions (id, version, data, created, updated) VALUES (?, 1, ?, ?, ?)",
                (session_id, data, now, now),
            )
            return StoredSession(session_id, 1, data, now, now)

        return self._write(body)

    def cas(self, session_id: str, expected_version: int, data: str) -> StoredSession:
        _check(session_id, data)
        now = self._clock()

        def body(conn: sqlite3.Connection) -> StoredSession:
            found = conn.execute(
                "SELECT version, created FROM sessions WHERE id = ?", (session_id,)
            ).fetchone()
            if found is None:
                raise _not_found(session_id)
            version, created = found
            if version != expected_version:
                raise VersionConflictError(session_id, expected_version, version)
            conn.execute(
                "UPDATE sessions SET version = ?, data = ?, updated = ? WHERE id = ?",
                (version + 1, data, now, session_id),
            )
            return StoredSession(session_id, version + 1, data, created, now)

        return self._write(body)

    def delete(self, session_id: str) -> bool:
        _check(session_id)
        return self._write(
            lambda conn: (
                conn.execute("DELETE FROM sessions WHERE id = ?", (session_id,)).rowcount > 0
            )
        )

    def list_ids(self) -> list[str]:
        rows = self._connect().execute("SELECT id FROM sessions ORDER BY id").fetchall()
        return [r[0] for r in rows]

    # Job leases (see `cdr.gateway.job_store`): each is one statement, atomic against
    # every other process of this file.

    def take_lease(self, job_id: str, owner: str, until: float) -> bool:
        """Become the job's owner until `until` (False: it has one, or does not exist)."""
        _check(job_id)
        return self._write(lambda conn: conn.execute(
            "UPDATE sessions SET owner = ?, lease_until = ? WHERE id = ? AND owner IS NULL",
            (owner, until, job_id)).rowcount > 0)

    def renew_lease(self, job_id: str, owner: str, until: float | None) -> bool:
        """Extend (or, `until=None`, release) a lease this owner still holds."""
        _check(job_id)
        return self._write(lambda conn: conn.execute(
            "UPDATE sessions SET lease_until = ? WHERE id = ? AND owner = ? "
            "AND lease_until IS NOT NULL", (until, job_id, owner)).rowcount > 0)

    def lease_of(self, job_id: str) -> tuple[str, float | None] | None:
        _check(job_id)
        row = self._connect().execute(
            "SELECT owner, lease_until FROM sessions WHERE id = ? AND owner IS NOT NULL",
            (job_id,)).fetchone()
        return None if row is None else (row[0], row[1])

    def expire_lease(self, job_id: str, expected_version: int, data: str, now: float) -> bool:
        """Write `data` and end the lease, only if the row is still at `expected_version`
        and its lease ran out before `now` (a renewal in between wins)."""
        _check(job_id, data)
        stamp = self._clock()
        return self._write(lambda conn: conn.execute(
            "UPDATE sessions SET data = ?, version = version + 1, updated = ?, "
            "lease_until = NULL WHERE id = ? AND version = ? AND lease_until < ?",
            (data, stamp, job_id, expected_version, now)).rowcount > 0)

    def expired_ids(self, now: float) -> list[str]:
        rows = self._connect().execute(
            "SELECT id FROM sessions WHERE lease_until < ? ORDER BY id", (now,)).fetchall()
        return [r[0] for r in rows]

    def close(self) -> None:
        """Close this process's connections (all threads); the store is unusable afterwards.

        Connections inherited through a fork stay referenced, never closed: closing one in
        the child could checkpoint or unlink the parent's WAL under it."""
        self._closed = True
        pid = os.getpid()
        with self._all_lock:
            mine = [conn for owner, conn in self._all if owner == pid]
            self._all = [(owner, conn) for owner, conn in self._all if owner != pid]
        for conn in mine:
            conn.close()

    def __enter__(self) -> SQLiteSessionStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
