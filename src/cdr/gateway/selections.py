"""Phase 1 selections shared between requests: a session's query vector is fixed when it
starts, so every envelope of it (each window, and every retry of one) selects the same rows
from a given CKF snapshot. Scanning the whole CKF for each request was most of an envelope's
CPU time (~14 of ~22 ms at 100k facts); the cache makes it a dictionary lookup.

Correctness rests on two facts: `select` is a pure function of (snapshot, query vector, gate,
limit), and a snapshot never changes (an ingest publishes a new one). So entries are keyed on
exactly those, the cache empties itself when a new snapshot is seen, and the cached arrays are
read-only, so a caller that tried to change a shared selection would fail loudly rather than
corrupt other sessions' rankings.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

import numpy as np

from cdr.retrieval.factindex import Selection

__all__ = ["CachingIndex", "SelectionCache"]


def _frozen(sel: Selection) -> Selection:
    for arr in (sel.indices, sel.relevances, sel.embeddings):
        arr.setflags(write=False)
    return sel


class SelectionCache:
    """Selections by (query vector bytes, gate, limit) for the current snapshot, least
    recently used dropped first, bounded by the bytes their arrays hold."""

    def __init__(self, max_bytes: int = 128 << 20) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[tuple[bytes, float, int | None], Selection] = OrderedDict()
        self._bytes = 0
        self._index: Any = None
        self._generation: int | None = None  # of `_index` when its entries were made
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    @staticmethod
    def _size(sel: Selection) -> int:
        return int(sel.indices.nbytes + sel.relevances.nbytes + sel.embeddings.nbytes) + 512

    def select(self, index: Any, query_vector: Any, min_relevance: float,
               limit: int | None = None) -> Selection:
        """`index.select(query_vector, min_relevance, limit)`, from the cache when it was
        asked before of this index (in the same state)."""
        q = np.asarray(query_vector)
        if not isinstance(query_vector, np.ndarray) or q.dtype != np.float32 or q.ndim != 1:
            # let it refuse or convert
            out: Selection = index.select(query_vector, min_relevance, limit)
            return out
        key = (q.tobytes(), float(min_relevance), limit)
        generation = index.generation  # a long-lived index (Ray shard set) may move on
        with self._lock:
            if index is not self._index or generation != self._generation:
                self._entries.clear()
                self._bytes = 0
                self._index = index
                self._generation = generation
            sel = self._entries.get(key)
            if sel is not None:
                self._entries.move_to_end(key)
                self.hits += 1
                return sel
            self.misses += 1
        sel = _frozen(index.select(query_vector, min_relevance, limit))
        size = self._size(sel)
        with self._lock:
            if index is self._index and generation == self._generation \
                    and size <= self.max_bytes and key not in self._entries:
                self._entries[key] = sel
                self._bytes += size
                while self._bytes > self.max_bytes:
                    _, old = self._entries.popitem(last=False)
                    self._bytes -= self._size(old)
        return sel

    def __len__(self) -> int:
        return len(self._entries)


class CachingIndex:
    """A `FactIndex` snapshot whose `select` goes through a `SelectionCache`; everything else
    is the snapshot's own (attribute access is forwarded)."""

    def __init__(self, index: Any, cache: SelectionCache) -> None:
        self._index = index
        self._cache = cache

    @property
    def index(self) -> Any:
        return self._index


    def select(self, query_vector: Any, min_relevance: float,
               limit: int | None = None) -> Selection:
        return self._cache.select(self._index, query_vector, min_relevance, limit)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._index, name)
