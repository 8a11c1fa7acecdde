"""SQLite schema of a CKF, and the small helpers around it.

`facts.row` is the row number in the array files. `rowstate` holds the per-row arrays that do
change after a row is written (status, importance) as blobs, so they commit atomically with
the rows they describe and load with one query instead of one Python object per fact.
"""

from __future__ import annotations

import hashlib
import sqlite3
from datetime import UTC, datetime
from pathlib import Path

SCHEMA_VERSION = 1
DB_NAME = "ckf.sqlite"
LOCK_NAME = "ckf.lock"

DDL = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS rowstate (name TEXT PRIMARY KEY, data BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS documents (
    doc_id TEXT PRIMARY KEY,
    source TEXT NOT NULL UNIQUE,
    kind TEXT NOT NULL,
    title TEXT,
    content_hash TEXT NOT NULL,
    size INTEGER NOT NULL,
    source_type TEXT NOT NULL,
    importance REAL NOT NULL,
    status TEXT NOT NULL DEFAULT 'ACTIVE',
    n_facts INTEGER NOT NULL DEFAULT 0,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS facts (
    row INTEGER PRIMARY KEY,
    id TEXT NOT NULL UNIQUE,
    content TEXT NOT NULL,
    is_code INTEGER NOT NULL,
    tokens INTEGER NOT NULL,
    importance REAL NOT NULL,
    status TEXT NOT NULL,
    quarantined INTEGER NOT NULL DEFAULT 0,
    doc_id TEXT NOT NULL,
    source TEXT NOT NULL,
    location TEXT NOT NULL,
    section TEXT NOT NULL,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS occurrences (
    doc_id TEXT NOT NULL REFERENCES documents(doc_id) ON DELETE CASCADE,
    ordinal INTEGER NOT NULL,
    row INTEGER NOT NULL,
    location TEXT NOT NULL,
    section TEXT NOT NULL,
    UNIQUE (doc_id, ordinal)
);
CREATE INDEX IF NOT EXISTS occurrences_row ON occurrences(row);
"""


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def doc_id_for(source: str) -> str:
    return hashlib.sha256(source.encode("utf-8")).hexdigest()[:16]


def connect(db: Path) -> sqlite3.Connection:
    """Autocommit connection (transactions are explicit), WAL so readers never block on an
    ingest, NORMAL sync: a killed process loses nothing committed, and after a power cut the
    store rolls back to an earlier consistent state (array tails beyond it are ignored)."""
    conn = sqlite3.connect(str(db), isolation_level=None, check_same_thread=False, timeout=60)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute("PRAGMA foreign_keys=ON")
    return conn


def read_meta(conn: sqlite3.Connection) -> dict[str, str]:
    return dict(conn.execute("SELECT key, value FROM meta").fetchall())


def write_meta(conn: sqlite3.Connection, values: dict[str, object]) -> None:
    conn.executemany(
        "INSERT INTO meta(key, value) VALUES (?, ?) "
        "ON CONFLICT(key) DO UPDATE SET value = excluded.value",
        [(k, str(v)) for k, v in values.items()],
    )
