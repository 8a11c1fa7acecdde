"""What the gateway stores per session: the session state, the trace so far, and the
envelope the sidecar handed out and has not been told about yet.

Why store the envelope rather than re-prepare it when the window's text comes back: between
`/envelope` and `/windows` the CKF may change (an ingest), and the client wrote from the
envelope it was given. Completing the window against a re-prepared envelope would report
headers, exit decisions and a trace for facts the client never saw. So `/envelope` stores the
packed facts with their scores (a few KB: ids, sources, sections and six floats per fact;
never the fact text: `PreparedWindow.to_dict`), and `/windows` rebuilds exactly that
`PreparedWindow` (`PreparedWindow.from_dict`).
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from typing import Any

from cdr.errors import InvalidInputError, parse_json_object
from cdr.ngrams import NgramIndex
from cdr.session import Session
from cdr.trace import trace_document

# The stored form's name. The pending envelope inside is `PreparedWindow.to_dict()`, whose
# layout is that of the first stored records (tests/data/stored_session_v1.json).
FORMAT = "cdr-gateway-session/1"


@dataclass
class SessionRecord:
    """One stored session: state, per-window trace records, and the pending envelope."""

    session: Session
    windows: list[dict[str, Any]] = field(default_factory=list)
    pending: dict[str, Any] | None = None
    mode: str = "sidecar"  # or "chat": who drives the windows
    options: dict[str, Any] = field(default_factory=dict)
    # The id of the API key that created the session (`ApiKey.owner_id`, never the key):
    # only that key, or an admin key, reaches it. None: created without keys (dev mode).
    owner: str | None = None
    # The knowledge base it was made on (`cdr serve --kb NAME=...`); None: the default KB
    # (and every record stored before KBs had names).
    kb: str | None = None

    @property
    def kb_name(self) -> str:
        return self.kb if self.kb is not None else "default"

    def to_json(self) -> str:
        data: dict[str, Any] = {
            "format": FORMAT, "mode": self.mode, "options": self.options,
            "session": self.session.to_dict(), "windows": self.windows,
            "pending": self.pending,
        }
        # A session without an owner or on the default KB (dev mode, one KB) stores exactly
        # what it did before either existed.
        if self.owner is not None:
            data["owner"] = self.owner
        if self.kb is not None:
            data["kb"] = self.kb
        return json.dumps(data, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str, ngram_index: NgramIndex | None = None) -> SessionRecord:
        data = parse_json_object(text, "stored session")
        if data.get("format") != FORMAT:
            raise InvalidInputError("stored session has an unknown format")
        return cls(
            session=Session.from_dict(data["session"], ngram_index),
            windows=list(data.get("windows") or []),
            pending=data.get("pending"),
            mode=str(data.get("mode", "sidecar")),
            options=dict(data.get("options") or {}),
            owner=_owner(data.get("owner")),
            kb=_owner(data.get("kb")),
        )

    def trace(self, session_id: str) -> dict[str, Any]:
        """The run's trace (`cdr.trace`), with what the gateway adds: the session id, the
        completeness so far and the window limit."""
        s = self.session
        return {"session_id": session_id, **trace_document(s, self.windows),
                "completeness": round(s.completeness(), 4), "max_windows": s.max_windows}


def _owner(value: object) -> str | None:
    """An optional non-empty string field of the stored record (owner, kb)."""
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise InvalidInputError("stored session has an invalid owner or knowledge base")
    return value


def with_pending(stored_data: str, pending: dict[str, Any] | None) -> str:
    """The stored JSON with another pending envelope, without re-serialising the session."""
    data = json.loads(stored_data)
    data["pending"] = pending
    return json.dumps(data, separators=(",", ":"))


class SessionCache:
    """Parsed sessions by (id, stored version, CKF snapshot), so that asking for an envelope
    does not re-parse the session (and rebuild its n-gram counts over the whole CKF) each time.

    Entries are shared between requests and must never be mutated: callers that change a
    session parse a fresh copy (`fresh=True`), and put the result back only after their
    compare-and-set succeeded. The store stays the truth: an entry is used only when its
    version is the stored one. Bounded by an estimate of the memory the parsed sessions hold
    (their per-fact count arrays dominate).
    """

    def __init__(self, max_bytes: int = 256 << 20) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[str, tuple[int, Any, SessionRecord, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    @staticmethod
    def _size(record: SessionRecord) -> int:
        counts = getattr(record.session.blacklist, "counts", None)
        return 4096 + (int(counts.nbytes) if counts is not None else 0)

    def get(self, session_id: str, version: int, index: Any) -> SessionRecord | None:
        with self._lock:
            entry = self._entries.get(session_id)
            if entry is None or entry[0] != version or entry[1] is not index:
                return None
            self._entries.move_to_end(session_id)
            return entry[2]

    def put(self, session_id: str, version: int, index: Any, record: SessionRecord) -> None:
        size = self._size(record)
        with self._lock:
            self._drop(session_id)
            if size > self.max_bytes:
                return
            self._entries[session_id] = (version, index, record, size)
            self._bytes += size
            while self._bytes > self.max_bytes:
                self._drop(next(iter(self._entries)))

    def discard(self, session_id: str) -> None:
        with self._lock:
            self._drop(session_id)

    def _drop(self, session_id: str) -> None:
        old = self._entries.pop(session_id, None)
        if old is not None:
            self._bytes -= old[3]

    def __len__(self) -> int:
        return len(self._entries)


def derive(record: SessionRecord, **changes: Any) -> SessionRecord:
    """A record sharing `record`'s parsed session, with other fields replaced."""
    return replace(record, **changes)
