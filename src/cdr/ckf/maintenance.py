"""Stats, integrity check and compaction: the operations that look at a whole CKF.

They are not on any hot path (a check of a million rows reads the facts table once), so they
favour clarity over speed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from cdr.ckf.arrays import ArrayFiles, other_epoch_files
from cdr.ckf.model import FactStatus
from cdr.ckf.schema import SCHEMA_VERSION, write_meta

if TYPE_CHECKING:
    from cdr.ckf.store import CKF

_REQUIRED_META = ("schema_version", "model_id", "dim", "dtype", "generation", "epoch", "n_rows",
                  "n_hashes")


def _dir_size(ckf: CKF) -> int:
    return sum(p.stat().st_size for p in ckf.path.iterdir() if p.is_file())


def stats(ckf: CKF) -> dict[str, Any]:
    status = ckf.status
    counts = np.bincount(status, minlength=len(FactStatus)) if len(status) else np.zeros(4, int)
    with ckf._lock:
        conn = ckf._conn
        (n_docs,) = conn.execute("SELECT COUNT(*) FROM documents").fetchone()
        (n_stale_docs,) = conn.execute(
            "SELECT COUNT(*) FROM documents WHERE status='STALE'").fetchone()
        by_type = dict(conn.execute(
            "SELECT source_type, COUNT(*) FROM documents GROUP BY source_type").fetchall())
        (n_code,) = conn.execute(
            "SELECT COUNT(*) FROM facts WHERE is_code=1 AND status IN ('ACTIVE','STALE')"
        ).fetchone()
    active = ckf.active
    return {
        "path": str(ckf.path),
        "model_id": ckf.model_id,
        "dim": ckf.dim,
        "dtype": ckf.dtype,
        "schema_version": SCHEMA_VERSION,
        "generation": ckf.generation,
        "rows": ckf.n_rows,
        "active_facts": int(active.sum()),
        "facts_by_status": {s.name: int(counts[s]) for s in FactStatus},
        "code_facts": int(n_code),
        "active_tokens": int(np.asarray(ckf.token_counts)[active].sum()),
        "documents": int(n_docs),
        "stale_documents": int(n_stale_docs),
        "documents_by_source_type": by_type,
        "ngram_hashes": len(ckf.ngram_hashes),
        "size_bytes": _dir_size(ckf),
        "created_at": ckf._meta.get("created_at", ""),
        "updated_at": ckf._meta.get("updated_at", ""),
    }


def check(ckf: CKF, *, deep: bool = True) -> list[str]:
    """Everything that must hold between the database and the array files."""
    problems: list[str] = []
    with ckf._lock:
        ckf._load()
        conn = ckf._conn
        pragma = "integrity_check" if deep else "quick_check"
        result = [r for (r,) in conn.execute(f"PRAGMA {pragma}")]
        if result != ["ok"]:
            problems.append(f"sqlite {pragma}: {'; '.join(result[:5])}")
        meta = ckf._meta
        problems += [f"meta is missing {k!r}" for k in _REQUIRED_META if k not in meta]
        n_rows, n_hashes = ckf.n_rows, len(ckf.ngram_hashes)
        files = ArrayFiles(ckf.path, int(meta["epoch"]), ckf.dim, ckf.dtype)
        for path, size in zip(files.paths, files.committed_sizes(n_rows, n_hashes), strict=True):
            if not path.exists():
                problems.append(f"missing array file {path.name}")
            elif path.stat().st_size < size:
                problems.append(f"{path.name}: {path.stat().st_size} bytes < committed {size}")
        rows = conn.execute(
            "SELECT row, status, importance, tokens, quarantined FROM facts ORDER BY row"
        ).fetchall()
        if len(rows) != n_rows or (rows and (rows[0][0] != 0 or rows[-1][0] != n_rows - 1)):
            problems.append(f"facts table has {len(rows)} rows, arrays have {n_rows}")
            return problems
        if not rows:
            return problems
        col_status = np.array([FactStatus[r[1]] for r in rows], dtype=np.uint8)
        col_imp = np.array([r[2] for r in rows], dtype=np.float32)
        col_tokens = np.array([r[3] for r in rows], dtype=np.int32)
        quarantined = np.array([r[4] for r in rows], dtype=bool)
        if not np.array_equal(col_status, ckf.status):
            bad = int(np.flatnonzero(col_status != ckf.status)[0])
            problems.append(f"status array differs from the facts table (first at row {bad})")
        if not np.allclose(col_imp, ckf.importance, atol=1e-6):
            problems.append("importance array differs from the facts table")
        if not np.array_equal(col_tokens, ckf.token_counts):
            problems.append("token counts file differs from the facts table")
        if np.any(quarantined != (ckf.status == FactStatus.QUARANTINED)):
            problems.append("quarantine flags disagree with QUARANTINED statuses")
        off = np.asarray(ckf.ngram_offsets)
        if off[0] != 0 or off[-1] != n_hashes or np.any(np.diff(off) < 0):
            problems.append("n-gram offsets are not a valid CSR index")
        held = np.zeros(n_rows, dtype=bool)
        occ_rows = np.array([r for (r,) in conn.execute("SELECT row FROM occurrences")],
                            dtype=np.int64)
        if occ_rows.size and (occ_rows.min() < 0 or occ_rows.max() >= n_rows):
            problems.append("occurrences point outside the facts table")
        else:
            held[occ_rows] = True
        selectable = ckf.status <= FactStatus.STALE
        if np.any(selectable & ~held):
            problems.append(f"{int((selectable & ~held).sum())} selectable facts have no document")
        if np.any((ckf.status == FactStatus.DELETED) & held):
            problems.append("DELETED facts are still held by a document")
        bad_docs = conn.execute(
            "SELECT d.doc_id FROM documents d LEFT JOIN occurrences o ON o.doc_id = d.doc_id "
            "GROUP BY d.doc_id HAVING COUNT(o.row) != MAX(d.n_facts)").fetchall()
        if bad_docs:
            problems.append(f"{len(bad_docs)} documents' fact counts disagree with occurrences")
        if deep:
            problems += _check_vectors(ckf)
            problems += _check_ids(ckf)
    return problems


def _check_vectors(ckf: CKF) -> list[str]:
    emb = ckf.embeddings
    step = 1 << 16
    for s in range(0, len(emb), step):
        block = np.asarray(emb[s : s + step], dtype=np.float32)
        if not np.isfinite(block).all():
            return [f"non-finite embedding values near row {s}"]
        norms = np.linalg.norm(block, axis=1)
        tol = 1e-3 if ckf.dtype == "float32" else 5e-3
        bad = np.flatnonzero(np.abs(norms - 1.0) > tol)
        if bad.size:
            return [f"embedding row {s + int(bad[0])} is not unit length "
                    f"(norm {norms[bad[0]]:.4f})"]
    return []


def _check_ids(ckf: CKF, sample: int = 2000) -> list[str]:
    from cdr.ckf.chunk import fact_id
    from cdr.ngrams import ngram_hashes

    n = ckf.n_rows
    rows = np.unique(np.linspace(0, n - 1, num=min(n, sample)).astype(np.int64)).tolist()
    problems = []
    off = ckf.ngram_offsets
    hashes = ckf.ngram_hashes
    for f in ckf.facts(rows):
        if fact_id(f.content) != f.id:
            problems.append(f"row {f.row}: id does not match its content")
        stored = np.asarray(hashes[off[f.row] : off[f.row + 1]])
        if not np.array_equal(stored, ngram_hashes(f.content)):
            problems.append(f"row {f.row}: stored 6-gram hashes do not match its content")
        if len(problems) >= 5:
            break
    return problems


def compact(ckf: CKF) -> dict[str, int]:
    """Rewrite the arrays without DELETED rows, under a new epoch, renumbering in the same
    SQLite transaction that switches to it. Invalidates row numbers held elsewhere."""
    with ckf._lock, ckf._file_lock(60.0):
        ckf._load()
        n = ckf.n_rows
        keep = np.asarray(ckf.status) != FactStatus.DELETED
        if keep.all():
            return {"rows_before": n, "rows_after": n}
        epoch = int(ckf._meta["epoch"]) + 1
        for p in other_epoch_files(ckf.path, epoch - 1):
            p.unlink(missing_ok=True)
        kept = np.flatnonzero(keep)
        off = np.asarray(ckf.ngram_offsets)
        lengths = np.diff(off)
        owner = np.repeat(np.arange(n), lengths)
        new_hashes = np.asarray(ckf.ngram_hashes)[keep[owner]]
        new_offsets = np.zeros(len(kept) + 1, dtype=np.int64)
        np.cumsum(lengths[kept], out=new_offsets[1:])
        files = ArrayFiles(ckf.path, epoch, ckf.dim, ckf.dtype)
        files.write_full(np.asarray(ckf.embeddings)[kept], np.asarray(ckf.token_counts)[kept],
                         new_offsets, new_hashes)
        conn = ckf._conn
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
                [(np.asarray(ckf.status)[kept].astype(np.uint8).tobytes(), "status"),
                 (np.asarray(ckf.importance)[kept].astype("<f4").tobytes(), "importance")])
            write_meta(conn, {"epoch": epoch, "n_rows": len(kept),
                              "n_hashes": len(new_hashes),
                              "generation": ckf.generation + 1})
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            for p in files.paths:
                p.unlink(missing_ok=True)
            raise
        finally:
            ckf._load()
        for p in other_epoch_files(ckf.path, epoch):
            p.unlink(missing_ok=True)
        return {"rows_before": n, "rows_after": len(kept)}
