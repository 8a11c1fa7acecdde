"""The CKF on disk, read side: `CKFSnapshot`, one committed state, the local `FactIndex`.

A directory holds an SQLite database and memory-mapped per-row arrays. A snapshot serves
Phase 1 `select` (one matrix-vector product over the map and a few numpy masks), fact and
document reads and stats from the state it opened, and never writes: everything that does is
`cdr.ckf.committer.CKFCommitter`.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, Self, TypeVar, overload

import numpy as np

from cdr.ckf.records import Fact, FactStatus, Selection
from cdr.ckf.schema import DB_NAME, SCHEMA_VERSION, connect, doc_id_for
from cdr.ckf.state import (
    CommittedState,
    Layout,
    read_epoch,
    read_generation,
    read_layout,
    read_state,
)
from cdr.ckf.txn import chunks
from cdr.errors import EmbeddingModelMismatchError, InvalidInputError, NotFoundError
from cdr.retrieval.fact_recipe import bind, split_identity
from cdr.retrieval.factindex import check_gate, select_rows
from cdr.retrieval.scan import open_quantised
from cdr.vectors import check_query

if TYPE_CHECKING:
    from cdr.ngrams import NgramIndex
    from cdr.retrieval.embed import Embedder

_FACT_COLUMNS = ("row, id, content, source, location, section, importance, is_code, tokens,"
                 " status, doc_id, created_at, updated_at")
_DOC_COLUMNS = ("doc_id", "source", "kind", "title", "content_hash", "size", "source_type",
                "importance", "status", "n_facts", "created_at", "updated_at")
T = TypeVar("T")


class _FromState(Generic[T]):
    """A read-only attribute of the snapshot that is a field of its committed state
    (`CKFSnapshot._state`, replaced whole when a `CKF` catches up), read at the moment it is
    asked, as a property would, without a property's three lines per field."""

    def __init__(self, read: Callable[[CommittedState], T]) -> None:
        self._read = read

    @overload
    def __get__(self, instance: None, owner: type) -> Self: ...
    @overload
    def __get__(self, instance: CKFSnapshot, owner: type | None = None) -> T: ...
    def __get__(self, instance: CKFSnapshot | None, owner: type | None = None) -> T | Self:
        # `instance` is the CKFSnapshot this descriptor belongs to: reading its own class's
        # state, not another object's private field.
        return self if instance is None else self._read(instance._state)

    def __set__(self, instance: CKFSnapshot, value: object) -> None:
        raise AttributeError("read-only: a field of the snapshot's committed state")


