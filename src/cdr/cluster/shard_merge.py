"""Merging the shards' ranked candidates into one index's ranking, in one round when provable.

A window ranked on S shards must equal `rank()` over `select()` of one index holding all the
rows (same rows, bit-identical scores — `cdr.ranking.row_dots` —, same order). Phase 1 keeps
the global top-`limit` by (relevance, row); a shard only knows its own rows, so it cannot tell
which of its candidates fall behind that global cut-off. Two rounds (cut-off first, then rank)
always work but pay the fan-out twice, which on loopback is most of the overhead.

One round instead: every shard ranks its own Phase 1 selection (its top-`limit`, a superset of
its part of the global one) and returns (a) its best `top_k` by the ranking key and (b) its
selection's (row, relevance) head, with a flag per head row for a 6-gram penalty. From the
heads the caller finds the global cut-off, drops the ranked candidates behind it and merges.
That is exact when, for every shard that did not return all its candidates, the merged
`top_k`-th key is no worse than the shard's last returned key: everything the shard kept back
ranks behind that key, so behind the merged `top_k`. A shard for which this does not hold is
asked again with the cut-off (`ShardServer.rank(..., cut=...)`), which ranks only rows ahead
of it — the old second round, now only for that shard and only when needed. Without a cut-off
(the shards' selections together fit the limit) the condition always holds.

The ranking key is (−score, −relevance, row): one index sorts by score, stably, over its
selection ordered by (−relevance, row).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from cdr.ranking import Ranking

_F32 = np.float32
# Rows of `ShardTop.parts`, in `Ranking`'s component order.
PARTS = ("score", "relevance", "novelty", "residual_pull", "ngram_penalty", "coverage_score")


@dataclass(frozen=True, slots=True)
class ShardTop:
    """One shard's best candidates by the ranking key, as a few flat arrays (Ray ships numpy
    arrays without pickling their contents; a list of objects per candidate costs more)."""

    rows: np.ndarray  # int64 (K,): global rows, best first
    parts: np.ndarray  # float32 (6, K): PARTS
    embeddings: np.ndarray  # float32 (K, d), or (K, 0) when the caller wants no vectors
    token_counts: np.ndarray  # int32 (K,)
    fact_ids: np.ndarray  # bytes (K,): the facts' ids (ASCII hex)
    n_ranked: int  # candidates this answer ranked (its selection, or those ahead of a cut)
    n_penalized: int  # of those, how many a 6-gram penalty hit
    # The shard's Phase 1 selection by (−relevance, row), for the global cut-off: sent only
    # in a first-round answer to a window with a Phase 1 limit (else empty).
    head_rows: np.ndarray  # int64 (L,)
    head_rel: np.ndarray  # float32 (L,)
    head_penalized: np.ndarray  # bool (L,): 6-gram penalty > 0

    @property
    def complete(self) -> bool:
        """Whether every ranked candidate came back (nothing held back to worry about)."""
        return len(self.rows) == self.n_ranked

    def last_key(self) -> tuple[float, float, int]:
        k = len(self.rows) - 1
        return (-float(self.parts[0, k]), -float(self.parts[1, k]), int(self.rows[k]))


Cut = tuple[float, int]
AskAgain = Callable[[list[int], Cut], list[ShardTop]]


def global_cut(tops: Sequence[ShardTop], limit: int | None) -> Cut | None:
    """The `limit`-th (relevance, row) of the shards' heads together, or None when they all
    fit (Phase 1's global selection is then every head row)."""
    if limit is None:
        return None
    rows = np.concatenate([t.head_rows for t in tops])
    if sum(t.n_ranked for t in tops) <= limit:
        return None
    rel = np.concatenate([t.head_rel for t in tops])
    k = np.lexsort((rows, -rel))[limit - 1]
    return float(rel[k]), int(rows[k])


def ahead(rel: np.ndarray, rows: np.ndarray, cut: Cut | None) -> np.ndarray:
    """bool mask: (relevance, row) pairs at or ahead of the cut-off (all when None)."""
    if cut is None:
        return np.ones(len(rows), bool)
    c_rel, c_row = _F32(cut[0]), int(cut[1])
    out: np.ndarray = (rel > c_rel) | ((rel == c_rel) & (rows <= c_row))
    return out


def merge_window(tops: list[ShardTop], limit: int | None, top_k: int | None, dim: int,
                 mode: str, ask_again: AskAgain
                 ) -> tuple[Ranking, np.ndarray, np.ndarray, list[str], list[int]]:
    """(ranking of the best `top_k`, their vectors, token counts, fact ids, shards asked a
    second time) from one round of `ShardTop`s (module doc)."""
    cut = global_cut(tops, limit)
    if cut is None:
        n_candidates = sum(t.n_ranked for t in tops)
        n_penalized = sum(t.n_penalized for t in tops)
    else:
        keeps = [ahead(t.head_rel, t.head_rows, cut) for t in tops]
        n_candidates = sum(int(k.sum()) for k in keeps)
        n_penalized = sum(int(t.head_penalized[k].sum()) for t, k in zip(tops, keeps,
                                                                         strict=True))
    kept = [ahead(t.parts[1], t.rows, cut) for t in tops]
    order, keys = _merge(tops, kept, top_k)
    again: list[int] = []
    if cut is not None and top_k:
        kth = keys[top_k - 1] if len(order) >= top_k else None
        again = [i for i, t in enumerate(tops)
                 if not t.complete and (kth is None or kth > t.last_key())]
    if again and cut is not None:  # (only a cut asks again)
        for i, t in zip(again, ask_again(again, cut), strict=True):
            tops[i] = t
            kept[i] = np.ones(len(t.rows), bool)
        order, _ = _merge(tops, kept, top_k)
    return (*_gather(tops, kept, order, dim, mode, n_candidates, n_penalized), again)


def _merge(tops: Sequence[ShardTop], kept: Sequence[np.ndarray], top_k: int | None
           ) -> tuple[np.ndarray, list[tuple[float, float, int]]]:
    """Positions (into the concatenation of the kept candidates) of the best `top_k`, and
    their keys."""
    rows = np.concatenate([t.rows[k] for t, k in zip(tops, kept, strict=True)])
    score = np.concatenate([t.parts[0][k] for t, k in zip(tops, kept, strict=True)])
    rel = np.concatenate([t.parts[1][k] for t, k in zip(tops, kept, strict=True)])
    order = np.lexsort((rows, -rel, -score))[:top_k]
    keys = list(zip((-score[order]).tolist(), (-rel[order]).tolist(), rows[order].tolist(),
                    strict=True))
    return order, keys


def _gather(tops: Sequence[ShardTop], kept: Sequence[np.ndarray], order: np.ndarray, dim: int,
            mode: str, n_candidates: int, n_penalized: int
            ) -> tuple[Ranking, np.ndarray, np.ndarray, list[str]]:
    def cat(get: Callable[[ShardTop], np.ndarray]) -> np.ndarray:
        out: np.ndarray = np.concatenate([get(t)[k] for t, k in zip(tops, kept,
                                                                     strict=True)])[order]
        return out

    rows = cat(lambda t: t.rows).astype(np.int64)
    parts = np.concatenate([t.parts[:, k] for t, k in zip(tops, kept, strict=True)],
                           axis=1)[:, order].astype(_F32, copy=False)
    score, relevance, novelty, residual_pull, ngram_penalty, coverage_score = parts
    ranking = Ranking(rows, score, relevance, novelty, residual_pull, ngram_penalty,
                      coverage_score, mode=mode, n_candidates=n_candidates,
                      ngram_activations=n_penalized, extra={})
    if any(len(t.rows) and not t.embeddings.size for t in tops):  # ranked without vectors
        emb = np.zeros((len(order), 0), _F32)
    else:
        emb = np.concatenate([t.embeddings.reshape(-1, dim)[k]
                              for t, k in zip(tops, kept, strict=True)])[order]
    ids = [i.decode("ascii") for i in cat(lambda t: t.fact_ids).tolist()]
    return ranking, emb, cat(lambda t: t.token_counts), ids
