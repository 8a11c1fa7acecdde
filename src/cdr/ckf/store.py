"""The CKF on disk: a directory with an SQLite database and memory-mapped per-row arrays.

Opening a store reads two small blobs (status, importance) and maps the array files; no
per-fact Python object is made, so opening a million-fact CKF takes milliseconds. Phase 1
`select` is one matrix-vector product over the map and a few numpy masks.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from cdr.ckf.arrays import DTYPES, ArrayFiles, other_epoch_files
from cdr.ckf.model import Fact, FactStatus, Selection, check_importance
from cdr.ckf.scan import gated_rows, open_quantised
from cdr.ckf.schema import (
    DB_NAME,
    DDL,
    LOCK_NAME,
    SCHEMA_VERSION,
    connect,
    doc_id_for,
    now,
    read_meta,
    write_meta,
)
from cdr.ckf.txn import WriteTxn, chunks
from cdr.errors import CdrError, EmbeddingModelMismatchError, InvalidInputError, NotFoundError

if TYPE_CHECKING:
    from cdr.embed import Embedder
    from cdr.ngrams import NgramIndex

_SELECT_BLOCK = 1024  # rows per block for float16 (no BLAS path; small blocks stay in cache)


class CKFBusyError(CdrError):
    """Another process holds the CKF's write lock for longer than we were willing to wait."""


def _embedder_dim(embedder: Embedder) -> int:
    return int(embedder.dim)


