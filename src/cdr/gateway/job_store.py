"""Where upload-job status lives, so every gateway replica can answer `GET /v1/ckf/jobs/{id}`.

A job's status is a small JSON document written by the one replica that runs the job (queued,
running, then succeeded or failed) and read by any. It needs exactly what a session needs —
a versioned blob per id — so jobs use the `SessionStore` contract, in a store of the same
kind as the sessions':

* PostgreSQL: the `cdr_jobs` table beside `cdr_sessions`, on the same connection pool.
* SQLite: a second file beside the session file (`sessions.sqlite3` -> `sessions.jobs.sqlite3`);
  replicas on one machine share it as they share the session file.
* memory (tests, an injected memory session store): in this process only.
"""

from __future__ import annotations

from pathlib import Path

from cdr.gateway.session_store import MemorySessionStore, SessionStore, SQLiteSessionStore

__all__ = ["job_store_for", "jobs_path"]


def jobs_path(session_db: Path) -> Path:
    """The SQLite job file beside a session file."""
    return session_db.with_name(f"{session_db.stem}.jobs{session_db.suffix or '.sqlite3'}")


def job_store_for(sessions: SessionStore) -> SessionStore:
    """A job store of the same kind, and shared as widely, as the given session store."""
    job_store = getattr(sessions, "job_store", None)
    if callable(job_store):
        return job_store()  # type: ignore[no-any-return]
    if isinstance(sessions, SQLiteSessionStore):
        return SQLiteSessionStore(jobs_path(sessions.path))
    return MemorySessionStore()
