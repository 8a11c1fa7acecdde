"""The CKF's committer: the admin side that writes — file lifecycle, locking and every SQL
statement that changes the store.

Named apart from `cdr.writers` (the language-model backends that write a document's windows).

Readers (`cdr.ckf.snapshot.CKFSnapshot`) never write; everything that does goes through a
`CKFCommitter`: creating a store, the single-writer file lock, atomic write transactions (ingest
commits, deletes, importance and status changes, quarantine, raw appends), and the database
side of integrity checks and compaction (`cdr.ckf.maintenance` holds their logic).

Crash safety rests on one order, kept here: arrays are appended and fsynced before the SQLite
COMMIT that makes them count; anything past the committed lengths is ignored by readers and
cut off by the next writer.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

from cdr.ckf.arrays import DTYPES, ArrayFiles, other_epoch_files
from cdr.ckf.schema import DB_NAME, DDL, LOCK_NAME, SCHEMA_VERSION, connect, now, write_meta
from cdr.ckf.state import CommittedState, Layout, read_layout, read_state
from cdr.ckf.txn import WriteTxn, chunks
from cdr.errors import CdrError, InvalidInputError

_LOCK_TIMEOUT = 60.0
# SQLite page cache of the writer connection, KiB (negative = KiB in the pragma). The default
# 2 MB makes every insert into the `facts.id` index (random content hashes) a page-cache miss
# once a store has a few million facts; 256 MB holds that index for ~5M facts, is allocated
# only as pages are used, and is a writer's, not a reader's (bench/results/ingest.md).
_WRITER_CACHE_KIB = 262_144
log = logging.getLogger(__name__)
# What a gateway keeps beside the CKF it serves (its SQLite session and job stores and their
# WAL files): `cdr serve --ckf NEWDIR` writes these before the first upload creates the CKF.
_GATEWAY_STATE = re.compile(r"^sessions(\.jobs)?\.sqlite3(-wal|-shm|-journal)?$")


class CKFBusyError(CdrError):
    """Another process holds the CKF's write lock for longer than we were willing to wait."""


def create_ckf(root: Path, model_id: str, dim: int, dtype: str = "float32") -> Path:
    """A new, empty CKF directory for one embedding model; returns its resolved path.

    The database is built under a temporary name and renamed into place, so a CKF appears
    complete or not at all."""
    if dtype not in DTYPES:
        raise InvalidInputError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    root = Path(root).expanduser()
    if (root / DB_NAME).exists():
        raise InvalidInputError(f"{root} is already a CKF; open it instead")
    if root.exists() and (
        not root.is_dir() or any(not _GATEWAY_STATE.match(p.name) for p in root.iterdir())
    ):
        raise InvalidInputError(f"{root} exists and is not an empty directory")
    root.mkdir(parents=True, exist_ok=True)
    root = root.resolve()
    ArrayFiles(root, 0, int(dim), dtype).initialise()
    tmp_db = root / (DB_NAME + ".init")
    tmp_db.unlink(missing_ok=True)
    conn = connect(tmp_db)
    try:
        conn.execute("BEGIN")
        for statement in (s.strip() for s in DDL.split(";")):
            if statement:
                conn.execute(statement)
        ts = now()
        write_meta(conn, {
            "schema_version": SCHEMA_VERSION, "model_id": model_id, "dim": int(dim),
            "dtype": dtype, "generation": 0, "epoch": 0, "n_rows": 0, "n_hashes": 0,
            "created_at": ts, "updated_at": ts,
        })
        conn.executemany("INSERT INTO rowstate(name, data) VALUES (?, ?)",
                         [("status", b""), ("importance", b"")])
        conn.execute("COMMIT")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()
    for suffix in ("-wal", "-shm"):
        Path(str(tmp_db) + suffix).unlink(missing_ok=True)
    os.replace(tmp_db, root / DB_NAME)
    return root


