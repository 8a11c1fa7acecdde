"""Where upload-job status lives, so every gateway replica can answer `GET /v1/ckf/jobs/{id}`.

A job's status is a small JSON document written by the one replica that runs the job (queued,
running, then succeeded or failed) and read by any. It needs exactly what a session needs —
a versioned blob per id — so jobs use the `SessionStore` contract, in a store of the same
kind as the sessions':

* PostgreSQL: the `cdr_jobs` table beside `cdr_sessions`, on the same connection pool.
* SQLite: a second file beside the session file (`sessions.sqlite3` -> `sessions.jobs.sqlite3`);
  replicas on one machine share it as they share the session file.
* memory (tests, an injected memory session store): in this process only.

Leases (schema version 2 of both stores): the replica that accepts an upload takes a lease on
its job (`owner`, `lease_until` columns beside the row) and renews it every third of
`CDR_JOB_LEASE_SECONDS` while the job is queued or running, then releases it. A replica that
is killed stops renewing; the next replica to read the job (`GET /v1/ckf/jobs/{id}`), or any
replica starting up, finds the lease run out and marks the job failed (`reap_job`) in one
conditional write (`expire_lease`: only if the row is unchanged and the lease still expired),
so a slow owner that renews in time always wins.

Why failed rather than resumed: the uploaded files sit in the dead replica's staging
directory, which no other replica can read; and ingest commits whole documents in atomic
batches, so what was committed stays in the CKF exactly once, and uploading the same files
again finishes the job (unchanged documents are recognised and cost nothing). Times are each
replica's clock: replicas on several machines need clocks within a small part of the lease.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from cdr.gateway.session_store import (
    MemorySessionStore,
    SessionStore,
    SQLiteSessionStore,
)

__all__ = ["LEASE_EXPIRED", "job_store_for", "jobs_path", "reap_job"]

LEASE_EXPIRED = "lease_expired"
UNFINISHED = ("queued", "running")




def abandoned_error(until: float) -> str:
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(until))
    return (f"{LEASE_EXPIRED}: the gateway replica running this job stopped renewing its "
            f"lease (killed or crashed; lease ran out at {stamp}). Documents it committed "
            "before that are in the CKF; upload the same files again to finish (documents "
            "already ingested are recognised and cost nothing)")


def reap_job(store: SessionStore, job_id: str, now: float | None = None) -> dict[str, Any] | None:
    """If `job_id` is unfinished and its lease ran out, mark it failed and return its new
    status; else None (nothing to do, or another replica did it or the owner renewed)."""
    now = time.time() if now is None else now
    for _ in range(3):  # a concurrent status write by the owner: look again
        row, lease = store.get(job_id), store.lease_of(job_id)
        if row is None or lease is None or lease[1] is None or lease[1] >= now:
            return None
        data = json.loads(row.data)
        if data.get("status") not in UNFINISHED:
            return None
        data.update(status="failed", finished=now, error=abandoned_error(lease[1]))
        if store.expire_lease(job_id, row.version, json.dumps(data), now):
            return data  # type: ignore[no-any-return]
    return None


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
