"""One write transaction on a CKF: documents in, facts (re)pointed, per-row state updated.

A fact row exists once per distinct content (its id is a content hash). Documents point at rows
through `occurrences`; a row's status and importance follow from the documents that hold it:
no holder → DELETED, only stale holders → STALE, a quarantine flag → QUARANTINED (sticky across
re-ingests), else ACTIVE; importance is the highest of its holders'. Only the rows a change
touches are recomputed, so the cost of an ingest does not grow with the store.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

from cdr.ckf.arrays import ArrayFiles
from cdr.ckf.records import FactDraft, FactStatus
from cdr.ckf.schema import doc_id_for, now, write_meta
from cdr.errors import InvalidInputError
from cdr.ngrams import ngram_hashes

_T = TypeVar("_T")
_BATCH = 900  # SQLite host-parameter limit is 999 on old builds


def chunks(seq: Sequence[_T], size: int = _BATCH) -> Iterable[Sequence[_T]]:
    for i in range(0, len(seq), size):
        yield seq[i : i + size]


@dataclass(slots=True)
class DocumentChange:
    doc_id: str
    added: int
    kept: int
    removed: int
    new_rows: int  # rows this change created (vectors written)


@dataclass(eq=False)
class WriteTxn:
    """Holds the in-progress state; `finish` writes arrays then SQLite commits (by the caller).

    `status` and `importance` are private copies: readers keep seeing the committed arrays
    until the store publishes these after COMMIT. `n_rows` grows as rows are added;
    `base_rows` stays the committed count the transaction started from.
    """

    conn: sqlite3.Connection
    files: ArrayFiles
    dim: int
    n_rows: int
    n_hashes: int
    last_offset: int
    status: np.ndarray
    importance: np.ndarray
    generation: int
    base_rows: int = field(init=False)
    ts: str = field(init=False, default_factory=now)
    _vectors: list[np.ndarray] = field(init=False, default_factory=list)
    _tokens: list[int] = field(init=False, default_factory=list)
    _hashes: list[np.ndarray] = field(init=False, default_factory=list)

    def __post_init__(self) -> None:
        self.base_rows = self.n_rows
        self.status = self.status.copy()
        self.importance = self.importance.copy()

    # ------------------------------------------------------------------ rows

    def lookup(self, ids: Sequence[str]) -> dict[str, int]:
        found: dict[str, int] = {}
        for part in chunks(list(dict.fromkeys(ids))):
            q = f"SELECT id, row FROM facts WHERE id IN ({','.join('?' * len(part))})"
            found.update(self.conn.execute(q, list(part)).fetchall())
        return found

    def _add_rows(self, drafts: Sequence[FactDraft], vectors: np.ndarray, doc_id: str,
                  source: str, importance: float) -> dict[str, int]:
        vectors = np.asarray(vectors, dtype=np.float32)
        if vectors.shape != (len(drafts), self.dim):
            raise InvalidInputError(
                f"expected {len(drafts)} vectors of dimension {self.dim}, got {vectors.shape}"
            )
        norms = np.linalg.norm(vectors, axis=1)
        if not np.all(np.abs(norms - 1.0) < 1e-3):
            raise InvalidInputError("fact vectors must be finite unit vectors")
        start = self.n_rows
        rows = {d.id: start + k for k, d in enumerate(drafts)}
        self.conn.executemany(
            "INSERT INTO facts(row, id, content, is_code, tokens, importance, status, quarantined,"
            " doc_id, source, location, section, created_at, updated_at)"
            " VALUES (?,?,?,?,?,?,'ACTIVE',0,?,?,?,?,?,?)",
            [(rows[d.id], d.id, d.content, int(d.is_code), d.tokens, importance, doc_id, source,
              d.location, d.section, self.ts, self.ts) for d in drafts],
        )
        self._vectors.append(vectors)
        self._tokens.extend(d.tokens for d in drafts)
        self._hashes.extend(ngram_hashes(d.content) for d in drafts)
        self.n_rows += len(drafts)
        self.status = np.concatenate(
            [self.status, np.full(len(drafts), FactStatus.ACTIVE, np.uint8)])
        self.importance = np.concatenate(
            [self.importance, np.full(len(drafts), importance, np.float32)])
        return rows

    def add_raw_rows(self, contents: Sequence[str], vectors: np.ndarray, tokens: np.ndarray,
                     hash_lists: Sequence[np.ndarray], doc_id: str, source: str,
                     importance: float, ids: Sequence[str], ordinal_base: int = 0) -> None:
        """Bulk rows with precomputed arrays (benchmarks, imports): no per-row re-hashing."""
        n = len(contents)
        start = self.n_rows
        self.conn.executemany(
            "INSERT INTO facts(row, id, content, is_code, tokens, importance, status, quarantined,"
            " doc_id, source, location, section, created_at, updated_at)"
            " VALUES (?,?,?,0,?,?,'ACTIVE',0,?,?,'',?,?,?)",
            ((start + k, ids[k], contents[k], int(tokens[k]), importance, doc_id, source, "",
              self.ts, self.ts) for k in range(n)),
        )
        self.conn.executemany(
            "INSERT INTO occurrences(doc_id, ordinal, row, location, section) VALUES (?,?,?,'','')",
            ((doc_id, ordinal_base + k, start + k) for k in range(n)),
        )
        self._vectors.append(np.asarray(vectors, dtype=np.float32))
        self._tokens.extend(np.asarray(tokens).tolist())
        self._hashes.extend(hash_lists)
        self.n_rows += n
        self.status = np.concatenate([self.status, np.zeros(n, np.uint8)])
        self.importance = np.concatenate(
            [self.importance, np.full(n, importance, np.float32)])

    def append_raw_document(self, source: str, importance: float, contents: Sequence[str],
                            vectors: np.ndarray, tokens: np.ndarray,
                            hash_lists: Sequence[np.ndarray], ids: Sequence[str]) -> None:
        """`add_raw_rows` as (more of) one document of kind `raw`, created on first use."""
        doc_id = doc_id_for(source)
        self.conn.execute(
            "INSERT INTO documents(doc_id, source, kind, title, content_hash, size,"
            " source_type, importance, status, n_facts, created_at, updated_at)"
            " VALUES (?,?,'raw',NULL,'',0,'user',?,'ACTIVE',0,?,?)"
            " ON CONFLICT(doc_id) DO NOTHING",
            (doc_id, source, importance, self.ts, self.ts))
        (base,) = self.conn.execute(
            "SELECT COALESCE(MAX(ordinal) + 1, 0) FROM occurrences WHERE doc_id=?",
            (doc_id,)).fetchone()
        self.add_raw_rows(contents, vectors, tokens, hash_lists, doc_id, source, importance,
                          ids, ordinal_base=int(base))
        self.conn.execute("UPDATE documents SET n_facts = n_facts + ? WHERE doc_id=?",
                          (len(contents), doc_id))

    # ------------------------------------------------------------------ documents

    def put_document(
        self,
        *,
        source: str,
        kind: str,
        title: str | None,
        content_hash: str,
        size: int,
        source_type: str,
        importance: float,
        drafts: Sequence[FactDraft],
        vectors: Mapping[str, np.ndarray],
        embed_missing: Callable[[list[FactDraft], str | None], np.ndarray],
    ) -> DocumentChange:
        """Make `source` hold exactly `drafts`. Vectors come from `vectors` (by fact id) for
        content new to the store; content the store already has (in any document, or deleted
        earlier) reuses its row and vector."""
        doc_id = doc_id_for(source)
        old = self.conn.execute(
            "SELECT o.row, f.id FROM occurrences o JOIN facts f ON f.row = o.row "
            "WHERE o.doc_id = ?", (doc_id,)).fetchall()
        old_ids = {fid for _, fid in old}
        new_ids = [d.id for d in drafts]
        existing = self.lookup(new_ids)
        fresh = [d for d in drafts if d.id not in existing]
        if fresh:
            missing = [d.id for d in fresh if d.id not in vectors]
            extra: dict[str, np.ndarray] = {}
            if missing:
                by_id = {d.id: d for d in fresh}
                vecs = embed_missing([by_id[i] for i in missing], title)
                extra = dict(zip(missing, vecs, strict=True))
            mat = np.stack([vectors[d.id] if d.id in vectors else extra[d.id] for d in fresh])
            existing.update(self._add_rows(fresh, mat, doc_id, source, importance))
        self.conn.execute(
            "INSERT INTO documents(doc_id, source, kind, title, content_hash, size, source_type,"
            " importance, status, n_facts, created_at, updated_at)"
            " VALUES (?,?,?,?,?,?,?,?,'ACTIVE',?,?,?) ON CONFLICT(doc_id) DO UPDATE SET"
            " kind=excluded.kind, title=excluded.title, content_hash=excluded.content_hash,"
            " size=excluded.size, source_type=excluded.source_type,"
            " importance=excluded.importance, status='ACTIVE', n_facts=excluded.n_facts,"
            " updated_at=excluded.updated_at",
            (doc_id, source, kind, title, content_hash, size, source_type, importance,
             len(drafts), self.ts, self.ts),
        )
        self.conn.execute("DELETE FROM occurrences WHERE doc_id = ?", (doc_id,))
        self.conn.executemany(
            "INSERT INTO occurrences(doc_id, ordinal, row, location, section) VALUES (?,?,?,?,?)",
            [(doc_id, k, existing[d.id], d.location, d.section) for k, d in enumerate(drafts)],
        )
        affected = {r for r, _ in old} | {existing[i] for i in new_ids}
        self.refresh_rows(affected)
        new_set = set(new_ids)
        return DocumentChange(
            doc_id=doc_id,
            added=len(new_set - old_ids),
            kept=len(new_set & old_ids),
            removed=len(old_ids - new_set),
            new_rows=len(fresh),
        )

    def touch_document(self, doc_id: str, *, source_type: str, importance: float) -> None:
        """An unchanged document seen again: re-activate it (it may have been stale) and apply
        a changed importance, without parsing or embedding anything."""
        cur = self.conn.execute(
            "SELECT status, importance, source_type FROM documents WHERE doc_id = ?",
            (doc_id,)).fetchone()
        if cur is None:
            raise InvalidInputError(f"no document {doc_id}")
        if cur == ("ACTIVE", importance, source_type):
            return
        self.conn.execute(
            "UPDATE documents SET status='ACTIVE', importance=?, source_type=?, updated_at=?"
            " WHERE doc_id=?", (importance, source_type, self.ts, doc_id))
        self.refresh_rows(self.rows_of(doc_id))

    def document_fact_count(self, doc_id: str) -> int:
        """How many facts a document holds (as recorded with it)."""
        row = self.conn.execute("SELECT n_facts FROM documents WHERE doc_id=?",
                                (doc_id,)).fetchone()
        if row is None:
            raise InvalidInputError(f"no document {doc_id}")
        return int(row[0])

    def set_document_status(self, doc_id: str, status: str) -> None:
        self.conn.execute("UPDATE documents SET status=?, updated_at=? WHERE doc_id=?",
                          (status, self.ts, doc_id))
        self.refresh_rows(self.rows_of(doc_id))

    def set_document_importance(self, doc_id: str, importance: float) -> None:
        self.conn.execute("UPDATE documents SET importance=?, updated_at=? WHERE doc_id=?",
                          (importance, self.ts, doc_id))
        self.refresh_rows(self.rows_of(doc_id))

    def delete_document(self, doc_id: str) -> int:
        """Returns how many facts left the selectable set (content also held by another
        document stays)."""
        rows = self.rows_of(doc_id)
        before = int(np.count_nonzero(self.status[rows] <= FactStatus.STALE)) if rows else 0
        self.conn.execute("DELETE FROM occurrences WHERE doc_id = ?", (doc_id,))
        self.conn.execute("DELETE FROM documents WHERE doc_id = ?", (doc_id,))
        self.refresh_rows(rows)
        after = int(np.count_nonzero(self.status[rows] <= FactStatus.STALE)) if rows else 0
        return before - after

    def rows_of(self, doc_id: str) -> list[int]:
        return [r for (r,) in self.conn.execute(
            "SELECT DISTINCT row FROM occurrences WHERE doc_id = ?", (doc_id,))]

    def set_quarantine(self, rows: Sequence[int], flag: bool) -> None:
        self.conn.executemany("UPDATE facts SET quarantined=?, updated_at=? WHERE row=?",
                              [(int(flag), self.ts, int(r)) for r in rows])
        self.refresh_rows(rows)

    # ------------------------------------------------------------------ derived state

    def refresh_rows(self, rows: Iterable[int]) -> None:
        """Recompute status, importance and primary source of `rows` from their holders."""
        rows = sorted({int(r) for r in rows})
        if not rows:
            return
        facts: dict[int, tuple[Any, ...]] = {}
        holders: dict[int, list[tuple[Any, ...]]] = {}
        for part in chunks(rows):
            marks = ",".join("?" * len(part))
            for r in self.conn.execute(
                f"SELECT row, quarantined, doc_id, status, importance FROM facts "
                f"WHERE row IN ({marks})", list(part)):
                facts[r[0]] = r
            for r in self.conn.execute(
                f"SELECT o.row, o.doc_id, d.source, o.location, o.section, d.status,"
                f" d.importance FROM occurrences o JOIN documents d ON d.doc_id = o.doc_id"
                f" WHERE o.row IN ({marks}) ORDER BY o.rowid", list(part)):
                holders.setdefault(r[0], []).append(r)
        updates = []
        for row in rows:
            _, quarantined, _, _, cur_imp = facts[row]
            hs = holders.get(row, [])
            if quarantined:
                status = FactStatus.QUARANTINED
            elif not hs:
                status = FactStatus.DELETED
            elif all(h[5] == "STALE" for h in hs):
                status = FactStatus.STALE
            else:
                status = FactStatus.ACTIVE
            imp = float(max((h[6] for h in hs), default=cur_imp))
            self.status[row] = status
            self.importance[row] = imp
            if hs:
                # The primary holder: the live one whose source sorts first, whatever the
                # order documents came in, so a fact says the same source in one CKF and in
                # a shard set holding the same documents (where each shard sees only its own
                # holders; cdr.cluster.shard_view picks the same one across shards).
                live = [h for h in hs if h[5] == "ACTIVE"] or hs
                primary = min(live, key=lambda h: h[2])  # first occurrence on a tie
                updates.append((status.name, imp, primary[1], primary[2], primary[3],
                                primary[4], self.ts, row))
            else:  # keep the last source: a deleted fact still says where it came from
                updates.append((status.name, imp, None, None, None, None, self.ts, row))
        self.conn.executemany(
            "UPDATE facts SET status=?, importance=?, doc_id=COALESCE(?, doc_id),"
            " source=COALESCE(?, source), location=COALESCE(?, location),"
            " section=COALESCE(?, section), updated_at=? WHERE row=?",
            updates,
        )

    # ------------------------------------------------------------------ commit

    def finish(self) -> None:
        """Append the new rows' arrays (fsynced) and record lengths, state and generation.
        The caller commits SQLite right after: that commit is the moment the change exists."""
        if self.n_rows > self.base_rows:
            vecs = np.concatenate(self._vectors) if self._vectors else np.zeros((0, self.dim))
            self.n_hashes = self.files.append(
                self.base_rows, self.n_hashes, vecs,
                np.asarray(self._tokens, dtype=np.int32), self._hashes, self.last_offset,
            )
        self.generation += 1
        self.conn.executemany(
            "INSERT INTO rowstate(name, data) VALUES (?, ?) "
            "ON CONFLICT(name) DO UPDATE SET data = excluded.data",
            [("status", self.status.astype(np.uint8).tobytes()),
             ("importance", self.importance.astype("<f4").tobytes())],
        )
        write_meta(self.conn, {
            "generation": self.generation,
            "n_rows": self.n_rows,
            "n_hashes": self.n_hashes,
            "updated_at": self.ts,
        })
