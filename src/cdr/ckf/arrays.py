"""The CKF's per-row array files: append-only, memory-mapped, tied to SQLite by their lengths.

Everything per row that never changes once written (the embedding, the token count, the 6-gram
hashes) is appended to raw little-endian files. SQLite records how many rows and hashes are
committed; bytes past that are the leftovers of an interrupted ingest, ignored by readers
and cut off by the next writer. So a crash at any point leaves the previous consistent state,
and appending costs time proportional to the new rows, not the whole store.

Files carry an epoch in their names; compaction (the only operation that renumbers rows)
writes a fresh set under the next epoch (temp file + fsync + os.replace) and switches to it
in the same SQLite transaction that renumbers the facts.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

DTYPES: dict[str, tuple[str, np.dtype[Any]]] = {
    "float32": ("f32", np.dtype("<f4")), "float16": ("f16", np.dtype("<f2"))}
# `quant`: the int8 copy of cdr.retrieval.scan, per epoch too, so compaction drops the old one.
_NAME = re.compile(
    r"^(embeddings|tokens|ngram_offsets|ngram_hashes|quant)\.e(\d+)\.(f32|f16|i32|i64|u64|i8)$")


def fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes | np.ndarray) -> None:
    """Write to a temp file, fsync, rename over `path`: readers see old or new, never half."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        if isinstance(data, np.ndarray):
            np.ascontiguousarray(data).tofile(f)
        else:
            f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


class ArrayFiles:
    """The four array files of one epoch."""

    def __init__(self, root: Path, epoch: int, dim: int, dtype: str) -> None:
        suffix, self.emb_dtype = DTYPES[dtype]
        self.root, self.epoch, self.dim = root, epoch, dim
        self.embeddings = root / f"embeddings.e{epoch}.{suffix}"
        self.tokens = root / f"tokens.e{epoch}.i32"
        self.offsets = root / f"ngram_offsets.e{epoch}.i64"
        self.hashes = root / f"ngram_hashes.e{epoch}.u64"

    @property
    def paths(self) -> tuple[Path, Path, Path, Path]:
        return (self.embeddings, self.tokens, self.offsets, self.hashes)

    def committed_sizes(self, n_rows: int, n_hashes: int) -> tuple[int, int, int, int]:
        return (
            n_rows * self.dim * self.emb_dtype.itemsize,
            n_rows * 4,
            (n_rows + 1) * 8,
            n_hashes * 8,
        )

    def initialise(self) -> None:
        """An empty store: no rows, and the offsets file holding its leading 0."""
        write_atomic(self.embeddings, b"")
        write_atomic(self.tokens, b"")
        write_atomic(self.offsets, np.zeros(1, dtype="<i8"))
        write_atomic(self.hashes, b"")

    def write_full(
        self,
        embeddings: np.ndarray,
        tokens: np.ndarray,
        offsets: np.ndarray,
        hashes: np.ndarray,
    ) -> None:
        """A whole epoch at once (compaction)."""
        write_atomic(self.embeddings, np.asarray(embeddings, dtype=self.emb_dtype))
        write_atomic(self.tokens, np.asarray(tokens, dtype="<i4"))
        write_atomic(self.offsets, np.asarray(offsets, dtype="<i8"))
        write_atomic(self.hashes, np.asarray(hashes, dtype="<u8"))

    def truncate(self, n_rows: int, n_hashes: int) -> None:
        """Cut off uncommitted tails left by an interrupted writer."""
        for path, size in zip(self.paths, self.committed_sizes(n_rows, n_hashes), strict=True):
            actual = path.stat().st_size
            if actual < size:
                raise OSError(f"{path.name} is shorter ({actual} bytes) than its committed "
                              f"length ({size} bytes): the CKF is damaged")
            if actual > size:
                os.truncate(path, size)

    def append(
        self,
        n_rows: int,
        n_hashes: int,
        vectors: np.ndarray,
        tokens: np.ndarray,
        hash_lists: Sequence[np.ndarray],
        last_offset: int,
    ) -> int:
        """Append rows after the committed ones and fsync; returns the new hash count."""
        sizes = self.committed_sizes(n_rows, n_hashes)
        lengths = np.fromiter((len(h) for h in hash_lists), dtype=np.int64, count=len(hash_lists))
        new_offsets = last_offset + np.cumsum(lengths)
        hashes = (np.concatenate([np.asarray(h, dtype="<u8") for h in hash_lists])
                  if hash_lists else np.zeros(0, dtype="<u8"))
        chunks = (
            np.ascontiguousarray(vectors, dtype=self.emb_dtype),
            np.ascontiguousarray(tokens, dtype="<i4"),
            new_offsets.astype("<i8"),
            hashes,
        )
        for path, size, chunk in zip(self.paths, sizes, chunks, strict=True):
            with open(path, "r+b") as f:
                f.seek(size)
                chunk.tofile(f)
                f.flush()
                os.fsync(f.fileno())
        return n_hashes + int(lengths.sum())

    def map(self, n_rows: int, n_hashes: int) -> tuple[np.ndarray, np.ndarray, np.ndarray,
                                                          np.ndarray]:
        """Read-only views of the committed prefix (memory-mapped; nothing is read yet)."""

        def mm(path: Path, dtype: np.dtype | str, shape: tuple[int, ...]) -> np.ndarray:
            if int(np.prod(shape)) == 0:
                return np.zeros(shape, dtype=dtype)
            return np.memmap(path, dtype=dtype, mode="r", shape=shape)

        return (
            mm(self.embeddings, self.emb_dtype, (n_rows, self.dim)),
            mm(self.tokens, "<i4", (n_rows,)),
            mm(self.offsets, "<i8", (n_rows + 1,)),
            mm(self.hashes, "<u8", (n_hashes,)),
        )

    def fsync_all(self) -> None:
        fsync_dir(self.root)


def other_epoch_files(root: Path, epoch: int) -> list[Path]:
    """Array files (and temp files) not belonging to `epoch`: leftovers of a compaction."""
    out = []
    for p in root.iterdir():
        if p.name.endswith(".tmp"):
            out.append(p)
            continue
        m = _NAME.match(p.name)
        if m and int(m.group(2)) != epoch:
            out.append(p)
    return out


def switch_to_epoch(files: ArrayFiles, commit: Callable[[], None]) -> None:
    """Make `files` (a new epoch, fully written) the CKF's arrays: `commit` records the switch
    in the database; if it fails the new files go and the old epoch stays in force, and once
    it succeeded every other epoch's files go. Compaction and re-embedding both end here."""
    try:
        commit()
    except BaseException:
        for p in files.paths:
            p.unlink(missing_ok=True)
        raise
    for p in other_epoch_files(files.root, files.epoch):
        p.unlink(missing_ok=True)
