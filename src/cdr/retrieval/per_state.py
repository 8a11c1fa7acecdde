"""What is derived from every row of a fact index, built once per index state and shared.

BM25 over the facts' words (`cdr.retrieval.lexical`) and the document code of each row
(`cdr.retrieval.doc_support`) are read from every fact of an index. A session's windows and
every session on the same state use the same result, so it is built on first use and kept per
state — (path, model, generation, rows): any commit gives a new state, so nothing is served
stale — for the last few states. Both keep their cache here, in one place.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

import numpy as np

T = TypeVar("T")
CACHE_STATES = 4
# Rows read per `facts()` call: bounds the memory of a read of a million-row index.
FACT_READ_CHUNK = 20_000


def state_key(index: Any) -> tuple[str, str, int, int]:
    """The state of `index` a derived value belongs to."""
    return (str(index.path), str(index.model_id), int(index.generation), int(index.n_rows))


def every_fact(index: Any, rows: np.ndarray | None = None) -> Iterator[tuple[int, Any]]:
    """(row, fact) for every row of `index` (or of `rows`, ascending), read
    FACT_READ_CHUNK rows at a time."""
    wanted = np.arange(int(index.n_rows)) if rows is None else np.asarray(rows, np.int64)
    for lo in range(0, len(wanted), FACT_READ_CHUNK):
        part = wanted[lo:lo + FACT_READ_CHUNK]
        yield from zip(part.tolist(), index.facts(part), strict=True)


class PerState(Generic[T]):
    """`build(index)`, called at most once per state of the index while that state is among
    the last `states` used; safe to call from many sessions' threads at once (a state built
    twice by a race is built the same both times, and one result is kept)."""

    def __init__(self, build: Callable[[Any], T], states: int = CACHE_STATES) -> None:
        self.build = build
        self.states = states
        self._cache: OrderedDict[tuple[str, str, int, int], T] = OrderedDict()
        self._lock = threading.Lock()

    def __call__(self, index: Any) -> T:
        key = state_key(index)
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                return hit
        built = self.build(index)  # outside the lock: other states stay served meanwhile
        with self._lock:
            self._cache[key] = built
            while len(self._cache) > self.states:
                self._cache.popitem(last=False)
        return built
