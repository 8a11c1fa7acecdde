"""A shard set read as one CKF: a fact that several shards hold appears once.

One CKF stores a fact once however many documents hold it (one row; its importance is the
best of its holders', its source the first of its live holders' by name, `cdr.ckf.txn`).
A shard set places whole documents, so two documents in different shards that share a
paragraph (a licence notice, a "see also" block, a repeated warning) give it a row in each
shard. Read naively, the set then has more facts than the one CKF: the same fact twice in a
candidate pool, a document frequency and a fact count that BM25 weighs differently, an
importance that depends on which shard answered. A manual of 23k facts has ~180 such rows.

The view fixes that when the index opens (and again on every new generation): among the rows
of one fact id across shards, the one that one CKF would keep (a live row before a stale
one, then the smallest source, then the first row) stays selectable, with the best
importance of them all; the others are hidden. Each shard gets its part (`ShardView`) with
every call, so Phase 1 and the ranking on the shards never see a hidden row. Everything
else (statistics, document support, navigation) reads `active` and `importance`, which the
view has already corrected.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from cdr.ckf.records import FactStatus


@dataclass(frozen=True)
class ShardView:
    """One shard's part of the view, by local row: rows to hide, rows whose importance is
    raised to another shard's (the best of the fact's holders)."""

    hidden: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    raised: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    importance: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))

    @property
    def empty(self) -> bool:
        return not len(self.hidden) and not len(self.raised)

    def digest(self) -> bytes:
        """What distinguishes two views (a shard's Phase 1 cache key)."""
        h = hashlib.sha256(np.asarray(self.hidden, np.int64).tobytes())
        h.update(np.asarray(self.raised, np.int64).tobytes())
        h.update(np.asarray(self.importance, np.float32).tobytes())
        return h.digest()[:16]

    def active(self, active: np.ndarray) -> np.ndarray:
        if not len(self.hidden):
            return active
        out = np.array(active, dtype=bool, copy=True)
        out[self.hidden] = False
        return out

    def raise_importance(self, importance: np.ndarray) -> np.ndarray:
        if not len(self.raised):
            return importance
        out = np.array(importance, dtype=np.float32, copy=True)
        out[self.raised] = self.importance
        return out


# (local rows, their fact ids as bytes) of one shard's selectable rows
ActiveIds = tuple[np.ndarray, np.ndarray]
# (status, source) of some local rows of one shard
Holders = Callable[[int, np.ndarray], list[tuple[int, str]]]


def shared_fact_views(active_ids: Sequence[ActiveIds], importance: Sequence[np.ndarray],
                      holders: Holders) -> list[ShardView]:
    """Each shard's part of the view. `holders(shard, local_rows)` is asked only for the rows
    of facts that more than one shard holds."""
    n = len(active_ids)
    if n < 2:
        return [ShardView() for _ in range(n)]
    shard = np.concatenate([np.full(len(r), i, np.int64) for i, (r, _) in enumerate(active_ids)])
    local = np.concatenate([np.asarray(r, np.int64) for r, _ in active_ids])
    ids = np.concatenate([np.asarray(x, dtype="S32") for _, x in active_ids])
    if not len(ids):
        return [ShardView() for _ in range(n)]
    _, inverse, counts = np.unique(ids, return_inverse=True, return_counts=True)
    shared = np.flatnonzero(counts[inverse] > 1)
    if not len(shared):
        return [ShardView() for _ in range(n)]
    info: dict[tuple[int, int], tuple[int, str]] = {}
    for s in np.unique(shard[shared]).tolist():
        rows = local[shared][shard[shared] == s]
        for r, h in zip(rows.tolist(), holders(s, rows), strict=True):
            info[(s, r)] = h
    hidden: list[list[int]] = [[] for _ in range(n)]
    raised: list[dict[int, float]] = [{} for _ in range(n)]
    groups: dict[int, list[int]] = {}
    for pos in shared.tolist():
        groups.setdefault(int(inverse[pos]), []).append(pos)
    for members in groups.values():
        def key(pos: int) -> tuple[bool, str, int, int]:
            status, source = info[(int(shard[pos]), int(local[pos]))]
            return (status != FactStatus.ACTIVE, source, int(shard[pos]), int(local[pos]))

        keep = min(members, key=key)
        best = max(float(importance[int(shard[p])][int(local[p])]) for p in members)
        ks, kl = int(shard[keep]), int(local[keep])
        if best != float(importance[ks][kl]):
            raised[ks][kl] = best
        for p in members:
            if p != keep:
                hidden[int(shard[p])].append(int(local[p]))
    return [ShardView(np.asarray(sorted(h), np.int64),
                      np.asarray(sorted(r), np.int64),
                      np.asarray([r[k] for k in sorted(r)], np.float32))
            for h, r in zip(hidden, raised, strict=True)]
