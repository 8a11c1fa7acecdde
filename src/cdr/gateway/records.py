"""What the gateway stores per session: the session state, the trace so far, and the
envelope the sidecar handed out and has not been told about yet.

Why store the envelope rather than re-prepare it when the window's text comes back: between
`/envelope` and `/windows` the CKF may change (an ingest), and the client wrote from the
envelope it was given. Completing the window against a re-prepared envelope would report
headers, exit decisions and a trace for facts the client never saw. So `/envelope` stores the
packed facts with their scores (a few KB: ids, sources, sections and six floats per fact;
never the fact text), and `/windows` rebuilds exactly that `PreparedWindow`.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from cdr.envelope import Budget, Envelope
from cdr.errors import InvalidInputError
from cdr.loop import PreparedWindow
from cdr.ngrams import NgramIndex
from cdr.prompt import PlanSection
from cdr.ranking import Ranking
from cdr.session import Session

FORMAT = "cdr-gateway-session/1"
_RANKING_ARRAYS = ("score", "relevance", "novelty", "residual_pull", "ngram_penalty",
                   "coverage_score")


@dataclass(frozen=True, slots=True)
class FactRef:
    """The parts of a CKF fact that traces and headers need after the envelope went out."""

    id: str
    source: str
    section: str
    content: str = ""


def dump_prepared(prepared: PreparedWindow) -> dict[str, Any]:
    """A JSON-able copy of a prepared window (float32 values round-trip exactly)."""
    env = prepared.envelope
    r = env.ranking
    return {
        "number": prepared.number,
        "etag": env.etag,
        "fact_ids": list(env.fact_ids),
        "facts": [[f.source, f.section] for f in prepared.facts],
        "rows": [int(x) for x in prepared.rows],
        "tokens": [int(x) for x in env.tokens],
        "ranking": {
            "indices": [int(x) for x in r.indices],
            **{k: np.asarray(getattr(r, k), dtype=np.float32).tolist() for k in _RANKING_ARRAYS},
            "mode": r.mode,
            "n_candidates": int(r.n_candidates),
            "ngram_activations": int(r.ngram_activations),
            "extra": {k: float(v) for k, v in r.extra.items()},
        },
        "budget": [env.budget.context, env.budget.system, env.budget.task,
                   env.budget.generation],
        "anchor": env.anchor,
        "skipped": int(env.skipped),
        "plan": [[p.title, p.target_words, list(p.fact_refs)] for p in prepared.plan],
        "coverage_depth": int(prepared.coverage_depth),
        "max_tokens": int(prepared.max_tokens),
    }


def load_prepared(data: dict[str, Any]) -> PreparedWindow:
    """The `PreparedWindow` `dump_prepared` saw (without the prompt messages or fact text)."""
    try:
        rk = data["ranking"]
        ranking = Ranking(
            np.asarray(rk["indices"], dtype=np.int64),
            *(np.asarray(rk[k], dtype=np.float32) for k in _RANKING_ARRAYS),
            mode=rk["mode"], n_candidates=int(rk["n_candidates"]),
            ngram_activations=int(rk["ngram_activations"]), extra=dict(rk["extra"]),
        )
        fact_ids = [str(x) for x in data["fact_ids"]]
        envelope = Envelope(
            ranking=ranking, fact_ids=fact_ids,
            tokens=np.asarray(data["tokens"], dtype=np.int64),
            budget=Budget(*(int(x) for x in data["budget"])),
            anchor=data["anchor"], skipped=int(data["skipped"]),
        )
        facts = [FactRef(fid, src, sec) for fid, (src, sec) in
                 zip(fact_ids, data["facts"], strict=True)]
        plan = [PlanSection(t, int(w), tuple(refs)) for t, w, refs in data["plan"]]
        return PreparedWindow(
            number=int(data["number"]), envelope=envelope,
            rows=np.asarray(data["rows"], dtype=np.int64), facts=facts, plan=plan,
            messages=[], coverage_depth=int(data["coverage_depth"]),
            max_tokens=int(data["max_tokens"]),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise InvalidInputError(f"stored envelope is damaged: {exc!r}") from None


@dataclass
class SessionRecord:
    """One stored session: state, per-window trace records, and the pending envelope."""

    session: Session
    windows: list[dict[str, Any]] = field(default_factory=list)
    pending: dict[str, Any] | None = None
    mode: str = "sidecar"  # or "chat": who drives the windows
    options: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps({
            "format": FORMAT, "mode": self.mode, "options": self.options,
            "session": self.session.to_dict(), "windows": self.windows,
            "pending": self.pending,
        }, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str, ngram_index: NgramIndex | None = None) -> SessionRecord:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InvalidInputError(f"stored session is not JSON: {exc}") from None
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise InvalidInputError("stored session has an unknown format")
        return cls(
            session=Session.from_dict(data["session"], ngram_index),
            windows=list(data.get("windows") or []),
            pending=data.get("pending"),
            mode=str(data.get("mode", "sidecar")),
            options=dict(data.get("options") or {}),
        )

    def trace(self, session_id: str) -> dict[str, Any]:
        s = self.session
        return {
            "session_id": session_id,
            "task": s.task,
            "embedding_model": s.model_id,
            "ranking": s.ranking,
            "sub_queries": [{"id": q.id, "text": q.text, "expected_words": q.expected_words}
                            for q in s.sub_queries],
            "windows": self.windows,
            "status": s.status,
            "completeness": round(s.completeness(), 4),
            "max_windows": s.max_windows,
        }


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

    def get(self, session_id: str, version: int, snapshot: Any) -> SessionRecord | None:
        with self._lock:
            entry = self._entries.get(session_id)
            if entry is None or entry[0] != version or entry[1] is not snapshot:
                return None
            self._entries.move_to_end(session_id)
            return entry[2]

    def put(self, session_id: str, version: int, snapshot: Any, record: SessionRecord) -> None:
        size = self._size(record)
        with self._lock:
            self._drop(session_id)
            if size > self.max_bytes:
                return
            self._entries[session_id] = (version, snapshot, record, size)
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
