"""Fact memory (`memory: "facts"`, not in CRP-SPEC-024): facts already sent lose score.

The spec's Coverage Set holds sub-query embeddings, so its novelty is per *topic*: every
on-topic candidate is about as close to the covered topics' centroid as any other, and a fact
that sat in an earlier envelope but was not written keeps its rank and is sent again (the
quality benchmark measured 84.9% of CDR's Window-5 envelope re-sent). The n-gram guard only
sees text that was written, and only verbatim.

The rule, per candidate fact at window w (a multiplier on its CDR score, `Ranking.memory`):

- never shown: 1;
- written in an earlier window (≥ `written_share` of its distinct 6-grams appear in that
  window's text): `written` — the reader has it; sending it again only invites repetition;
- shown but not written, last shown in window s: `1 − (1 − shown) · recovery^(w − s − 1)` —
  the writer passed it over (its section was not planned yet, or the window was full), so it
  is set aside, and with `recovery` < 1 it drifts back as the windows go on, to be used once
  its section comes up.

Memory is keyed by fact id, not CKF row: a compaction (`cdr ckf compact`) renumbers rows under a
running session, and a row-keyed memory would then weigh other facts.

Written is detected from the fact's stored 6-gram hashes (`NgramIndex`), so it works where
only rows are known (the sidecar's stored envelope) and for any writer that keeps the facts'
wording; a paraphrasing writer's facts count as shown-unwritten (the milder weight).
The defaults are the benchmark's winners (bench/results/quality.md, "Fact memory").
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cdr.errors import InvalidInputError
from cdr.ngrams import NgramIndex, ngram_hashes
from cdr.ranking import Ranking

_F32 = np.float32


@dataclass(frozen=True)
class MemoryRule:
    """The weights of the rule above; each within [0, 1]."""

    shown: float = 0.2
    written: float = 0.05
    recovery: float = 1.0
    written_share: float = 0.5

    def __post_init__(self) -> None:
        for name in ("shown", "written", "recovery", "written_share"):
            v = float(getattr(self, name))
            if not np.isfinite(v) or not 0.0 <= v <= 1.0:
                raise InvalidInputError(f"memory rule {name} must be within [0, 1], got {v!r}")


DEFAULT_MEMORY_RULE = MemoryRule()


@dataclass
class FactMemory:
    """Per session: for each fact sent so far (by fact id, which compaction and re-ingest
    keep, unlike CKF rows), the last window it was shown in and the first window it was
    written in (0 = not written).

    `legacy_rows` holds memory stored by an earlier version keyed by CKF row; the loop turns
    it into fact ids (`migrate`) against the CKF it next ranks on — right if the CKF was not
    compacted since it was stored, which is all a row ever meant."""

    shown: dict[str, int] = field(default_factory=dict)
    written: dict[str, int] = field(default_factory=dict)
    legacy_rows: dict[str, dict[int, int]] | None = None

    def __len__(self) -> int:
        return len(self.shown) + (len(self.legacy_rows["shown"]) if self.legacy_rows else 0)

    def migrate(self, fact_ids: Callable[[np.ndarray], Sequence[str]]) -> None:
        """Row-keyed memory (stored before fact ids) to fact ids, with `fact_ids(rows)` of the
        current CKF; a no-op once done or when there is none."""
        if not self.legacy_rows:
            self.legacy_rows = None
            return
        for name in ("shown", "written"):
            old = self.legacy_rows[name]
            rows = np.fromiter(old.keys(), dtype=np.int64, count=len(old))
            ids = fact_ids(rows) if rows.size else []
            target = getattr(self, name)
            for fid, w in zip(ids, old.values(), strict=True):
                target.setdefault(fid, w)
        self.legacy_rows = None

    def weights(self, ids: Sequence[str], window: int,
                rule: MemoryRule = DEFAULT_MEMORY_RULE) -> np.ndarray:
        """The multiplier of each candidate (its fact id) at window `window`."""
        if self.legacy_rows:
            raise InvalidInputError("row-keyed fact memory must be migrated to fact ids first")
        out = np.ones(len(ids), dtype=np.float64)
        if not self.shown:
            return out.astype(_F32)
        # One dict lookup per candidate; the weights themselves are one vector operation.
        last = np.fromiter((self.shown.get(f, 0) for f in ids), dtype=np.int64, count=len(ids))
        seen = last > 0
        age = np.maximum(window - last - 1, 0)
        out[seen] = 1.0 - (1.0 - rule.shown) * rule.recovery ** age[seen]
        if self.written:
            was = np.fromiter((f in self.written for f in ids), dtype=bool, count=len(ids))
            out[seen & was] = rule.written
        return out.astype(_F32)

    def record(self, ids: Sequence[str], written: np.ndarray, window: int) -> None:
        """After window `window`: the facts `ids` were in its envelope, `written` (bool,
        aligned) made it into its text."""
        written = np.asarray(written, dtype=bool)
        if written.shape != (len(ids),):
            raise InvalidInputError("written must be aligned with the fact ids")
        if window < 1:
            raise InvalidInputError(f"window numbers start at 1, got {window}")
        for f, w in zip(ids, written.tolist(), strict=True):
            self.shown[str(f)] = window
            if w:
                self.written.setdefault(str(f), window)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"key": "fact_id",
                               "shown": [[f, w] for f, w in sorted(self.shown.items())],
                               "written": [[f, w] for f, w in sorted(self.written.items())]}
        if self.legacy_rows:  # not migrated yet (stored and loaded without a window between)
            out["legacy_rows"] = {k: [[r, w] for r, w in sorted(v.items())]
                                  for k, v in self.legacy_rows.items()}
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> FactMemory:
        """Stored memory: keyed by fact id (`"key": "fact_id"`), or the first version's rows
        (no `key`: kept in `legacy_rows` until `migrate`)."""
        if not data:
            return cls()
        try:
            if data.get("key") == "fact_id":
                legacy = data.get("legacy_rows")
                return cls({str(f): int(w) for f, w in data["shown"]},
                           {str(f): int(w) for f, w in data["written"]},
                           {k: {int(r): int(w) for r, w in legacy[k]}
                            for k in ("shown", "written")} if legacy else None)
            return cls(legacy_rows={k: {int(r): int(w) for r, w in data[k]}
                                    for k in ("shown", "written")})
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise InvalidInputError(f"stored fact memory is damaged: {exc!r}") from None


def written_rows(rows: np.ndarray, text: str, index: NgramIndex | None,
                 share: float = DEFAULT_MEMORY_RULE.written_share) -> np.ndarray:
    """Which of `rows` the text wrote: at least `share` of the fact's distinct 6-grams occur
    in it. Facts shorter than one 6-gram, or rows the index does not know, count as unwritten."""
    rows = np.asarray(rows, dtype=np.int64)
    out = np.zeros(rows.shape[0], dtype=bool)
    if index is None or not rows.size or not text.strip():
        return out
    seen = np.unique(ngram_hashes(text))
    if not seen.size:
        return out
    for i, r in enumerate(rows.tolist()):
        if not 0 <= r < index.n_facts:
            continue
        h = index.hashes[index.offsets[r]:index.offsets[r + 1]]
        if h.size and np.isin(h, seen).mean() >= share:
            out[i] = True
    return out


def apply_memory(ranking: Ranking, memory: FactMemory, window: int,
                 fact_ids: Callable[[np.ndarray], Sequence[str]],
                 rule: MemoryRule = DEFAULT_MEMORY_RULE) -> Ranking:
    """The ranking with each fact's score times its memory weight, re-sorted (stable, so
    ties keep CDR's order); the weights ride along in `Ranking.memory`. `fact_ids(rows)` is
    the CKF's row → fact id lookup (row-keyed memory is migrated with it first)."""
    memory.migrate(fact_ids)
    weights = memory.weights(fact_ids(ranking.indices) if memory.shown else
                             [""] * len(ranking.indices), window, rule)
    ranking.memory = weights
    ranking.score = (ranking.score * weights).astype(_F32)
    return ranking.take(np.argsort(-ranking.score, kind="stable"))