class CKF:
    """A Contextual Knowledge Fabric: facts, their unit embeddings (one model), 6-gram hashes.

    Row numbers index every per-row array and are stable across ingests; only `compact()`
    renumbers. Readers see the state as of `open` (or the last `refresh()`/own write).
    """

    def __init__(self, path: Path, embedder: Embedder | None) -> None:
        self.path = path
        self._conn = connect(path / DB_NAME)
        self._lock = threading.RLock()
        meta = read_meta(self._conn)
        version = int(meta.get("schema_version", "0"))
        if version != SCHEMA_VERSION:
            self._conn.close()
            raise InvalidInputError(
                f"{path}: CKF schema version {version} is not supported (this cdr reads "
                f"version {SCHEMA_VERSION})"
            )
        self.model_id: str = meta["model_id"]
        self.dim: int = int(meta["dim"])
        self.dtype: str = meta["dtype"]
        self._embedder: Embedder | None = None
        if embedder is not None:
            self._check_embedder(embedder)
            self._embedder = embedder
        self._load()

    # ------------------------------------------------------------------ open / create

    @classmethod
    def create(cls, path: str | os.PathLike[str], embedder: Embedder | None = None, *,
               dtype: str = "float32") -> CKF:
        """A new, empty CKF bound to `embedder`'s model (default: the offline default)."""
        if dtype not in DTYPES:
            raise InvalidInputError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
        if embedder is None:
            from cdr.embed import default_embedder

            embedder = default_embedder()
        root = Path(path).expanduser()
        if (root / DB_NAME).exists():
            raise InvalidInputError(f"{root} is already a CKF; open it instead")
        if root.exists() and (not root.is_dir() or any(root.iterdir())):
            raise InvalidInputError(f"{root} exists and is not an empty directory")
        root.mkdir(parents=True, exist_ok=True)
        root = root.resolve()
        ArrayFiles(root, 0, int(embedder.dim), dtype).initialise()
        tmp_db = root / (DB_NAME + ".init")
        tmp_db.unlink(missing_ok=True)
        conn = connect(tmp_db)
        try:
            conn.execute("BEGIN")
            for statement in _statements(DDL):
                conn.execute(statement)
            ts = now()
            write_meta(conn, {
                "schema_version": SCHEMA_VERSION, "model_id": embedder.model_id,
                "dim": int(embedder.dim), "dtype": dtype, "generation": 0, "epoch": 0,
                "n_rows": 0, "n_hashes": 0, "created_at": ts, "updated_at": ts,
            })
            conn.executemany("INSERT INTO rowstate(name, data) VALUES (?, ?)",
                             [("status", b""), ("importance", b"")])
            conn.execute("COMMIT")
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            conn.close()
        for suffix in ("-wal", "-shm"):
            Path(str(tmp_db) + suffix).unlink(missing_ok=True)
        os.replace(tmp_db, root / DB_NAME)  # the database appears complete or not at all
        return cls(root, embedder)

    @classmethod
    def open(cls, path: str | os.PathLike[str], embedder: Embedder | None = None) -> CKF:
        """Open an existing CKF. With `embedder=None` the default model is loaded when first
        needed (and must match the recorded model then); stats and reads need no model."""
        root = Path(path).expanduser()
        if not (root / DB_NAME).is_file():
            raise NotFoundError(f"no CKF at {root} (missing {DB_NAME}); create it with "
                                "`cdr ingest PATH --ckf DIR`")
        return cls(root.resolve(), embedder)

    @classmethod
    def open_or_create(cls, path: str | os.PathLike[str], embedder: Embedder | None = None,
                       *, dtype: str = "float32") -> CKF:
        root = Path(path).expanduser()
        if (root / DB_NAME).is_file():
            return cls.open(root, embedder)
        return cls.create(root, embedder, dtype=dtype)

    def close(self) -> None:
        with self._lock:
            self._conn.close()
            self._ngram_index = None

    def __enter__(self) -> CKF:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"CKF({str(self.path)!r}, model={self.model_id!r}, rows={self.n_rows})"

    # ------------------------------------------------------------------ embedder

    def _check_embedder(self, embedder: Embedder) -> None:
        if embedder.model_id != self.model_id:
            raise EmbeddingModelMismatchError(self.model_id, embedder.model_id)
        dim = _embedder_dim(embedder)
        if dim != self.dim:
            raise EmbeddingModelMismatchError(
                f"{self.model_id} ({self.dim}-d)", f"{embedder.model_id} ({dim}-d)")

    @property
    def embedder(self) -> Embedder:
        if self._embedder is None:
            from cdr.embed import default_embedder

            candidate = default_embedder()
            self._check_embedder(candidate)
            self._embedder = candidate
        return self._embedder

    def encode_query(self, text: str) -> np.ndarray:
        """The unit query vector of `text` under this CKF's model."""
        if not isinstance(text, str) or not text.strip():
            raise InvalidInputError("query text is empty")
        return self.embedder.encode([text])[0]

    # ------------------------------------------------------------------ state

    def _load(self) -> None:
        """Read the committed snapshot (meta + row-state blobs in one read transaction)."""
        with self._lock:
            self._conn.execute("BEGIN")
            try:
                meta = read_meta(self._conn)
                blobs = dict(self._conn.execute("SELECT name, data FROM rowstate").fetchall())
            finally:
                self._conn.execute("COMMIT")
            n_rows, n_hashes = int(meta["n_rows"]), int(meta["n_hashes"])
            files = ArrayFiles(self.path, int(meta["epoch"]), self.dim, self.dtype)
            emb, tokens, offsets, hashes = files.map(n_rows, n_hashes)
            status = np.frombuffer(blobs["status"], dtype=np.uint8)
            importance = np.frombuffer(blobs["importance"], dtype="<f4")
            if len(status) != n_rows or len(importance) != n_rows:
                raise InvalidInputError(f"{self.path}: row state does not match {n_rows} rows")
            self._meta = meta
            self._files = files
            self._generation = int(meta["generation"])
            self._n_rows, self._n_hashes = n_rows, n_hashes
            self._emb, self._tokens, self._offsets, self._hashes = emb, tokens, offsets, hashes
            self._status, self._importance = status, importance
            active = status <= FactStatus.STALE
            active.flags.writeable = False
            self._active = active
            self._active_rows: np.ndarray | None = None
            self._ngram_index = None

    def refresh(self) -> bool:
        """Pick up commits made by other processes; True if anything changed."""
        with self._lock:
            (gen,) = self._conn.execute(
                "SELECT value FROM meta WHERE key='generation'").fetchone()
            if int(gen) == self._generation:
                return False
            self._load()
            return True

    @property
    def generation(self) -> int:
        return self._generation

    @property
    def n_rows(self) -> int:
        return self._n_rows

    @property
    def embeddings(self) -> np.ndarray:
        """(n_rows, dim) memory-mapped unit rows (float32, or float16 if created so)."""
        return self._emb

    @property
    def importance(self) -> np.ndarray:
        return self._importance

    @property
    def status(self) -> np.ndarray:
        """uint8 per row, values of `FactStatus`."""
        return self._status

    @property
    def active(self) -> np.ndarray:
        """Selectable rows (ACTIVE or STALE)."""
        return self._active

    @property
    def token_counts(self) -> np.ndarray:
        return self._tokens

    @property
    def ngram_offsets(self) -> np.ndarray:
        return self._offsets

    @property
    def ngram_hashes(self) -> np.ndarray:
        return self._hashes

    @property
    def ngram_index(self) -> NgramIndex:
        """CSR of per-row 6-gram hashes, built on first use from the mapped arrays."""
        with self._lock:
            if self._ngram_index is None:
                from cdr.ngrams import NgramIndex

                self._ngram_index = NgramIndex(self._offsets, self._hashes)
            return self._ngram_index

    # ------------------------------------------------------------------ Phase 1

    def select(self, query_vector: Any, min_relevance: float,
               limit: int | None = None) -> Selection:
        """Active rows with cosine(query, fact) ≥ min_relevance, best first (ties by row)."""
        q = np.asarray(query_vector, dtype=np.float32)
        if q.ndim == 2 and q.shape[0] == 1:
            q = q[0]
        if q.ndim != 1 or q.shape[0] != self.dim:
            raise InvalidInputError(
                f"query vector has shape {tuple(np.shape(query_vector))}; this CKF's model "
                f"{self.model_id!r} has dimension {self.dim}"
            )
        if not np.isfinite(q).all():
            raise InvalidInputError("query vector contains NaN or infinite values")
        norm = float(np.linalg.norm(q))
        if norm <= 1e-12:
            raise InvalidInputError("query vector is zero; cosine similarity is undefined")
        q = q * np.float32(1.0 / norm)
        try:
            gate = float(min_relevance)
        except (TypeError, ValueError):
            raise InvalidInputError(f"min_relevance must be a number, got {min_relevance!r}") \
                from None
        if not np.isfinite(gate):
            raise InvalidInputError(f"min_relevance must be finite, got {min_relevance!r}")
        if limit is not None and (isinstance(limit, bool) or int(limit) != limit or limit < 0):
            raise InvalidInputError(f"limit must be a non-negative integer, got {limit!r}")
        emb, active = self._emb, self._active
        if len(emb) == 0 or limit == 0:
            return _empty_selection(self.dim)
        # The scan engine (cdr.ckf.scan) picks exact float32 BLAS, the float16 kernel, or the
        # int8 copy + exact rescoring when one was built; the result is the same gated set.
        idx, rel = gated_rows(emb, q, gate, active, open_quantised(
            self.path, self._files.epoch, self.dim, len(emb)))
        if limit is not None and len(idx) > limit:
            cut = len(rel) - int(limit)
            part = np.argpartition(rel, cut)[cut:]
            idx, rel = idx[part], rel[part]
        order = np.lexsort((idx, -rel))
        idx, rel = idx[order].astype(np.int64), rel[order].astype(np.float32)
        return Selection(idx, rel, np.asarray(emb[idx], dtype=np.float32))

    def _similarities(self, emb: np.ndarray, q: np.ndarray) -> np.ndarray:
        if emb.dtype == np.float32:
            return emb @ q
        out = np.empty(len(emb), dtype=np.float32)
        for s in range(0, len(emb), _SELECT_BLOCK):
            out[s : s + _SELECT_BLOCK] = emb[s : s + _SELECT_BLOCK].astype(np.float32) @ q
        return out

    def search(self, text: str, *, limit: int = 10, min_relevance: float = -1.0
               ) -> list[tuple[Fact, float]]:
        """Top facts for a text query (for people: the CLI and debugging)."""
        sel = self.select(self.encode_query(text), min_relevance, limit)
        return list(zip(self.facts(sel.indices), sel.relevances.tolist(), strict=True))

    # ------------------------------------------------------------------ reading facts

    _FACT_COLUMNS = ("row, id, content, source, location, section, importance, is_code, tokens,"
                     " status, doc_id, created_at, updated_at")

    def _check_rows(self, rows: Iterable[int] | np.ndarray) -> list[int]:
        arr = np.asarray(list(rows) if not isinstance(rows, np.ndarray) else rows)
        if arr.size == 0:
            return []
        if not np.issubdtype(arr.dtype, np.integer):
            raise InvalidInputError(f"rows must be integers, got {arr.dtype}")
        bad = arr[(arr < 0) | (arr >= self._n_rows)]
        if bad.size:
            raise InvalidInputError(f"row {int(bad[0])} out of range (CKF has {self._n_rows} rows)")
        return arr.astype(np.int64).tolist()

    @contextlib.contextmanager
    def _snapshot_read(self) -> Iterator[None]:
        """A read transaction on the rows of this object's epoch. Statuses and importance
        come from the snapshot arrays; content is immutable per row, so only a compaction
        (which renumbers rows) can make the database disagree with the snapshot."""
        with self._lock:
            own = not self._conn.in_transaction  # inside our own write: already consistent
            if own:
                self._conn.execute("BEGIN")
            try:
                (epoch,) = self._conn.execute(
                    "SELECT value FROM meta WHERE key='epoch'").fetchone()
                if str(epoch) != str(self._meta["epoch"]):
                    raise NotFoundError(
                        f"{self.path} was compacted after this handle was opened (its rows "
                        "were renumbered); open it again")
                yield
            finally:
                if own:
                    self._conn.execute("COMMIT")

    def facts(self, rows: Iterable[int] | np.ndarray) -> list[Fact]:
        """The facts at `rows`, in the order given."""
        wanted = self._check_rows(rows)
        found: dict[int, Fact] = {}
        with self._snapshot_read():
            for part in chunks(sorted(set(wanted))):
                q = (f"SELECT {self._FACT_COLUMNS} FROM facts "
                     f"WHERE row IN ({','.join('?' * len(part))})")
                for r in self._conn.execute(q, list(part)):
                    found[r[0]] = Fact(
                        row=r[0], id=r[1], content=r[2], source=r[3], location=r[4],
                        section=r[5], importance=float(self._importance[r[0]]),
                        is_code=bool(r[7]), tokens=int(r[8]),
                        status=FactStatus(int(self._status[r[0]])), doc_id=r[10],
                        created_at=r[11], updated_at=r[12],
                    )
        missing = [r for r in wanted if r not in found]
        if missing:
            raise NotFoundError(f"row {missing[0]} is not in the database of {self.path}")
        return [found[r] for r in wanted]

    def fact_ids(self, rows: Iterable[int] | np.ndarray) -> list[str]:
        """Just the ids of `rows` (what sessions and traces keep), in the order given."""
        wanted = self._check_rows(rows)
        ids: dict[int, str] = {}
        with self._snapshot_read():
            for part in chunks(sorted(set(wanted))):
                q = f"SELECT row, id FROM facts WHERE row IN ({','.join('?' * len(part))})"
                ids.update(self._conn.execute(q, list(part)).fetchall())
        return [ids[r] for r in wanted]

    def rows_for_ids(self, ids: Sequence[str]) -> np.ndarray:
        """Row of each fact id (-1 where unknown)."""
        out = np.full(len(ids), -1, dtype=np.int64)
        pos: dict[str, list[int]] = {}
        for k, i in enumerate(ids):
            pos.setdefault(str(i), []).append(k)
        with self._snapshot_read():
            for part in chunks(list(pos)):
                q = f"SELECT id, row FROM facts WHERE id IN ({','.join('?' * len(part))})"
                for fid, row in self._conn.execute(q, list(part)):
                    if row < self._n_rows:
                        out[pos[fid]] = row
        return out

    def vectors(self, rows: Iterable[int] | np.ndarray) -> np.ndarray:
        return np.asarray(self._emb[self._check_rows(rows)], dtype=np.float32)

    # ------------------------------------------------------------------ documents

    _DOC_COLUMNS = ("doc_id", "source", "kind", "title", "content_hash", "size", "source_type",
                    "importance", "status", "n_facts", "created_at", "updated_at")

    def documents(self) -> list[dict[str, Any]]:
        with self._lock:
            cur = self._conn.execute(
                f"SELECT {', '.join(self._DOC_COLUMNS)} FROM documents ORDER BY source")
            return [dict(zip(self._DOC_COLUMNS, r, strict=True)) for r in cur]

    def document(self, doc: str) -> dict[str, Any]:
        """A document by id, source, path (resolved) or unique id prefix (≥ 6 characters)."""
        doc = str(doc)
        cols = ", ".join(self._DOC_COLUMNS)
        with self._lock:
            for where, arg in (("doc_id = ?", doc), ("source = ?", doc)):
                r = self._conn.execute(f"SELECT {cols} FROM documents WHERE {where}",
                                       (arg,)).fetchone()
                if r:
                    return dict(zip(self._DOC_COLUMNS, r, strict=True))
            resolved = str(Path(doc).expanduser().resolve())
            r = self._conn.execute(f"SELECT {cols} FROM documents WHERE source = ?",
                                   (resolved,)).fetchone()
            if r:
                return dict(zip(self._DOC_COLUMNS, r, strict=True))
            if len(doc) >= 6:
                rs = self._conn.execute(
                    f"SELECT {cols} FROM documents WHERE doc_id LIKE ?",
                    (doc.replace("%", "").replace("_", "") + "%",)).fetchall()
                if len(rs) == 1:
                    return dict(zip(self._DOC_COLUMNS, rs[0], strict=True))
        raise NotFoundError(f"no document {doc!r} in the CKF at {self.path}")

    def document_state(self, source: str) -> dict[str, Any] | None:
        with self._lock:
            r = self._conn.execute(
                f"SELECT {', '.join(self._DOC_COLUMNS)} FROM documents WHERE doc_id = ?",
                (doc_id_for(source),)).fetchone()
        return dict(zip(self._DOC_COLUMNS, r, strict=True)) if r else None

    def known_ids(self, ids: Sequence[str]) -> set[str]:
        """Which of these fact ids already have a row (and so a vector)."""
        out: set[str] = set()
        with self._lock:
            for part in chunks(list(dict.fromkeys(ids))):
                q = f"SELECT id FROM facts WHERE id IN ({','.join('?' * len(part))})"
                out.update(i for (i,) in self._conn.execute(q, list(part)))
        return out

    # ------------------------------------------------------------------ writing

    @contextlib.contextmanager
    def writing(self, lock_timeout: float = 60.0) -> Iterator[WriteTxn]:
        """One atomic change. Arrays are appended (and fsynced) before the SQLite COMMIT that
        makes them count; any failure or kill before it leaves the previous state."""
        with self._lock, self._file_lock(lock_timeout):
            self._load()  # another process may have committed since we opened
            for p in other_epoch_files(self.path, int(self._meta["epoch"])):
                p.unlink(missing_ok=True)
            self._files.truncate(self._n_rows, self._n_hashes)
            txn = WriteTxn(self._conn, self._files, self.dim, self._n_rows, self._n_hashes,
                           int(self._offsets[-1]), self._status, self._importance,
                           self._generation)
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                yield txn
                txn.finish()
                self._conn.execute("COMMIT")
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            finally:
                self._load()

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

    def delete_document(self, doc_id_or_source: str) -> int:
        """Remove a document; returns how many facts left the selectable set (facts that
        another document also holds stay). Rows stay, inactive, until `compact()`."""
        doc_id = self.document(doc_id_or_source)["doc_id"]
        with self.writing() as txn:
            return txn.delete_document(doc_id)

    def set_document_importance(self, doc_id_or_source: str, importance: float) -> None:
        imp = check_importance(importance)
        doc_id = self.document(doc_id_or_source)["doc_id"]
        with self.writing() as txn:
            txn.set_document_importance(doc_id, imp)

    def set_document_status(self, doc_id_or_source: str, status: str | FactStatus) -> None:
        """Mark a document STALE (its facts stay selectable but flagged) or ACTIVE again."""
        st = FactStatus.parse(status)
        if st not in (FactStatus.ACTIVE, FactStatus.STALE):
            raise InvalidInputError("a document is ACTIVE or STALE; delete it to remove it")
        doc_id = self.document(doc_id_or_source)["doc_id"]
        with self.writing() as txn:
            txn.set_document_status(doc_id, st.name)

    def _rows_of(self, facts: Iterable[int | str]) -> list[int]:
        items = list(facts)
        ids = [f for f in items if isinstance(f, str)]
        rows = [int(f) for f in items if not isinstance(f, str)]
        if ids:
            found = self.rows_for_ids(ids)
            if (found < 0).any():
                raise NotFoundError(f"no fact with id {ids[int(np.argmin(found))]!r}")
            rows.extend(found.tolist())
        return self._check_rows(rows)

    def quarantine(self, facts: Iterable[int | str]) -> None:
        """Withdraw facts (by row or id) from selection until `unquarantine`; the flag
        survives re-ingesting their documents."""
        rows = self._rows_of(facts)
        with self.writing() as txn:
            txn.set_quarantine(rows, True)

    def unquarantine(self, facts: Iterable[int | str]) -> None:
        rows = self._rows_of(facts)
        with self.writing() as txn:
            txn.set_quarantine(rows, False)

    def append_raw(self, contents: Sequence[str], vectors: np.ndarray, *,
                   tokens: np.ndarray | None = None,
                   ngram_lists: Sequence[np.ndarray] | None = None,
                   source: str = "synthetic", importance: float = 0.6) -> None:
        """Append rows with precomputed vectors as one document (benchmarks and imports).
        Vectors must come from this CKF's model; they are checked for shape and unit norm."""
        from cdr.ckf.chunk import fact_id
        from cdr.tokens import count_tokens_batch

        vectors = np.asarray(vectors, dtype=np.float32)
        if vectors.ndim != 2 or vectors.shape != (len(contents), self.dim):
            raise InvalidInputError(f"vectors must have shape ({len(contents)}, {self.dim}), "
                                    f"got {vectors.shape}")
        norms = np.linalg.norm(vectors, axis=1)
        if not np.all(np.abs(norms - 1) < 1e-3):
            raise InvalidInputError("vectors must be finite unit rows")
        tokens = count_tokens_batch(list(contents)) if tokens is None else np.asarray(tokens)
        if ngram_lists is None:
            from cdr.ngrams import ngram_hashes

            ngram_lists = [ngram_hashes(c) for c in contents]
        ids = [fact_id(c) for c in contents]
        if len(set(ids)) != len(ids):
            raise InvalidInputError("append_raw contents must be distinct")
        doc_id = doc_id_for(source)
        with self.writing() as txn:
            if txn.lookup(ids):
                raise InvalidInputError("some contents are already in the CKF")
            txn.conn.execute(
                "INSERT INTO documents(doc_id, source, kind, title, content_hash, size,"
                " source_type, importance, status, n_facts, created_at, updated_at)"
                " VALUES (?,?,'raw',NULL,'',0,'user',?,'ACTIVE',0,?,?)"
                " ON CONFLICT(doc_id) DO NOTHING",
                (doc_id, source, importance, txn.ts, txn.ts))
            (base,) = txn.conn.execute(
                "SELECT COALESCE(MAX(ordinal) + 1, 0) FROM occurrences WHERE doc_id=?",
                (doc_id,)).fetchone()
            txn.add_raw_rows(contents, vectors, tokens, ngram_lists, doc_id, source, importance,
                             ids, ordinal_base=int(base))
            txn.conn.execute("UPDATE documents SET n_facts = n_facts + ? WHERE doc_id=?",
                             (len(contents), doc_id))

    # ------------------------------------------------------------------ maintenance

    def stats(self) -> dict[str, Any]:
        from cdr.ckf.maintenance import stats

        return stats(self)

    def check(self, *, deep: bool = True) -> list[str]:
        """Integrity problems found (empty list: consistent)."""
        from cdr.ckf.maintenance import check

        return check(self, deep=deep)

    def compact(self) -> dict[str, int]:
        """Drop DELETED rows and renumber the rest (rows change!); returns before/after."""
        from cdr.ckf.maintenance import compact

        return compact(self)


def _statements(ddl: str) -> list[str]:
    return [s.strip() for s in ddl.split(";") if s.strip()]


def _empty_selection(dim: int) -> Selection:
    return Selection(np.zeros(0, np.int64), np.zeros(0, np.float32),
                     np.zeros((0, dim), np.float32))
