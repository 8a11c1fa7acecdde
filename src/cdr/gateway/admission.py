"""Admission control for the gateway's long runs (chat completions): a bounded number of runs
in flight and waiting, overall and per API key, and past either bound an immediate refusal with
`Retry-After` instead of a silent queue.

A chat completion holds one of the chat threads (`CDR_CHAT_THREADS`) for its whole run
(seconds to minutes). With all of them running, more requests used to wait in the executor's
queue with nothing said: the client saw its first byte 20 s later. Here every run takes a
ticket first: with `running + waiting` at the overall bound the request is answered 503, and
with one key's runs at its bound 429 (that key is using more than its share; others still get
in), both with `Retry-After` (the recent mean run time, bounded) and a JSON body naming the
bound. Queue depth and refusals are metrics (`cdr.gateway.metrics`).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Hashable
from dataclasses import dataclass

from cdr.gateway.errors import ApiError

# Retry-After bounds, seconds: at least one (a 0 invites an immediate storm), at most two
# minutes (a client should not give up on a server that is merely busy).
MIN_RETRY_SECONDS, MAX_RETRY_SECONDS = 1, 120
# Weight of the newest run time in the running mean Retry-After is taken from.
EWMA_WEIGHT = 0.2


@dataclass
class Ticket:
    """One admitted run; `release()` when it ends (idempotent)."""

    admission: Admission
    key: Hashable
    seconds: float = 0.0
    _released: bool = False

    def release(self, seconds: float | None = None) -> None:
        if not self._released:
            self._released = True
            self.admission._release(self.key, seconds)


class Admission:
    """Counts runs admitted (running or waiting for a chat thread), overall and per key."""

    def __init__(self, capacity: int, max_waiting: int, per_key: int,
                 metrics: object | None = None) -> None:
        if capacity < 1 or max_waiting < 0 or per_key < 1:
            raise ValueError("admission bounds: capacity ≥ 1, max_waiting ≥ 0, per_key ≥ 1")
        self.capacity, self.max_waiting, self.per_key = capacity, max_waiting, per_key
        self.metrics = metrics
        self._lock = threading.Lock()
        self._admitted = 0
        self._by_key: dict[Hashable, int] = {}
        self._mean_seconds = 5.0

    @property
    def limit(self) -> int:
        return self.capacity + self.max_waiting

    @property
    def admitted(self) -> int:
        return self._admitted

    @property
    def waiting(self) -> int:
        return max(0, self._admitted - self.capacity)

    def retry_after(self) -> int:
        return int(min(MAX_RETRY_SECONDS, max(MIN_RETRY_SECONDS,
                                              math.ceil(self._mean_seconds))))

    def enter(self, key: Hashable) -> Ticket:
        """A ticket for one run of `key`, or an `ApiError` (429 for the key's bound, 503 for
        the gateway's) that the caller raises before any work is queued."""
        with self._lock:
            mine = self._by_key.get(key, 0)
            if mine >= self.per_key:
                self._refused("key")
                raise ApiError(
                    429, f"this API key already has {mine} runs admitted, its limit "
                    f"(CDR_MAX_RUNS_PER_KEY); retry when one has finished",
                    code="too_many_runs", headers={"Retry-After": str(self.retry_after())})
            if self._admitted >= self.limit:
                self._refused("busy")
                raise ApiError(
                    503, f"the gateway is at capacity: {self.capacity} runs writing and "
                    f"{self.max_waiting} waiting (CDR_MAX_WAITING_RUNS); retry later",
                    code="server_busy", headers={"Retry-After": str(self.retry_after())})
            self._admitted += 1
            self._by_key[key] = mine + 1
            self._gauge()
        return Ticket(self, key)

    def _release(self, key: Hashable, seconds: float | None) -> None:
        with self._lock:
            self._admitted -= 1
            left = self._by_key.get(key, 1) - 1
            if left:
                self._by_key[key] = left
            else:
                self._by_key.pop(key, None)
            if seconds is not None and seconds >= 0:
                self._mean_seconds += EWMA_WEIGHT * (seconds - self._mean_seconds)
            self._gauge()

    def _gauge(self) -> None:
        observe = getattr(self.metrics, "admission", None)
        if observe is not None:
            observe(self._admitted, self.waiting)

    def _refused(self, reason: str) -> None:
        refuse = getattr(self.metrics, "refused", None)
        if refuse is not None:
            refuse(reason)
