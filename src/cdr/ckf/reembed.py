"""Re-embedding a CKF in place under another fact recipe (`cdr ckf reembed`).

Readers keep the old vectors until the new ones commit: new vectors go to a staging folder
inside the CKF (`reembed/`), chunk by chunk, each chunk fsynced before the progress record that
counts it is renamed into place. A killed run resumes from the last recorded chunk. The switch
is the compaction's: a fresh set of array files under the next epoch (same rows, new vectors),
then one SQLite transaction that points the CKF at them and records the new embedding
identity. Writers are not held off while vectors are computed; rows they add meanwhile are
embedded under the write lock just before the switch, and a compaction meanwhile (which
renumbers rows) makes the staged vectors useless, so the run starts over.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from cdr.ckf.arrays import (
    ArrayFiles,
    fsync_dir,
    other_epoch_files,
    switch_to_epoch,
    write_atomic,
)
from cdr.errors import InvalidInputError
from cdr.retrieval.fact_recipe import (
    base_model_id,
    bind,
    check_recipe,
    fact_text,
    identity,
    split_identity,
)

if TYPE_CHECKING:
    from cdr.ckf.committer import CKFCommitter
    from cdr.ckf.handle import CKF

STAGING = "reembed"
CHUNK_ROWS = 1024
ReembedProgress = Callable[[int, int], None]  # (rows done, rows in all)


@dataclass
class ReembedReport:
    model_id: str  # the identity the CKF holds now
    rows: int  # rows in the CKF
    embedded: int  # rows this call embedded (a resumed run counts only its own)
    resumed_from: int  # rows found staged by an earlier, interrupted run
    unchanged: bool = False  # the CKF already had that identity


class _Staging:
    """The staged vectors (float32 rows) and the record of how many are complete."""

    def __init__(self, root: Path, target: str, epoch: int, dim: int) -> None:
        self.dir = root / STAGING
        self.vectors = self.dir / "vectors.f32"
        self.record = self.dir / "progress.json"
        self.target, self.epoch, self.dim = target, epoch, dim

    def rows_done(self) -> int:
        """Rows staged for this target and epoch by an earlier run (0: start afresh)."""
        try:
            rec = json.loads(self.record.read_text())
        except (OSError, ValueError):
            rec = None
        if (not isinstance(rec, dict) or rec.get("target") != self.target
                or rec.get("epoch") != self.epoch or rec.get("dim") != self.dim):
            self.clear()
            self.dir.mkdir()
            write_atomic(self.vectors, b"")
            return 0
        done = int(rec.get("rows", 0))
        size = done * self.dim * 4
        if self.vectors.stat().st_size < size:  # cannot happen: vectors fsync before record
            self.clear()
            return self.rows_done()
        os.truncate(self.vectors, size)  # a torn chunk past the record
        return done

    def append(self, vecs: np.ndarray, done: int) -> None:
        with open(self.vectors, "ab") as f:
            np.ascontiguousarray(vecs, dtype="<f4").tofile(f)
            f.flush()
            os.fsync(f.fileno())
        write_atomic(self.record, json.dumps(
            {"target": self.target, "epoch": self.epoch, "dim": self.dim, "rows": done}).encode())

    def load(self, n_rows: int) -> np.ndarray:
        return np.fromfile(self.vectors, dtype="<f4", count=n_rows * self.dim).reshape(
            n_rows, self.dim)

    def clear(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


def _texts(committer: CKFCommitter, recipe: str, lo: int, hi: int) -> list[str]:
    """What the model reads for rows lo..hi-1."""
    rows = committer.fact_contexts(lo, hi)
    if len(rows) != hi - lo:
        raise InvalidInputError(f"{committer.path}: facts table has {len(rows)} of rows "
                                f"{lo}..{hi - 1}; run `cdr ckf check`")
    return [fact_text(recipe, c, t, s) for c, t, s in rows]


def _embed_rows(committer: CKFCommitter, model: Any, recipe: str, lo: int, hi: int,
                batch_size: int) -> np.ndarray:
    texts = _texts(committer, recipe, lo, hi)
    return np.asarray(model.encode(texts, batch_size=batch_size), dtype=np.float32)


def _embed_chunks(committer: CKFCommitter, model: Any, recipe: str, done: int, total: int,
                  chunk_rows: int, batch_size: int) -> Iterator[tuple[int, np.ndarray]]:
    """(rows done after the chunk, its vectors) for each chunk from `done` to `total`.

    A model that can queue work ahead (`prefetch`: `cdr.cluster.ray_ingest.RayEmbedder`) is
    given the next chunk's texts before this chunk's vectors are asked for, so its workers
    keep embedding while the driver stages and fsyncs a chunk. A local model runs each chunk
    on every core itself (threads over batches)."""
    prefetch = getattr(model, "prefetch", None)
    texts = _texts(committer, recipe, done, min(done + chunk_rows, total)) if done < total \
        else []
    if prefetch is not None and texts:
        prefetch(texts, batch_size=batch_size)
    while done < total:
        hi = min(done + chunk_rows, total)
        nxt = _texts(committer, recipe, hi, min(hi + chunk_rows, total)) if hi < total else []
        if prefetch is not None and nxt:
            prefetch(nxt, batch_size=batch_size)
        yield hi, np.asarray(model.encode(texts, batch_size=batch_size), dtype=np.float32)
        done, texts = hi, nxt


def reembed(ckf: CKF, recipe: str, *, embedder: Any = None, batch_size: int = 32,
            chunk_rows: int = CHUNK_ROWS, progress: ReembedProgress | None = None
            ) -> ReembedReport:
    """Re-embed every row of `ckf` under `recipe`, resuming a run a kill interrupted. With
    `embedder`, its model (or path: `cdr.retrieval.embed_int8`) becomes the CKF's identity;
    without, the CKF keeps its model and changes only its recipe."""
    check_recipe(recipe)
    if chunk_rows < 1:
        raise InvalidInputError(f"chunk_rows must be ≥ 1, got {chunk_rows}")
    if embedder is None:  # the path that built the CKF, under the new recipe
        from cdr.retrieval.embed import embedder_for

        model_id, _ = split_identity(ckf.model_id)
        embedder = embedder_for(ckf.model_id)
    else:  # another model or path (e.g. the int8 one) takes over the CKF
        model_id = base_model_id(embedder)
    target = identity(model_id, recipe)
    committer = ckf.committer
    model = bind(getattr(embedder, "base", embedder), target)
    if int(model.dim) != ckf.dim:
        raise InvalidInputError(f"the embedder gives {model.dim}-d vectors; the CKF holds "
                                f"{ckf.dim}-d")
    if ckf.model_id == target:
        _Staging(ckf.path, target, -1, ckf.dim).clear()
        return ReembedReport(target, ckf.n_rows, 0, 0, unchanged=True)
    while True:
        st = committer.state()
        staging = _Staging(ckf.path, target, st.epoch, ckf.dim)
        done = resumed = staging.rows_done()
        total = st.n_rows
        if progress:
            progress(done, total)
        for upto, vecs in _embed_chunks(committer, model, recipe, done, total, chunk_rows,
                                        batch_size):
            staging.append(vecs, upto)
            done = upto
            if progress:
                progress(done, total)
        forget = getattr(model, "forget", None)
        if forget is not None:  # texts queued for a chunk a restart will not ask for
            forget()
        with committer.locked() as st:
            if st.epoch != staging.epoch:  # a compaction renumbered rows: start over
                staging.clear()
                continue
            if st.n_rows > done:  # rows ingested meanwhile, embedded under the lock
                staging.append(_embed_rows(committer, model, recipe, done, st.n_rows,
                                           batch_size), st.n_rows)
            _switch(committer, st, staging)
        staging.clear()
        ckf.refresh()
        if progress:
            progress(st.n_rows, st.n_rows)
        return ReembedReport(target, st.n_rows, st.n_rows - resumed, resumed)


def _switch(committer: CKFCommitter, st: Any, staging: _Staging) -> None:
    """New epoch files (staged vectors, the other arrays copied), then the commit."""
    epoch = st.epoch + 1
    for p in other_epoch_files(committer.path, st.epoch):
        if p.parent == committer.path:
            p.unlink(missing_ok=True)
    files = ArrayFiles(committer.path, epoch, committer.layout.dim, committer.layout.dtype)
    files.write_full(staging.load(st.n_rows), np.asarray(st.tokens), np.asarray(st.offsets),
                     np.asarray(st.hashes))
    fsync_dir(committer.path)
    switch_to_epoch(files, lambda: committer.switch_identity(st, files, staging.target))
    committer.extend_quantised()
