"""The streamed runs this gateway process is writing, by session id.

A client that reconnects with `Last-Event-ID` may do so while the run it left is still
writing a window (a run whose client went away stops only between windows). Before the
resumed stream goes on, that run must have stopped and stored its window; otherwise both
would write the same window. This registry lets the resume stop the run and wait for it.
A run on another gateway process (replicas on one session store) is not here: the resume
then waits for its window to appear in the store (`cdr.gateway.stream_resume`).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field


@dataclass
class _Live:
    cancelled: threading.Event
    finished: threading.Event = field(default_factory=threading.Event)


class LiveStreams:
    """Thread-safe: chat threads add and remove runs, resumes stop them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._runs: dict[str, _Live] = {}

    def add(self, session_id: str, cancelled: threading.Event) -> threading.Event:
        """Register a run; returns the event its worker sets (through `remove`) when done."""
        live = _Live(cancelled)
        with self._lock:
            self._runs[session_id] = live
        return live.finished

    def remove(self, session_id: str, finished: threading.Event) -> None:
        """The run's worker is done (however it ended)."""
        with self._lock:
            live = self._runs.get(session_id)
            if live is not None and live.finished is finished:
                del self._runs[session_id]
        finished.set()

    def stop(self, session_id: str, timeout: float) -> bool:
        """Ask the run writing `session_id` to stop after its window, and wait for it; True
        when no run is writing it any more."""
        with self._lock:
            live = self._runs.get(session_id)
        if live is None:
            return True
        live.cancelled.set()
        return live.finished.wait(timeout)

    def __contains__(self, session_id: object) -> bool:
        with self._lock:
            return session_id in self._runs
