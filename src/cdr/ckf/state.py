"""One committed state of a CKF: its meta row, per-row state blobs and mapped array files.

Both sides of the store need it: the read-only snapshot serves queries from it, and the writer
starts every transaction from the latest one. Reading it is one SQLite read transaction (so
meta and blobs agree) plus memory maps of the committed prefixes of the array files; no
per-fact Python object is made, so opening a million-fact CKF takes milliseconds.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cdr.ckf.arrays import ArrayFiles
from cdr.ckf.records import FactStatus
from cdr.ckf.schema import SCHEMA_VERSION, read_meta
from cdr.errors import InvalidInputError


@dataclass(frozen=True, slots=True)
class Layout:
    """What never changes over a CKF's life: its embedding model, dimension and storage."""

    model_id: str
    dim: int
    dtype: str


@dataclass(frozen=True, slots=True)
class CommittedState:
    """Every per-row array of one generation, consistent with each other."""

    meta: dict[str, str]
    files: ArrayFiles
    generation: int
    epoch: int
    n_rows: int
    n_hashes: int
    embeddings: np.ndarray  # (n_rows, dim) memory-mapped unit rows
    tokens: np.ndarray  # int32 (n_rows,)
    offsets: np.ndarray  # int64 (n_rows + 1,)
    hashes: np.ndarray  # uint64 (n_hashes,)
    status: np.ndarray  # uint8 (n_rows,), values of FactStatus
    importance: np.ndarray  # float32 (n_rows,)
    active: np.ndarray  # bool (n_rows,), read-only: ACTIVE or STALE


def read_layout(conn: sqlite3.Connection, path: Path) -> Layout:
    """The model and storage a CKF was created with; refuses schema versions we cannot read."""
    meta = read_meta(conn)
    version = int(meta.get("schema_version", "0"))
    if version != SCHEMA_VERSION:
        raise InvalidInputError(
            f"{path}: CKF schema version {version} is not supported (this cdr reads "
            f"version {SCHEMA_VERSION})")
    return Layout(meta["model_id"], int(meta["dim"]), meta["dtype"])


def read_generation(conn: sqlite3.Connection) -> int:
    """The committed generation (one meta row): the cheap "did anything change?" probe."""
    (gen,) = conn.execute("SELECT value FROM meta WHERE key='generation'").fetchone()
    return int(gen)


def read_epoch(conn: sqlite3.Connection) -> int:
    """The committed epoch: it changes only when a compaction renumbers rows."""
    (epoch,) = conn.execute("SELECT value FROM meta WHERE key='epoch'").fetchone()
    return int(epoch)


def read_state(conn: sqlite3.Connection, path: Path, layout: Layout) -> CommittedState:
    """The committed state, meta and row-state blobs read in one transaction."""
    conn.execute("BEGIN")
    try:
        meta = read_meta(conn)
        blobs = dict(conn.execute("SELECT name, data FROM rowstate").fetchall())
    finally:
        conn.execute("COMMIT")
    n_rows, n_hashes = int(meta["n_rows"]), int(meta["n_hashes"])
    files = ArrayFiles(path, int(meta["epoch"]), layout.dim, layout.dtype)
    emb, tokens, offsets, hashes = files.map(n_rows, n_hashes)
    status = np.frombuffer(blobs["status"], dtype=np.uint8)
    importance = np.frombuffer(blobs["importance"], dtype="<f4")
    if len(status) != n_rows or len(importance) != n_rows:
        raise InvalidInputError(f"{path}: row state does not match {n_rows} rows")
    active = status <= FactStatus.STALE
    active.flags.writeable = False
    return CommittedState(meta, files, int(meta["generation"]), int(meta["epoch"]), n_rows,
                          n_hashes, emb, tokens, offsets, hashes, status, importance, active)
