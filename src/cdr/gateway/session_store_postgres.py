"""A PostgreSQL session store, so several gateway replicas can share sessions.

Why PostgreSQL: one SQLite file serves the processes of one machine; replicas on several
machines need a server, and compare-and-set is one `UPDATE ... WHERE version = $expected`
there, atomic without any lock held across a round trip. The store keeps the `SessionStore`
contract of `session_store.py` exactly (same errors, same versions, `list_ids` in code-point order),
so the routes and the contract tests do not know which store they run on.

Tables (created, or migrated forward, on open; `cdr_schema_version` records how far):

    cdr_sessions(id text primary key, version bigint, data bytea, created float8, updated float8)
    cdr_jobs    (same columns, + owner text, lease_until float8)  -- upload jobs, so every
                replica can answer GET /v1/ckf/jobs; the lease says which replica runs one
    cdr_schema_version(version int)

`data` is the session's JSON text stored as UTF-8 bytes, not `jsonb`: the contract says the
store never interprets it (jsonb would reorder keys and refuse a NUL). Times come from the
store's clock like SQLite's, so `created` / `updated` mean the same on both.

Migrations run in one transaction under a PostgreSQL advisory lock, so replicas starting at
the same moment apply each step once; a database newer than this code is refused with its
version named. Connections come from a `psycopg_pool.ConnectionPool` (autocommit: every
statement is its own transaction); a pool inherited through `fork` is never used by the
child, which opens its own. A server that cannot be reached is a `SessionStoreBusyError`
(HTTP 503, retry later) naming host, port and database but never the password; after a
PostgreSQL restart each stale pooled connection fails one call that way and is replaced.

Select it with `CDR_SESSION_DB=postgresql://user@host:5432/dbname` (the password belongs in
`PGPASSWORD` or `~/.pgpass`, where libpq reads it, rather than in a URL that logs may show).
A `search_path` in the URL (`?options=-csearch_path%3Dmyschema`) puts the tables in that
schema, which must exist.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from cdr.errors import InvalidInputError, NotFoundError
from cdr.gateway.session_store import (
    SessionExistsError,
    SessionStoreBusyError,
    StoredSession,
    VersionConflictError,
)

__all__ = ["POSTGRES_SCHEMA_VERSION", "PostgresSessionStore", "is_postgres_url"]

POSTGRES_SCHEMA_VERSION = 2
SESSIONS_TABLE = "cdr_sessions"
JOBS_TABLE = "cdr_jobs"
_TABLES = (SESSIONS_TABLE, JOBS_TABLE)
# Step k (1-based) brings a database from schema version k-1 to k. Append, never edit.
MIGRATIONS: tuple[tuple[str, ...], ...] = (
    tuple(
        f"CREATE TABLE IF NOT EXISTS {t} (id text PRIMARY KEY, version bigint NOT NULL, "
        "data bytea NOT NULL, created double precision NOT NULL, "
        "updated double precision NOT NULL)"
        for t in _TABLES
    ),
    # 2: a job's owning replica and lease expiry (see `cdr.gateway.job_store`).
    (
        f"ALTER TABLE {JOBS_TABLE} ADD COLUMN IF NOT EXISTS owner text",
        f"ALTER TABLE {JOBS_TABLE} ADD COLUMN IF NOT EXISTS lease_until double precision",
        f"CREATE INDEX IF NOT EXISTS {JOBS_TABLE}_lease ON {JOBS_TABLE} (lease_until) "
        "WHERE lease_until IS NOT NULL",
    ),
)
_ADVISORY_KEY = 0x6364725F73746F72  # "cdr_stor": serialises migrations across replicas


_R = TypeVar("_R")


def _changed(cursor: Any) -> bool:
    return bool(cursor.rowcount > 0)


def is_postgres_url(value: object) -> bool:
    """Whether a `CDR_SESSION_DB` value names a PostgreSQL server rather than a file."""
    text = str(value)
    return text.startswith(("postgresql://", "postgres://"))


def _check(session_id: object, data: object = "") -> None:
    if not isinstance(session_id, str) or not session_id:
        raise InvalidInputError(f"session id must be a non-empty string, got {session_id!r}")
    if "\x00" in session_id:
        raise InvalidInputError(f"session id must not contain NUL, got {session_id!r}")
    if not isinstance(data, str):
        raise InvalidInputError(f"session data must be a JSON string, got {type(data).__name__}")


def _where(dsn: str) -> str:
    """The server a DSN names, without its password, for error messages."""
    try:
        from psycopg.conninfo import conninfo_to_dict

        parts = conninfo_to_dict(dsn)
    except Exception:  # a malformed DSN: say nothing more than that
        return "the configured server"
    return f"{parts.get('host', 'localhost')}:{parts.get('port', 5432)}/{parts.get('dbname', '')}"


class _Shared:
    """One connection pool, shared by the session table and the job table of one store."""

    def __init__(self, dsn: str, min_size: int, max_size: int, timeout: float) -> None:
        self.dsn = dsn
        self.where = _where(dsn)
        self.min_size, self.max_size, self.timeout = min_size, max_size, timeout
        self._lock = threading.Lock()
        self._pool: Any = None
        self._pid = -1
        self.closed = False

    def pool(self) -> Any:
        """This process's pool; a fresh one after a fork (pool threads and sockets do not
        survive a fork, and the parent's must not be touched from the child)."""
        if self.closed:
            raise InvalidInputError(f"session store at {self.where} is closed")
        with self._lock:
            if self._pool is None or self._pid != os.getpid():
                import psycopg
                from psycopg_pool import ConnectionPool

                # One direct connection first: a down server or a wrong name fails now, with
                # libpq's own reason, instead of after the pool's timeout of retries.
                try:
                    psycopg.connect(self.dsn, connect_timeout=max(1, int(self.timeout))).close()
                except psycopg.Error as exc:
                    reason = " ".join(str(exc).split())
                    raise SessionStoreBusyError(
                        f"cannot connect to the PostgreSQL session store at {self.where}: "
                        f"{reason}"
                    ) from exc
                self._pool = ConnectionPool(
                    self.dsn, min_size=self.min_size, max_size=self.max_size,
                    timeout=self.timeout, kwargs={"autocommit": True}, open=False,
                    name="cdr-sessions",
                )
                self._pid = os.getpid()
                try:
                    self._pool.open(wait=True, timeout=self.timeout)
                except Exception as exc:
                    self._pool = None
                    raise SessionStoreBusyError(
                        f"cannot connect to the PostgreSQL session store at {self.where}: "
                        f"{exc}"
                    ) from exc
            return self._pool

    @contextmanager
    def connection(self) -> Iterator[Any]:
        """A pooled connection; a connection or pool failure becomes a 503-style error."""
        import psycopg
        from psycopg_pool import PoolTimeout

        try:
            with self.pool().connection() as conn:
                yield conn
        except PoolTimeout as exc:
            raise SessionStoreBusyError(
                f"no free connection to the PostgreSQL session store at {self.where} within "
                f"{self.timeout:g} s; retry later"
            ) from exc
        except psycopg.OperationalError as exc:
            raise SessionStoreBusyError(
                f"PostgreSQL session store at {self.where} failed: {exc}; retry later"
            ) from exc

    def close(self) -> None:
        self.closed = True
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None and self._pid == os.getpid():
            pool.close()


