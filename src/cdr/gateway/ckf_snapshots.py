"""The gateway's view of its CKF: immutable snapshots for readers, one writer at a time.

Why snapshots instead of `CKF.refresh()` in place: a request reads several per-row arrays
(Phase 1 matrix, importance, token counts, the n-gram index its session's blacklist is bound
to) and must see them from one committed state. Refreshing the shared object under a running
request could hand it a longer importance array than the n-gram counts it already built. So
each request takes the current snapshot once and uses only it; after an ingest (ours, or one
made by `cdr ingest` in another process, noticed by a watcher thread) a *new* `CKF` object is
opened, warmed (n-gram index built) and swapped in. Old snapshots are dropped when the last
request holding them ends.

Writes (uploads, deletes) go through one single-thread executor and a separate `CKF` object,
so there is only ever one writer in this process; the CKF's file lock guards against others.

This module is the local-directory backend of the `KnowledgeBase` protocol
(`cdr.gateway.knowledge_base`, which holds what both backends share): it opens, watches and
writes CKF directories, so it knows their concrete types. What it hands to request handlers is
a `FactIndex`; the loop, sessions and routes downstream depend on that protocol only.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from cdr.errors import NotFoundError
from cdr.gateway.knowledge_base import WATCH_SECONDS, WatchedKnowledgeBase, submit_then_reload

if TYPE_CHECKING:
    from cdr.ckf.handle import CKF
    from cdr.ckf.snapshot import CKFSnapshot

__all__ = ["WATCH_SECONDS", "LocalKnowledgeBase", "submit_then_reload"]

log = logging.getLogger("cdr.gateway")
_T = TypeVar("_T")


def _open(path: Path) -> CKFSnapshot:
    """A read-only snapshot: request threads never write through it."""
    from cdr.ckf.snapshot import CKFSnapshot

    return CKFSnapshot.open(path)


class LocalKnowledgeBase(WatchedKnowledgeBase):
    """Holds the current CKF snapshot for `path` (None while no CKF exists there)."""

    def __init__(self, path: Path | None, initial: CKFSnapshot | None = None,
                 watch_seconds: float = WATCH_SECONDS) -> None:
        super().__init__(initial, watch_seconds=watch_seconds, name="ckf")
        self.path = Path(initial.path) if initial is not None else path
        self._writable: CKF | None = None
        self._probe: CKFSnapshot | None = None
        self._probe_lock = threading.Lock()
        if self._current is None and self.path is not None:
            try:
                self._current = _open(self.path)
            except NotFoundError:
                self._current = None  # created by the first upload

    # ------------------------------------------------------------------ readers

    def current(self) -> CKFSnapshot | None:
        """The snapshot to use for a whole request (None: no CKF yet)."""
        return self._current  # type: ignore[no-any-return]

    def latest(self) -> CKFSnapshot | None:
        """`current()`, after catching up with the disk now rather than at the watcher's next
        tick: views of the CKF itself (stats, documents) must agree with what they list."""
        if self._changed():
            self.reload()
        return self._current  # type: ignore[no-any-return]

    def reload(self) -> bool:
        """Swap in a fresh snapshot if the CKF on disk changed; True if it did."""
        if self.path is None:
            return False
        with self._lock:
            old = self._current
            try:
                fresh = _open(self.path)
            except NotFoundError:
                return False
            if old is not None and fresh.generation == old.generation:
                fresh.close()
                return False
            _ = fresh.ngram_index  # build before readers see it
            self._current = fresh
            log.info("CKF %s: now at generation %s (%d active facts)", self.path,
                     fresh.generation, int(fresh.active.sum()))
            return True

    # ------------------------------------------------------------------ watcher

    def _can_watch(self) -> bool:
        return self.path is not None

    def _poll(self) -> None:
        if self._changed():
            self.reload()

    def _changed(self) -> bool:
        """Cheap check: a probe snapshot reads the committed generation (one meta row)."""
        if self.path is None:
            return False
        with self._probe_lock:  # the watcher and request threads share the probe
            return self._probe_changed()

    def _probe_changed(self) -> bool:
        if self._probe is None:
            try:
                self._probe = _open(self.path)  # type: ignore[arg-type]
            except NotFoundError:
                return False
        cur = self._current
        return cur is None or self._probe.latest_generation() != cur.generation

    # ------------------------------------------------------------------ writers

    def writable_ckf(self) -> CKF:
        """The CKF object writes go through (created on first use); writer thread only."""
        if self.path is None:
            raise NotFoundError("no CKF directory is configured: set CDR_CKF or pass --ckf")
        if self._writable is None:
            from cdr.ckf.handle import CKF

            self._writable = CKF.open_or_create(self.path)
        return self._writable

    def route(self, sources: Sequence[str]) -> list[tuple[CKF, list[int]]]:
        """Where documents `sources` are written: all to the one writable CKF (a shard set
        splits them by owner, `shard_kb`). Writer thread only."""
        return [(self.writable_ckf(), list(range(len(sources))))]

    def submit_write(self, fn: Callable[[CKF], _T]) -> Future[_T]:
        """Run `fn(writable_ckf)` on the single writer thread, then swap in the new state."""
        return self.submit(lambda: fn(self.writable_ckf()))

    def delete_document(self, doc: str) -> Future[tuple[str, int]]:
        """Find `doc` in the current snapshot (`NotFoundError` before any write is queued),
        then delete it on the writer thread: (doc id, facts removed)."""
        index = self._current
        if index is None:
            raise NotFoundError(f"no document {doc!r}: there is no CKF yet")
        doc_id = str(index.document(doc)["doc_id"])
        return self.submit_write(lambda ckf: (doc_id, ckf.delete_document(doc_id)))

