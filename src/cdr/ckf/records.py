"""Records shared by the CKF's parser, chunker, store and ingest: the vocabulary of the package.

Per-fact data that ranking touches lives in numpy arrays inside the store; the dataclasses
here exist only for the handful of facts a caller asks to read (an envelope, a search result).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum

from cdr.errors import InvalidInputError
from cdr.retrieval.factindex import Selection as Selection  # re-export: it belongs to the protocol
from cdr.text.blocks import Block as Block  # re-export: the one block class of every parser

# SPEC-009 fact size bounds, in cl100k tokens.
MIN_FACT_TOKENS = 10
MAX_FACT_TOKENS = 2048


class FactStatus(IntEnum):
    """Stored as uint8 per row. ACTIVE and STALE are selectable; the others never are."""

    ACTIVE = 0
    STALE = 1  # its source vanished from a re-ingested directory: kept, flagged, still usable
    DELETED = 2  # no document holds it any more (row kept until compaction)
    QUARANTINED = 3  # withdrawn by an operator or a safety check; survives re-ingest

    @classmethod
    def parse(cls, value: str | int | FactStatus) -> FactStatus:
        if isinstance(value, FactStatus):
            return value
        if isinstance(value, int):
            return cls(value)
        try:
            return cls[str(value).strip().upper()]
        except KeyError:
            names = ", ".join(s.name for s in cls)
            raise InvalidInputError(f"unknown fact status {value!r}; expected one of {names}") \
                from None


SELECTABLE_STATUSES = (FactStatus.ACTIVE, FactStatus.STALE)

# Importance weight by source type. Aliases map the spellings people type.
SOURCE_TYPE_IMPORTANCE: dict[str, float] = {
    "regulatory": 0.90,
    "official": 0.80,
    "peer-reviewed": 0.75,
    "internal": 0.70,
    "user": 0.60,
    "web": 0.50,
}
_SOURCE_TYPE_ALIASES = {
    "official-documentation": "official",
    "official documentation": "official",
    "documentation": "official",
    "docs": "official",
    "peer_reviewed": "peer-reviewed",
    "peer reviewed": "peer-reviewed",
    "peerreviewed": "peer-reviewed",
    "user-provided": "user",
    "user provided": "user",
    "user_provided": "user",
}


def normalize_source_type(value: str) -> str:
    """Canonical source type name, or a clear error listing the valid ones."""
    key = str(value).strip().lower()
    key = _SOURCE_TYPE_ALIASES.get(key, key)
    if key not in SOURCE_TYPE_IMPORTANCE:
        valid = ", ".join(SOURCE_TYPE_IMPORTANCE)
        raise InvalidInputError(f"unknown source type {value!r}; expected one of {valid}")
    return key


def check_importance(value: object, what: str = "importance") -> float:
    """An importance weight must be a finite number in (0, 1]: it multiplies every score."""
    try:
        x = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise InvalidInputError(f"{what} must be a number in (0, 1], got {value!r}") from None
    if not (0.0 < x <= 1.0):
        raise InvalidInputError(f"{what} must be in (0, 1], got {x}")
    return x


@dataclass(slots=True)
class ParsedDocument:
    """A document as parsed: its blocks in reading order and what it says about itself."""

    kind: str
    blocks: list[Block]
    title: str | None = None
    meta: dict[str, str] = field(default_factory=dict)
    # What the parser had to work around (bad charset, nesting cut off), for the ingest report.
    warnings: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class FactDraft:
    """A fact as the chunker produced it, before it has a row in a store."""

    id: str
    content: str
    section: str
    location: str
    is_code: bool
    tokens: int


@dataclass(frozen=True, slots=True)
class Fact:
    """A stored fact, read back for display or for an envelope."""

    row: int
    id: str
    content: str
    source: str
    location: str
    section: str
    importance: float
    is_code: bool
    tokens: int
    status: FactStatus
    doc_id: str
    created_at: str = ""
    updated_at: str = ""
