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

Written is detected from the fact's stored 6-gram hashes (`NgramIndex`), so it works where
only rows are known (the sidecar's stored envelope) and for any writer that keeps the facts'
wording; a paraphrasing writer's facts count as shown-unwritten (the milder weight).
The defaults are the benchmark's winners (bench/results/quality.md, "Fact memory").
"""

from __future__ import annotations

from collections.abc import Mapping
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
    """Per session: for each fact row sent so far, the last window it was shown in and the
    first window it was written in (0 = not written)."""

    shown: dict[int, int] = field(default_factory=dict)
    written: dict[int, int] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.shown)

    def weights(self, rows: np.ndarray, window: int,
                rule: MemoryRule = DEFAULT_MEMORY_RULE) -> np.ndarray:
        """The multiplier of each row (CKF rows of the candidates) at window `window`."""
        rows = np.asarray(rows, dtype=np.int64)
        out = np.ones(rows.shape[0], dtype=np.float64)
        if not self.shown:
            return out.astype(_F32)
        # One lookup of every candidate in the sorted shown rows (no per-candidate Python).
        keys = np.fromiter(self.shown.keys(), dtype=np.int64, count=len(self.shown))
        last = np.fromiter(self.shown.values(), dtype=np.int64, count=len(self.shown))
        order = np.argsort(keys)
        keys, last = keys[order], last[order]
        pos = np.minimum(np.searchsorted(keys, rows), keys.size - 1)
        seen = keys[pos] == rows
        age = np.maximum(window - last[pos] - 1, 0)
        out[seen] = 1.0 - (1.0 - rule.shown) * rule.recovery ** age[seen]
        if self.written:
            written = np.fromiter(self.written.keys(), dtype=np.int64, count=len(self.written))
            out[seen & np.isin(rows, written)] = rule.written
        return out.astype(_F32)

    def record(self, rows: np.ndarray, written: np.ndarray, window: int) -> None:
        """After window `window`: `rows` were in its envelope, `written` (bool, aligned) made
        it into its text."""
        rows = np.asarray(rows, dtype=np.int64)
        written = np.asarray(written, dtype=bool)
        if rows.shape != written.shape:
            raise InvalidInputError("written must be aligned with rows")
        for r, w in zip(rows.tolist(), written.tolist(), strict=True):
            self.shown[r] = window
            if w:
                self.written.setdefault(r, window)

    def to_dict(self) -> dict[str, Any]:
        return {"shown": [[r, w] for r, w in sorted(self.shown.items())],
                "written": [[r, w] for r, w in sorted(self.written.items())]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> FactMemory:
        if not data:
            return cls()
        try:
            return cls({int(r): int(w) for r, w in data["shown"]},
                       {int(r): int(w) for r, w in data["written"]})
        except (KeyError, TypeError, ValueError) as exc:
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
                 rule: MemoryRule = DEFAULT_MEMORY_RULE) -> Ranking:
    """The ranking with each fact's score times its memory weight, re-sorted (stable, so
    ties keep CDR's order); the weights ride along in `Ranking.memory`."""
    weights = memory.weights(ranking.indices, window, rule)
    ranking.memory = weights
    ranking.score = (ranking.score * weights).astype(_F32)
    return ranking.take(np.argsort(-ranking.score, kind="stable"))