class CKFCommitter:
    """The one object per process and CKF that changes it; its own SQLite connection.

    Every change is a `writing()` transaction under the CKF's file lock; the lock makes
    writers in other processes wait (`CKFBusyError` after `lock_timeout`)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._conn = connect(self.path / DB_NAME)
        self._conn.execute(f"PRAGMA cache_size=-{_WRITER_CACHE_KIB}")
        self._lock = threading.RLock()
        try:
            self.layout: Layout = read_layout(self._conn, self.path)
        except BaseException:
            self._conn.close()
            raise

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def state(self) -> CommittedState:
        """The latest committed state (what the next transaction starts from)."""
        with self._lock:
            return read_state(self._conn, self.path, self.layout)

    # ------------------------------------------------------------------ locking

    @contextlib.contextmanager
    def locked(self, timeout: float = _LOCK_TIMEOUT) -> Iterator[CommittedState]:
        """Hold the write lock (this thread and other processes excluded) and yield the
        committed state as of taking it."""
        with self._lock, self._file_lock(timeout):
            yield read_state(self._conn, self.path, self.layout)

    @contextlib.contextmanager
    def _file_lock(self, timeout: float) -> Iterator[None]:
        fd = os.open(self.path / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            deadline = time.monotonic() + timeout
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        raise CKFBusyError(
                            f"{self.path} is being written by another process "
                            f"(waited {timeout:.0f} s for its lock)") from None
                    time.sleep(0.05)
            try:
                yield
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    # ------------------------------------------------------------------ transactions

    @contextlib.contextmanager
    def writing(self, lock_timeout: float = _LOCK_TIMEOUT) -> Iterator[WriteTxn]:
        """One atomic change. Leftovers of an interrupted writer (array tails, files of an
        abandoned compaction) are removed first; any failure or kill before the COMMIT
        leaves the previous state."""
        with self.locked(lock_timeout) as st:
            if st.meta["model_id"] != self.layout.model_id:
                raise InvalidInputError(
                    f"{self.path} was re-embedded as {st.meta['model_id']!r} while this "
                    f"writer held {self.layout.model_id!r}: open the CKF again and retry")
            for p in other_epoch_files(self.path, st.epoch):
                p.unlink(missing_ok=True)
            st.files.truncate(st.n_rows, st.n_hashes)
            txn = WriteTxn(self._conn, st.files, self.layout.dim, st.n_rows, st.n_hashes,
                           int(st.offsets[-1]), st.status, st.importance, st.generation)
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                yield txn
                txn.finish()
                self._conn.execute("COMMIT")
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            if txn.n_rows > txn.base_rows:
                self.extend_quantised()

    def extend_quantised(self) -> None:
        """Extend the int8 copy (`cdr.retrieval.scan`) over newly committed rows once the store
        has `QUANT_MIN_ROWS` facts; call under the file lock, after a COMMIT. Incremental, so
        each commit pays for its own rows only. The copy is an accelerator derived from the
        committed rows: if building it fails (disk full), the commit stands, `select` scans
        the uncovered rows exactly, and the next commit tries again."""
        from cdr.retrieval import scan

        st = read_state(self._conn, self.path, self.layout)
        if not scan.wants_quantised(st.n_rows):
            return
        try:
            scan.build_quantised(self.path, st.epoch, st.embeddings)
        except OSError as exc:
            log.warning("%s: the int8 scan copy was not extended (%s); select scans the "
                        "rows it does not cover exactly", self.path, exc)

    def delete_document(self, doc_id: str) -> int:
        """Remove a document; returns how many facts left the selectable set."""
        with self.writing() as txn:
            return txn.delete_document(doc_id)

    def set_document_importance(self, doc_id: str, importance: float) -> None:
        with self.writing() as txn:
            txn.set_document_importance(doc_id, importance)

    def set_document_status(self, doc_id: str, status: str) -> None:
        with self.writing() as txn:
            txn.set_document_status(doc_id, status)

    def set_quarantine(self, rows: Sequence[int], flag: bool) -> None:
        with self.writing() as txn:
            txn.set_quarantine(rows, flag)

    def append_raw(self, contents: Sequence[str], vectors: np.ndarray, *,
                   tokens: np.ndarray | None = None,
                   ngram_lists: Sequence[np.ndarray] | None = None,
                   source: str = "synthetic", importance: float = 0.6) -> None:
        """Append rows with precomputed vectors as one document (benchmarks and imports).
        Vectors must come from this CKF's model; they are checked for shape and unit norm."""
        from cdr.ckf.chunk import fact_id
        from cdr.ngrams import ngram_hashes
        from cdr.text.tokens import count_tokens_batch

        dim = self.layout.dim
        vectors = np.asarray(vectors, dtype=np.float32)
        if vectors.ndim != 2 or vectors.shape != (len(contents), dim):
            raise InvalidInputError(f"vectors must have shape ({len(contents)}, {dim}), "
                                    f"got {vectors.shape}")
        norms = np.linalg.norm(vectors, axis=1)
        if not np.all(np.abs(norms - 1) < 1e-3):
            raise InvalidInputError("vectors must be finite unit rows")
        tokens = count_tokens_batch(list(contents)) if tokens is None else np.asarray(tokens)
        if ngram_lists is None:
            ngram_lists = [ngram_hashes(c) for c in contents]
        ids = [fact_id(c) for c in contents]
        if len(set(ids)) != len(ids):
            raise InvalidInputError("append_raw contents must be distinct")
        # No lookup of the ids first (a point query per row into a large random index):
        # `facts.id` is UNIQUE, so a content already stored fails the INSERT and the whole
        # transaction (arrays included: nothing is committed) rolls back.
        with self.writing() as txn:
            try:
                txn.append_raw_document(source, importance, contents, vectors, tokens,
                                        ngram_lists, ids)
            except sqlite3.IntegrityError as exc:
                if "facts.id" not in str(exc):
                    raise
                raise InvalidInputError("some contents are already in the CKF") from None

    # ------------------------------------------------------------------ maintenance queries

    def sqlite_problems(self, deep: bool) -> list[str]:
        """SQLite's own verdict on the database file (integrity_check, or quick_check)."""
        pragma = "integrity_check" if deep else "quick_check"
        with self._lock:
            result = [r for (r,) in self._conn.execute(f"PRAGMA {pragma}")]
        return [] if result == ["ok"] else [f"sqlite {pragma}: {'; '.join(result[:5])}"]

    def fact_columns(self) -> list[tuple[int, str, float, int, int]]:
        """(row, status name, importance, tokens, quarantined) of every fact row, by row."""
        with self._lock:
            return self._conn.execute(
                "SELECT row, status, importance, tokens, quarantined FROM facts ORDER BY row"
            ).fetchall()

    def occurrence_rows(self) -> np.ndarray:
        """The row of every occurrence (a document holding a fact), int64."""
        with self._lock:
            return np.array([r for (r,) in self._conn.execute("SELECT row FROM occurrences")],
                            dtype=np.int64)

    def miscounted_documents(self) -> int:
        """Documents whose recorded fact count differs from their occurrences."""
        with self._lock:
            return len(self._conn.execute(
                "SELECT d.doc_id FROM documents d LEFT JOIN occurrences o "
                "ON o.doc_id = d.doc_id GROUP BY d.doc_id "
                "HAVING COUNT(o.row) != MAX(d.n_facts)").fetchall())

    def fact_texts(self, rows: Sequence[int]) -> list[tuple[int, str, str]]:
        """(row, id, content) of `rows`, in row order (for re-deriving ids and hashes)."""
        out: list[tuple[int, str, str]] = []
        with self._lock:
            for part in chunks(sorted(set(int(r) for r in rows))):
                out += self._conn.execute(
                    f"SELECT row, id, content FROM facts WHERE row IN "
                    f"({','.join('?' * len(part))}) ORDER BY row", list(part)).fetchall()
        return out

    def switch_epoch(self, st: CommittedState, kept: np.ndarray, files: ArrayFiles,
                     n_hashes: int) -> None:
        """Commit a compaction: drop DELETED facts, renumber the `kept` rows to 0..k-1 and
        point meta at `files` (already written and fsynced) in one SQLite transaction.
        Call inside `locked()`, with the state it yielded."""
        conn = self._conn
        moved = [(int(o), k) for k, o in enumerate(kept.tolist()) if o != k]
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.execute("DELETE FROM facts WHERE status = 'DELETED'")
            conn.execute("CREATE TEMP TABLE rowmap (old INTEGER PRIMARY KEY, new INTEGER)")
            conn.executemany("INSERT INTO rowmap(old, new) VALUES (?, ?)", moved)
            conn.execute("UPDATE facts SET row = -1 - (SELECT new FROM rowmap WHERE old = row)"
                         " WHERE row IN (SELECT old FROM rowmap)")
            conn.execute("UPDATE facts SET row = -1 - row WHERE row < 0")
            conn.execute("UPDATE occurrences SET row = (SELECT new FROM rowmap WHERE old = row)"
                         " WHERE row IN (SELECT old FROM rowmap)")
            conn.execute("DROP TABLE rowmap")
            conn.executemany(
                "UPDATE rowstate SET data = ? WHERE name = ?",
                [(np.asarray(st.status)[kept].astype(np.uint8).tobytes(), "status"),
                 (np.asarray(st.importance)[kept].astype("<f4").tobytes(), "importance")])
            write_meta(conn, {"epoch": files.epoch, "n_rows": len(kept), "n_hashes": n_hashes,
                              "generation": st.generation + 1})
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise

    def switch_identity(self, st: CommittedState, files: ArrayFiles, model_id: str) -> None:
        """Commit a re-embedding: point meta at `files` (a new epoch, same rows, already
        written and fsynced) and record the new embedding identity, in one transaction. Call
        inside `locked()`, with the state it yielded."""
        conn = self._conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            write_meta(conn, {"epoch": files.epoch, "model_id": model_id,
                              "generation": st.generation + 1, "updated_at": now()})
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        self.layout = read_layout(conn, self.path)

    def fact_contexts(self, lo: int, hi: int) -> list[tuple[str, str | None, str]]:
        """(content, document title, section) of rows lo..hi-1 in row order: what a recipe
        needs to rebuild a fact's embedding text (the title of the document that brought it)."""
        with self._lock:
            return self._conn.execute(
                "SELECT f.content, d.title, f.section FROM facts f LEFT JOIN documents d "
                "ON d.doc_id = f.doc_id WHERE f.row >= ? AND f.row < ? ORDER BY f.row",
                (lo, hi)).fetchall()

