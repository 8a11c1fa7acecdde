"""Integrity check and compaction: the operations that look at a whole CKF.

Functions over the committer (`CKFCommitter`'s public methods): the committer runs the SQL and
owns the lock, these hold the logic. They are not on any hot path (a check of a million rows
reads the facts table once), so they favour clarity over speed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from cdr.ckf.arrays import ArrayFiles, other_epoch_files, switch_to_epoch
from cdr.ckf.records import FactStatus
from cdr.ckf.state import CommittedState

if TYPE_CHECKING:
    from cdr.ckf.committer import CKFCommitter

_REQUIRED_META = ("schema_version", "model_id", "dim", "dtype", "generation", "epoch", "n_rows",
                  "n_hashes")


def check(committer: CKFCommitter, *, deep: bool = True) -> list[str]:
    """Everything that must hold between the database and the array files (empty: it does).
    `deep` adds SQLite's full integrity check, vector norms and a sample of ids and hashes."""
    problems = committer.sqlite_problems(deep)
    st = committer.state()
    problems += [f"meta is missing {k!r}" for k in _REQUIRED_META if k not in st.meta]
    for path, size in zip(st.files.paths, st.files.committed_sizes(st.n_rows, st.n_hashes),
                          strict=True):
        if not path.exists():
            problems.append(f"missing array file {path.name}")
        elif path.stat().st_size < size:
            problems.append(f"{path.name}: {path.stat().st_size} bytes < committed {size}")
    rows = committer.fact_columns()
    n_rows = st.n_rows
    if len(rows) != n_rows or (rows and (rows[0][0] != 0 or rows[-1][0] != n_rows - 1)):
        problems.append(f"facts table has {len(rows)} rows, arrays have {n_rows}")
        return problems
    if not rows:
        return problems
    problems += _check_row_state(st, rows)
    held = np.zeros(n_rows, dtype=bool)
    occ_rows = committer.occurrence_rows()
    if occ_rows.size and (occ_rows.min() < 0 or occ_rows.max() >= n_rows):
        problems.append("occurrences point outside the facts table")
    else:
        held[occ_rows] = True
    selectable = st.status <= FactStatus.STALE
    if np.any(selectable & ~held):
        problems.append(f"{int((selectable & ~held).sum())} selectable facts have no document")
    if np.any((st.status == FactStatus.DELETED) & held):
        problems.append("DELETED facts are still held by a document")
    bad_docs = committer.miscounted_documents()
    if bad_docs:
        problems.append(f"{bad_docs} documents' fact counts disagree with occurrences")
    if deep:
        problems += _check_vectors(st, committer.layout.dtype)
        problems += _check_ids(committer, st)
    return problems


def _check_row_state(st: CommittedState, rows: list[tuple[int, str, float, int, int]]
                     ) -> list[str]:
    """The per-row arrays against the facts table they summarise."""
    problems = []
    col_status = np.array([FactStatus[r[1]] for r in rows], dtype=np.uint8)
    col_imp = np.array([r[2] for r in rows], dtype=np.float32)
    col_tokens = np.array([r[3] for r in rows], dtype=np.int32)
    quarantined = np.array([r[4] for r in rows], dtype=bool)
    if not np.array_equal(col_status, st.status):
        bad = int(np.flatnonzero(col_status != st.status)[0])
        problems.append(f"status array differs from the facts table (first at row {bad})")
    if not np.allclose(col_imp, st.importance, atol=1e-6):
        problems.append("importance array differs from the facts table")
    if not np.array_equal(col_tokens, st.tokens):
        problems.append("token counts file differs from the facts table")
    if np.any(quarantined != (st.status == FactStatus.QUARANTINED)):
        problems.append("quarantine flags disagree with QUARANTINED statuses")
    off = np.asarray(st.offsets)
    if off[0] != 0 or off[-1] != st.n_hashes or np.any(np.diff(off) < 0):
        problems.append("n-gram offsets are not a valid CSR index")
    return problems


def _check_vectors(st: CommittedState, dtype: str) -> list[str]:
    emb = st.embeddings
    step = 1 << 16
    tol = 1e-3 if dtype == "float32" else 5e-3
    for s in range(0, len(emb), step):
        block = np.asarray(emb[s : s + step], dtype=np.float32)
        if not np.isfinite(block).all():
            return [f"non-finite embedding values near row {s}"]
        norms = np.linalg.norm(block, axis=1)
        bad = np.flatnonzero(np.abs(norms - 1.0) > tol)
        if bad.size:
            return [f"embedding row {s + int(bad[0])} is not unit length "
                    f"(norm {norms[bad[0]]:.4f})"]
    return []


def _check_ids(committer: CKFCommitter, st: CommittedState, sample: int = 2000) -> list[str]:
    """Ids and stored 6-gram hashes re-derived from the content of a spread of rows."""
    from cdr.ckf.chunk import fact_id
    from cdr.ngrams import ngram_hashes

    n = st.n_rows
    rows = np.unique(np.linspace(0, n - 1, num=min(n, sample)).astype(np.int64)).tolist()
    problems = []
    off, hashes = st.offsets, st.hashes
    for row, fid, content in committer.fact_texts(rows):
        if fact_id(content) != fid:
            problems.append(f"row {row}: id does not match its content")
        stored = np.asarray(hashes[off[row] : off[row + 1]])
        if not np.array_equal(stored, ngram_hashes(content)):
            problems.append(f"row {row}: stored 6-gram hashes do not match its content")
        if len(problems) >= 5:
            break
    return problems


def compact(committer: CKFCommitter) -> dict[str, int]:
    """Rewrite the arrays without DELETED rows, under a new epoch, renumbering in the same
    SQLite transaction that switches to it. Invalidates row numbers held elsewhere."""
    with committer.locked() as st:
        n = st.n_rows
        keep = np.asarray(st.status) != FactStatus.DELETED
        if keep.all():
            return {"rows_before": n, "rows_after": n}
        epoch = st.epoch + 1
        for p in other_epoch_files(committer.path, st.epoch):
            p.unlink(missing_ok=True)
        kept = np.flatnonzero(keep)
        off = np.asarray(st.offsets)
        lengths = np.diff(off)
        owner = np.repeat(np.arange(n), lengths)
        new_hashes = np.asarray(st.hashes)[keep[owner]]
        new_offsets = np.zeros(len(kept) + 1, dtype=np.int64)
        np.cumsum(lengths[kept], out=new_offsets[1:])
        files = ArrayFiles(committer.path, epoch, committer.layout.dim, committer.layout.dtype)
        files.write_full(np.asarray(st.embeddings)[kept], np.asarray(st.tokens)[kept],
                         new_offsets, new_hashes)
        switch_to_epoch(files, lambda: committer.switch_epoch(st, kept, files, len(new_hashes)))
        return {"rows_before": n, "rows_after": len(kept)}