class CKFSnapshot:
    """A Contextual Knowledge Fabric as of one commit: facts, their unit embeddings (one
    model), 6-gram hashes. Implements `cdr.retrieval.factindex.FactIndex`.

    Row numbers index every per-row array and are stable across ingests; only a compaction
    renumbers them, after which fact reads refuse (open the CKF again)."""

    def __init__(self, path: Path, embedder: Embedder | None = None) -> None:
        self._path = Path(path)
        self._conn = connect(self._path / DB_NAME)
        self._lock = threading.RLock()
        try:
            self.layout: Layout = read_layout(self._conn, self._path)
            if embedder is not None:
                embedder = self._check_embedder(embedder)
            self._state: CommittedState = read_state(self._conn, self._path, self.layout)
        except BaseException:
            self._conn.close()
            raise
        self._embedder = embedder
        self._ngram_index: NgramIndex | None = None

    @classmethod
    def open(cls, path: str | os.PathLike[str], embedder: Embedder | None = None) -> Self:
        """Open an existing CKF. With `embedder=None` the default model is loaded when first
        needed (and must match the recorded model then); stats and reads need no model."""
        root = Path(path).expanduser()
        if not (root / DB_NAME).is_file():
            raise NotFoundError(f"no CKF at {root} (missing {DB_NAME}); create it with "
                                "`cdr ingest PATH --ckf DIR`")
        return cls(root.resolve(), embedder)

    def close(self) -> None:
        with self._lock:
            self._conn.close()
            self._ngram_index = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({str(self.path)!r}, model={self.model_id!r}, "
                f"rows={self.n_rows})")

    # ------------------------------------------------------------------ identity

    @property
    def path(self) -> Path:
        return self._path

    @property
    def model_id(self) -> str:
        """The embedding identity: the model id, plus `#<recipe>` when facts were embedded with
        their context (`cdr.retrieval.fact_recipe`)."""
        return self.layout.model_id

    @property
    def recipe(self) -> str:
        """How facts' texts became vectors here (`cdr.retrieval.fact_recipe.RECIPES`)."""
        return split_identity(self.layout.model_id)[1]

    @property
    def dim(self) -> int:
        return self.layout.dim

    @property
    def dtype(self) -> str:
        return self.layout.dtype

    def _check_embedder(self, embedder: Embedder) -> Embedder:
        """`embedder` bound to this CKF's identity (a bare model gets the recipe); refused when
        its model or dimension is another."""
        bound: Embedder = bind(embedder, self.model_id)
        dim = int(bound.dim)
        if dim != self.dim:
            raise EmbeddingModelMismatchError(
                f"{self.model_id} ({self.dim}-d)", f"{embedder.model_id} ({dim}-d)")
        return bound

    @property
    def embedder(self) -> Embedder:
        if self._embedder is None:
            from cdr.retrieval.embed import embedder_for

            self._embedder = self._check_embedder(embedder_for(self.model_id))
        return self._embedder

    def encode_query(self, text: str) -> np.ndarray:
        """The unit query vector of `text` under this CKF's model."""
        if not isinstance(text, str) or not text.strip():
            raise InvalidInputError("query text is empty")
        out: np.ndarray = self.embedder.encode([text])[0]
        return out

    # ------------------------------------------------------------------ per-row state

    def latest_generation(self) -> int:
        """The generation committed on disk now (one meta row): differs from `generation`
        when someone has written since this snapshot was taken."""
        with self._lock:
            return read_generation(self._conn)

    def _catch_up(self) -> None:
        """Hook for `CKF.refresh` and its writes: move this object to the latest commit. A
        plain snapshot never calls it; it is one commit for its whole life."""
        with self._lock:
            layout = read_layout(self._conn, self._path)
            if layout != self.layout:  # `cdr ckf reembed` committed another identity
                self.layout = layout
                if self._embedder is not None:
                    base = getattr(self._embedder, "base", self._embedder)
                    try:
                        self._embedder = self._check_embedder(base)
                    except EmbeddingModelMismatchError:
                        # Re-embedded by another model or path: the new identity's own model
                        # is picked when next needed (`embedder`).
                        self._embedder = None
            self._state = read_state(self._conn, self.path, self.layout)
            self._ngram_index = None

    # The committed state's fields, read through (`CommittedState`): the `FactIndex` names
    # some of them its own way (`token_counts` is the state's `tokens`).
    generation = _FromState(lambda st: st.generation)
    epoch = _FromState(lambda st: st.epoch)  # the array files' epoch: only a compaction moves it
    n_rows = _FromState(lambda st: st.n_rows)
    embeddings = _FromState(lambda st: st.embeddings)  # (n_rows, dim) mapped float32/float16
    importance = _FromState(lambda st: st.importance)
    status = _FromState(lambda st: st.status)  # uint8 per row, values of `FactStatus`
    active = _FromState(lambda st: st.active)  # selectable rows (ACTIVE or STALE)
    token_counts = _FromState(lambda st: st.tokens)
    ngram_offsets = _FromState(lambda st: st.offsets)
    ngram_hashes = _FromState(lambda st: st.hashes)

    @property
    def ngram_index(self) -> NgramIndex:
        """CSR of per-row 6-gram hashes, built on first use from the mapped arrays."""
        with self._lock:
            if self._ngram_index is None:
                from cdr.ngrams import NgramIndex

                st = self._state
                self._ngram_index = NgramIndex(st.offsets, st.hashes)
            return self._ngram_index

    # ------------------------------------------------------------------ Phase 1

    def select(self, query_vector: Any, min_relevance: float,
               limit: int | None = None) -> Selection:
        """Active rows with cosine(query, fact) ≥ min_relevance, best first (ties by row)."""
        q = check_query(query_vector, self.dim, model_id=self.model_id, unit=True)
        gate, limit = check_gate(min_relevance, limit)
        st = self._state
        return select_rows(st.embeddings, st.active, q, gate, limit, quantised=open_quantised(
            self.path, st.epoch, self.dim, len(st.embeddings)))

    def search(self, text: str, *, limit: int = 10, min_relevance: float = -1.0
               ) -> list[tuple[Fact, float]]:
        """Top facts for a text query (for people: the CLI and debugging)."""
        sel = self.select(self.encode_query(text), min_relevance, limit)
        return list(zip(self.facts(sel.indices), sel.relevances.tolist(), strict=True))

    # ------------------------------------------------------------------ reading facts

    def check_rows(self, rows: Iterable[int] | np.ndarray) -> list[int]:
        """`rows` as a list of ints, each a row of this snapshot, or a clear error."""
        arr = np.asarray(list(rows) if not isinstance(rows, np.ndarray) else rows)
        if arr.size == 0:
            return []
        if not np.issubdtype(arr.dtype, np.integer):
            raise InvalidInputError(f"rows must be integers, got {arr.dtype}")
        n = self.n_rows
        bad = arr[(arr < 0) | (arr >= n)]
        if bad.size:
            raise InvalidInputError(f"row {int(bad[0])} out of range (CKF has {n} rows)")
        out: list[int] = arr.astype(np.int64).tolist()
        return out

    @contextlib.contextmanager
    def _rows_read(self) -> Iterator[CommittedState]:
        """A read transaction on the rows of this snapshot's epoch. Statuses and importance
        come from the snapshot arrays; content is immutable per row, so only a compaction
        (which renumbers rows) can make the database disagree with the snapshot."""
        with self._lock:
            st = self._state
            self._conn.execute("BEGIN")
            try:
                if read_epoch(self._conn) != st.epoch:
                    raise NotFoundError(
                        f"{self.path} was compacted after this handle was opened (its rows "
                        "were renumbered); open it again")
                yield st
            finally:
                self._conn.execute("COMMIT")

    def facts(self, rows: Iterable[int] | np.ndarray) -> list[Fact]:
        """The facts at `rows`, in the order given."""
        wanted = self.check_rows(rows)
        found: dict[int, Fact] = {}
        with self._rows_read() as st:
            for part in chunks(sorted(set(wanted))):
                q = (f"SELECT {_FACT_COLUMNS} FROM facts "
                     f"WHERE row IN ({','.join('?' * len(part))})")
                for r in self._conn.execute(q, list(part)):
                    found[r[0]] = Fact(
                        row=r[0], id=r[1], content=r[2], source=r[3], location=r[4],
                        section=r[5], importance=float(st.importance[r[0]]),
                        is_code=bool(r[7]), tokens=int(r[8]),
                        status=FactStatus(int(st.status[r[0]])), doc_id=r[10],
                        created_at=r[11], updated_at=r[12],
                    )
        missing = [r for r in wanted if r not in found]
        if missing:
            raise NotFoundError(f"row {missing[0]} is not in the database of {self.path}")
        return [found[r] for r in wanted]

    def fact_ids(self, rows: Iterable[int] | np.ndarray) -> list[str]:
        """Just the ids of `rows` (what sessions and traces keep), in the order given."""
        wanted = self.check_rows(rows)
        ids: dict[int, str] = {}
        with self._rows_read():
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
        with self._rows_read() as st:
            for part in chunks(list(pos)):
                q = f"SELECT id, row FROM facts WHERE id IN ({','.join('?' * len(part))})"
                for fid, row in self._conn.execute(q, list(part)):
                    if row < st.n_rows:
                        out[pos[fid]] = row
        return out

    def vectors(self, rows: Iterable[int] | np.ndarray) -> np.ndarray:
        return np.asarray(self.embeddings[self.check_rows(rows)], dtype=np.float32)

    # ------------------------------------------------------------------ documents

    def documents(self) -> list[dict[str, Any]]:
        with self._lock:
            cur = self._conn.execute(
                f"SELECT {', '.join(_DOC_COLUMNS)} FROM documents ORDER BY source")
            return [dict(zip(_DOC_COLUMNS, r, strict=True)) for r in cur]

    def document(self, doc: str) -> dict[str, Any]:
        """A document by id, source, path (resolved) or unique id prefix (≥ 6 characters)."""
        doc = str(doc)
        cols = ", ".join(_DOC_COLUMNS)
        with self._lock:
            for where, arg in (("doc_id = ?", doc), ("source = ?", doc)):
                r = self._conn.execute(f"SELECT {cols} FROM documents WHERE {where}",
                                       (arg,)).fetchone()
                if r:
                    return dict(zip(_DOC_COLUMNS, r, strict=True))
            resolved = str(Path(doc).expanduser().resolve())
            r = self._conn.execute(f"SELECT {cols} FROM documents WHERE source = ?",
                                   (resolved,)).fetchone()
            if r:
                return dict(zip(_DOC_COLUMNS, r, strict=True))
            if len(doc) >= 6:
                rs = self._conn.execute(
                    f"SELECT {cols} FROM documents WHERE doc_id LIKE ?",
                    (doc.replace("%", "").replace("_", "") + "%",)).fetchall()
                if len(rs) == 1:
                    return dict(zip(_DOC_COLUMNS, rs[0], strict=True))
        raise NotFoundError(f"no document {doc!r} in the CKF at {self.path}")

    def document_state(self, source: str) -> dict[str, Any] | None:
        with self._lock:
            r = self._conn.execute(
                f"SELECT {', '.join(_DOC_COLUMNS)} FROM documents WHERE doc_id = ?",
                (doc_id_for(source),)).fetchone()
        return dict(zip(_DOC_COLUMNS, r, strict=True)) if r else None

    def document_rows(self, doc: str) -> list[int]:
        """The rows a document holds, in its reading order (a row may be held by several)."""
        doc_id = self.document(doc)["doc_id"]
        with self._lock:
            return [r for (r,) in self._conn.execute(
                "SELECT row FROM occurrences WHERE doc_id=? ORDER BY ordinal", (doc_id,))]

    def known_ids(self, ids: Sequence[str]) -> set[str]:
        """Which of these fact ids already have a row (and so a vector)."""
        out: set[str] = set()
        with self._lock:
            for part in chunks(list(dict.fromkeys(ids))):
                q = f"SELECT id FROM facts WHERE id IN ({','.join('?' * len(part))})"
                out.update(i for (i,) in self._conn.execute(q, list(part)))
        return out

    # ------------------------------------------------------------------ stats

    def stats(self) -> dict[str, Any]:
        st = self._state
        status = st.status
        counts = np.bincount(status, minlength=len(FactStatus)) if len(status) else \
            np.zeros(len(FactStatus), int)
        with self._lock:
            conn = self._conn
            (n_docs,) = conn.execute("SELECT COUNT(*) FROM documents").fetchone()
            (n_stale_docs,) = conn.execute(
                "SELECT COUNT(*) FROM documents WHERE status='STALE'").fetchone()
            by_type = dict(conn.execute(
                "SELECT source_type, COUNT(*) FROM documents GROUP BY source_type").fetchall())
            (n_code,) = conn.execute(
                "SELECT COUNT(*) FROM facts WHERE is_code=1 AND status IN ('ACTIVE','STALE')"
            ).fetchone()
        return {
            "path": str(self.path),
            "model_id": self.model_id,
            "recipe": self.recipe,
            "dim": self.dim,
            "dtype": self.dtype,
            "schema_version": SCHEMA_VERSION,
            "generation": st.generation,
            "rows": st.n_rows,
            "active_facts": int(st.active.sum()),
            "facts_by_status": {s.name: int(counts[s]) for s in FactStatus},
            "code_facts": int(n_code),
            "active_tokens": int(np.asarray(st.tokens)[st.active].sum()),
            "documents": int(n_docs),
            "stale_documents": int(n_stale_docs),
            "documents_by_source_type": by_type,
            "ngram_hashes": len(st.hashes),
            "size_bytes": sum(p.stat().st_size for p in self.path.iterdir() if p.is_file()),
            "created_at": st.meta.get("created_at", ""),
            "updated_at": st.meta.get("updated_at", ""),
        }
