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

This module is the local-directory backend's adapter: it opens, watches and writes CKF
directories, so it knows their concrete types. What it hands to request handlers is a
`FactIndex`; the loop, sessions and routes downstream depend on that protocol only.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from cdr.errors import NotFoundError

if TYPE_CHECKING:
    from cdr.ckf.handle import CKF
    from cdr.ckf.snapshot import CKFSnapshot
    from cdr.retrieval.factindex import FactIndex

log = logging.getLogger("cdr.gateway")
_T = TypeVar("_T")
WATCH_SECONDS = 1.0


def _open(path: Path) -> CKFSnapshot:
    """A read-only snapshot: request threads never write through it."""
    from cdr.ckf.snapshot import CKFSnapshot

    return CKFSnapshot.open(path)


def submit_then_reload(pool: ThreadPoolExecutor, fn: Callable[[], _T],
                       reload: Callable[[], None]) -> Future[_T]:
    """Run `fn()` on the writer `pool`, then `reload()` even when `fn` failed: a write that
    committed part of its batches must still become visible to the readers."""

    def run() -> _T:
        try:
            return fn()
        finally:
            reload()

    return pool.submit(run)


class KnowledgeBase:
    """Holds the current CKF snapshot for `path` (None while no CKF exists there)."""

    def __init__(self, path: Path | None, initial: CKFSnapshot | None = None,
                 watch_seconds: float = WATCH_SECONDS) -> None:
        self.path = Path(initial.path) if initial is not None else path
        self._lock = threading.Lock()
        self._current: CKFSnapshot | None = initial
        self._empty_of: tuple[CKFSnapshot | None, bool] | None = None
        self._writer: CKF | None = None
        self._probe: CKFSnapshot | None = None
        self._probe_lock = threading.Lock()
        self._writes = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cdr-ckf-writer")
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None
        self._watch_seconds = watch_seconds
        if self._current is None and self.path is not None:
            try:
                self._current = _open(self.path)
            except NotFoundError:
                self._current = None  # created by the first upload

    # ------------------------------------------------------------------ readers

    def current(self) -> CKFSnapshot | None:
        """The snapshot to use for a whole request (None: no CKF yet)."""
        return self._current

    def latest(self) -> CKFSnapshot | None:
        """`current()`, after catching up with the disk now rather than at the watcher's next
        tick: views of the CKF itself (stats, documents) must agree with what they list."""
        if self._changed():
            self.reload()
        return self._current

    @staticmethod
    def is_empty(snapshot: FactIndex | None) -> bool:
        return snapshot is None or not bool(snapshot.active.any())

    def current_is_empty(self) -> bool:
        """`is_empty(current())`, computed once per snapshot (every response asks)."""
        snap = self._current
        cached = self._empty_of
        if cached is None or cached[0] is not snap:
            cached = self._empty_of = (snap, self.is_empty(snap))
        return cached[1]

    def warm(self) -> None:
        """Load the embedding model and the n-gram index before the first request needs
        them (the model takes about a second)."""
        snap = self._current
        if snap is not None:
            _ = snap.embedder
            _ = snap.ngram_index
        else:
            from cdr.retrieval.embed import default_embedder

            default_embedder()

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

    def start_watching(self) -> None:
        if self.path is None or self._watcher is not None:
            return
        self._watcher = threading.Thread(target=self._watch, name="cdr-ckf-watch", daemon=True)
        self._watcher.start()

    def _watch(self) -> None:
        while not self._stop.wait(self._watch_seconds):
            try:
                if self._changed():
                    self.reload()
            except Exception:
                log.exception("CKF watcher: could not check %s", self.path)

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

    def check_writable(self) -> None:
        """A local CKF directory is always writable (uploads create it on first use)."""

    def writer(self) -> CKF:
        """The CKF object writes go through (created on first use); writer thread only."""
        if self.path is None:
            raise NotFoundError("no CKF directory is configured: set CDR_CKF or pass --ckf")
        if self._writer is None:
            from cdr.ckf.handle import CKF

            self._writer = CKF.open_or_create(self.path)
        return self._writer

    def route(self, sources: Sequence[str]) -> list[tuple[CKF, list[int]]]:
        """Where documents `sources` are written: all to the one writer (a shard set splits
        them by owner, `shard_kb`). Writer thread only."""
        return [(self.writer(), list(range(len(sources))))]

    def submit(self, fn: Callable[[], _T]) -> Future[_T]:
        """Run `fn()` on the single writer thread, then swap in the new state."""
        return submit_then_reload(self._writes, fn, self.reload)

    def submit_write(self, fn: Callable[[CKF], _T]) -> Future[_T]:
        """Run `fn(writer_ckf)` on the single writer thread, then swap in the new state."""
        return self.submit(lambda: fn(self.writer()))

    def close(self) -> None:
        self._stop.set()
        self._writes.shutdown(wait=True, cancel_futures=False)
        if self._watcher is not None:
            self._watcher.join(timeout=5)