class PostgresSessionStore:
    """`SessionStore` on PostgreSQL: a versioned blob per id in one table.

    `job_store()` gives the same contract over the jobs table, on the same pool."""

    def __init__(
        self,
        dsn: str,
        *,
        min_size: int = 1,
        max_size: int = 16,
        timeout: float = 30.0,
        clock: Callable[[], float] = time.time,
        _table: str = SESSIONS_TABLE,
        _shared: _Shared | None = None,
    ) -> None:
        if not isinstance(dsn, str) or not is_postgres_url(dsn):
            raise InvalidInputError(
                f"a PostgreSQL session store needs a postgresql:// URL, got {dsn!r}"
            )
        if _table not in _TABLES:
            raise InvalidInputError(f"unknown session store table {_table!r}")
        try:
            import psycopg  # noqa: F401
            import psycopg_pool  # noqa: F401
        except ImportError as exc:
            raise InvalidInputError(
                f"CDR_SESSION_DB names a PostgreSQL server, which needs psycopg 3 and "
                f"psycopg_pool ({exc}): pip install 'psycopg[binary,pool]' (the `postgres` "
                "extra)"
            ) from exc
        if not 1 <= min_size <= max_size:
            raise InvalidInputError(f"pool sizes need 1 <= min_size <= max_size, got "
                                    f"{min_size} and {max_size}")
        self._table = _table
        self._clock = clock
        self._owner = _shared is None
        self._shared = _shared or _Shared(dsn, min_size, max_size, timeout)
        if self._owner:
            self._migrate()

    @property
    def where(self) -> str:
        """host:port/dbname of the server (never the password)."""
        return self._shared.where

    def job_store(self) -> PostgresSessionStore:
        """The upload-job table as a store of its own (closing it leaves the pool open)."""
        return PostgresSessionStore(self._shared.dsn, clock=self._clock, _table=JOBS_TABLE,
                                    _shared=self._shared)

    def _migrate(self) -> None:
        with self._shared.connection() as conn, conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_ADVISORY_KEY,))
            conn.execute("CREATE TABLE IF NOT EXISTS cdr_schema_version (version int NOT NULL)")
            row = conn.execute("SELECT max(version) FROM cdr_schema_version").fetchone()
            found = int(row[0]) if row and row[0] is not None else 0
            if found > POSTGRES_SCHEMA_VERSION:
                raise InvalidInputError(
                    f"session store at {self.where} has schema version {found}; this cdr "
                    f"understands up to {POSTGRES_SCHEMA_VERSION}"
                )
            for step in range(found, POSTGRES_SCHEMA_VERSION):
                for sql in MIGRATIONS[step]:
                    conn.execute(sql)
            if found < POSTGRES_SCHEMA_VERSION:
                conn.execute("DELETE FROM cdr_schema_version")
                conn.execute("INSERT INTO cdr_schema_version (version) VALUES (%s)",
                             (POSTGRES_SCHEMA_VERSION,))

    def schema_version(self) -> int:
        """The schema version recorded in the database."""
        with self._shared.connection() as conn:
            row = conn.execute("SELECT max(version) FROM cdr_schema_version").fetchone()
        return int(row[0]) if row and row[0] is not None else 0

    @staticmethod
    def _row(row: tuple[Any, ...]) -> StoredSession:
        sid, version, data, created, updated = row
        return StoredSession(sid, int(version), bytes(data).decode("utf-8"), float(created),
                             float(updated))

    def get(self, session_id: str) -> StoredSession | None:
        _check(session_id)
        with self._shared.connection() as conn:
            row = conn.execute(
                f"SELECT id, version, data, created, updated FROM {self._table} WHERE id = %s",
                (session_id,),
            ).fetchone()
        return None if row is None else self._row(row)

    def create(self, session_id: str, data: str) -> StoredSession:
        _check(session_id, data)
        now = self._clock()
        blob = data.encode("utf-8")
        with self._shared.connection() as conn:
            for _ in range(10):
                row = conn.execute(
                    f"INSERT INTO {self._table} (id, version, data, created, updated) "
                    "VALUES (%s, 1, %s, %s, %s) ON CONFLICT (id) DO NOTHING RETURNING id",
                    (session_id, blob, now, now),
                ).fetchone()
                if row is not None:
                    return StoredSession(session_id, 1, data, now, now)
                old = conn.execute(f"SELECT version FROM {self._table} WHERE id = %s",
                                   (session_id,)).fetchone()
                if old is not None:
                    raise SessionExistsError(session_id, int(old[0]))
                # Deleted between our INSERT and SELECT: try the INSERT again.
        raise SessionStoreBusyError(f"create of {session_id!r} kept racing a delete; retry")

    def cas(self, session_id: str, expected_version: int, data: str) -> StoredSession:
        _check(session_id, data)
        now = self._clock()
        with self._shared.connection() as conn:
            row = conn.execute(
                f"UPDATE {self._table} SET version = version + 1, data = %s, updated = %s "
                "WHERE id = %s AND version = %s RETURNING version, created",
                (data.encode("utf-8"), now, session_id, expected_version),
            ).fetchone()
            if row is not None:
                return StoredSession(session_id, int(row[0]), data, float(row[1]), now)
            found = conn.execute(f"SELECT version FROM {self._table} WHERE id = %s",
                                 (session_id,)).fetchone()
        if found is None:
            raise NotFoundError(f"session {session_id!r} does not exist")
        raise VersionConflictError(session_id, expected_version, int(found[0]))

    def delete(self, session_id: str) -> bool:
        _check(session_id)
        with self._shared.connection() as conn:
            cur = conn.execute(f"DELETE FROM {self._table} WHERE id = %s", (session_id,))
            out: bool = cur.rowcount > 0
            return out

    def list_ids(self) -> list[str]:
        # COLLATE "C": code-point order, as Python's sorted() and SQLite give.
        with self._shared.connection() as conn:
            rows = conn.execute(f'SELECT id FROM {self._table} ORDER BY id COLLATE "C"')
            return [r[0] for r in rows.fetchall()]

    # Job leases (see `cdr.gateway.job_store`), on the jobs table only; each is one
    # statement, atomic against every replica.

    def _lease_sql(self, sql: str, args: tuple[Any, ...],
                   read: Callable[[Any], _R]) -> _R:
        """Run one lease statement and `read` its cursor while the connection is ours."""
        if self._table != JOBS_TABLE:
            raise InvalidInputError("leases are kept for upload jobs only")
        with self._shared.connection() as conn:
            return read(conn.execute(sql.format(t=self._table), args))

    def take_lease(self, job_id: str, owner: str, until: float) -> bool:
        _check(job_id)
        return bool(self._lease_sql(
            "UPDATE {t} SET owner = %s, lease_until = %s WHERE id = %s AND owner IS NULL",
            (owner, until, job_id), _changed))

    def renew_lease(self, job_id: str, owner: str, until: float | None) -> bool:
        _check(job_id)
        return bool(self._lease_sql(
            "UPDATE {t} SET lease_until = %s WHERE id = %s AND owner = %s "
            "AND lease_until IS NOT NULL", (until, job_id, owner), _changed))

    def lease_of(self, job_id: str) -> tuple[str, float | None] | None:
        _check(job_id)
        row = self._lease_sql("SELECT owner, lease_until FROM {t} WHERE id = %s "
                              "AND owner IS NOT NULL", (job_id,), lambda c: c.fetchone())
        return None if row is None else (row[0], None if row[1] is None else float(row[1]))

    def expire_lease(self, job_id: str, expected_version: int, data: str, now: float) -> bool:
        _check(job_id, data)
        return bool(self._lease_sql(
            "UPDATE {t} SET data = %s, version = version + 1, updated = %s, "
            "lease_until = NULL WHERE id = %s AND version = %s AND lease_until < %s",
            (data.encode("utf-8"), self._clock(), job_id, expected_version, now), _changed))

    def expired_ids(self, now: float) -> list[str]:
        rows = self._lease_sql('SELECT id FROM {t} WHERE lease_until < %s ORDER BY id '
                               'COLLATE "C"', (now,), lambda c: c.fetchall())
        return [r[0] for r in rows]

    def close(self) -> None:
        """Close the pool (the owner only); the store is unusable afterwards."""
        if self._owner:
            self._shared.close()

    def __enter__(self) -> PostgresSessionStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
