"""What the gateway asks of a knowledge base, whichever backend serves it.

Two backends exist: a local CKF directory (`cdr.gateway.ckf_snapshots.LocalKnowledgeBase`)
and a shard set served by Ray (`cdr.gateway.shard_kb.ShardSetKnowledgeBase`). Request
handlers, upload jobs and the app's start-up see only the `KnowledgeBase` protocol, so a
third backend slots in by implementing it, and neither backend is special-cased by type.

Both share one shape, written once in `WatchedKnowledgeBase`: readers take the current index
once per request (an immutable committed state, swapped whole when the data changes), a
watcher thread follows changes made by other processes, and every write runs on one writer
thread and is followed by a reload, so readers see it before the write's job says it is done.
What differs per backend is how a change is noticed (`_poll`), how a state is opened
(`reload`), where a write goes (`route`) and how a document is found for deletion.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, runtime_checkable

if TYPE_CHECKING:
    from cdr.ckf.handle import CKF
    from cdr.retrieval.factindex import FactIndex

log = logging.getLogger("cdr.gateway")
_T = TypeVar("_T")
WATCH_SECONDS = 1.0


@runtime_checkable
class KnowledgeBase(Protocol):
    """One knowledge base of the gateway: its current index for readers, one writer thread.

    `path` is where it lives on this machine (a CKF directory, a shard set's directory; None
    while none is configured): the session database defaults to a file beside it."""

    path: Path | None

    def current(self) -> FactIndex | None:
        """The index to use for a whole request (None: no CKF yet)."""
        ...

    def latest(self) -> FactIndex | None:
        """`current()` after catching up with the data now (views of the CKF itself)."""
        ...

    def current_is_empty(self) -> bool:
        """Whether the current index has no active fact (computed once per index)."""
        ...

    def warm(self) -> None:
        """Load the embedding model and the n-gram index before the first request."""
        ...

    def reload(self) -> bool:
        """Swap in the newest committed state if it changed; True if it did."""
        ...

    def start_watching(self) -> None:
        """Follow changes made by other processes from now on (a daemon thread)."""
        ...

    def check_writable(self) -> None:
        """Raise if uploads and deletes cannot be accepted here."""
        ...

    def route(self, sources: Sequence[str]) -> list[tuple[CKF, list[int]]]:
        """(writer, positions in `sources`) per CKF the documents go to. Writer thread only."""
        ...

    def submit(self, fn: Callable[[], _T]) -> Future[_T]:
        """Run `fn()` on the single writer thread, then reload (even when `fn` failed)."""
        ...

    def delete_document(self, doc: str) -> Future[tuple[str, int]]:
        """Delete `doc` (an id, a unique id prefix, or a source): (doc id, facts removed);
        `NotFoundError` (raised, or from the future) when no document matches."""
        ...

    def close(self) -> None:
        """Stop watching and writing; release the backend."""
        ...


def is_empty(index: FactIndex | None) -> bool:
    """No index, or one without an active fact: nothing to ground a window in."""
    return index is None or not bool(index.active.any())


def submit_then_reload(pool: ThreadPoolExecutor, fn: Callable[[], _T],
                       reload: Callable[[], Any]) -> Future[_T]:
    """Run `fn()` on the writer `pool`, then `reload()` even when `fn` failed: a write that
    committed part of its batches must still become visible to the readers."""

    def run() -> _T:
        try:
            return fn()
        finally:
            reload()

    return pool.submit(run)


class WatchedKnowledgeBase:
    """What both backends share (see the module doc): the current index and its emptiness,
    warming, the watcher thread and the single writer thread. A backend sets `_current` and
    writes `reload`, `_poll` (one watcher tick), `route` and `delete_document`."""

    path: Path | None

    def __init__(self, current: Any, *, watch_seconds: float = WATCH_SECONDS,
                 name: str = "ckf") -> None:
        self._current = current
        self._lock = threading.Lock()
        self._empty_of: tuple[Any, bool] | None = None
        self._writes = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"cdr-{name}-writer")
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None
        self._watch_seconds = watch_seconds
        self._name = name

    # ------------------------------------------------------------------ readers

    @staticmethod
    def is_empty(index: FactIndex | None) -> bool:
        """`is_empty` (kept as a method: callers holding a knowledge base ask it)."""
        return is_empty(index)

    def current(self) -> Any:
        return self._current

    def current_is_empty(self) -> bool:
        """`is_empty(current())`, computed once per index (every response asks)."""
        index = self._current
        cached = self._empty_of
        if cached is None or cached[0] is not index:
            cached = self._empty_of = (index, is_empty(index))
        return cached[1]

    def warm(self) -> None:
        """Load the embedding model and build the n-gram index before the first request needs
        them (the model takes about a second); with no index yet, the default model."""
        index = self._current
        if index is not None:
            _ = index.embedder
            _ = index.ngram_index
        else:
            from cdr.retrieval.embed import default_embedder

            default_embedder()

    def reload(self) -> bool:
        raise NotImplementedError

    # ------------------------------------------------------------------ watcher

    def _can_watch(self) -> bool:
        return True

    def _poll(self) -> None:
        """One watcher tick: notice a change made elsewhere and reload."""
        raise NotImplementedError

    def start_watching(self) -> None:
        if self._watcher is not None or not self._can_watch():
            return
        self._watcher = threading.Thread(target=self._watch, name=f"cdr-{self._name}-watch",
                                         daemon=True)
        self._watcher.start()

    def _watch(self) -> None:
        while not self._stop.wait(self._watch_seconds):
            try:
                self._poll()
            except Exception:
                log.exception("%s watcher: could not check %s", self._name, self.path)

    # ------------------------------------------------------------------ writers

    def check_writable(self) -> None:
        """Both backends accept writes (see their module docs)."""

    def submit(self, fn: Callable[[], _T]) -> Future[_T]:
        """Run `fn()` on the single writer thread, then swap in the new state."""
        return submit_then_reload(self._writes, fn, self.reload)

    def close(self) -> None:
        """Stop watching and writing (writes already queued finish first)."""
        self._stop.set()
        self._writes.shutdown(wait=True, cancel_futures=False)
        if self._watcher is not None:
            self._watcher.join(timeout=5)
