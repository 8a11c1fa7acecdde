"""Sharper sub-queries (`queries: "expanded"`, not in CRP-SPEC-024).

A section title ("Sleeping", "Introspection") is a weak query for a small embedding model: the
benchmark measured 43.5% of the facts CDR's plans place below the 0.30 attribution threshold to
their own section, and residual pull beating query relevance for only 12.1% of envelope facts.
So each sub-query is expanded once, when the session starts, from the CKF itself:

    expanded(q) = normalise(title(q) + mean of its `k` nearest facts in the session's pool)

where the pool is Phase 1's selection for the session's query (the facts the windows will
rank). The title keeps the expansion on its subject; its nearest facts add the vocabulary the
documents actually use for it. The expansion replaces the title's vector for residual pull, the
window plan and Stage 8 attribution; the Coverage Set keeps the titles' vectors (the spec's
coverage entries), and the session's query vector is unchanged.

It also widens Phase 1 (`widened_selection`): a fact passes the gate when it reaches it against
the query *or* against one sub-query's expansion. The composite query (topic + sub-query
centroid) sits between the sections, so a page's more specific sections can have no candidate
at all (the benchmark measured 90.6% of sections reachable on average, 23.1% on the worst
page); their expansions reach them. The facts keep their *query* relevance in the ranking
(so the relevance the trace and the benchmark report is the same measure as the spec's), and
their CDR score uses max(relevance, residual pull) as the spec's effective relevance does.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from cdr.errors import InvalidInputError
from cdr.vectors import normalize

EXPANSION_FACTS = 5
# Each expansion adds at most its best this-many facts past the gate to Phase 1: enough to
# reach a section the query misses, few enough not to crowd out the query's own candidates.
EXPANSION_WIDEN_LIMIT = 10


def expand_sub_queries(title_embeddings: np.ndarray, pool_embeddings: np.ndarray,
                       k: int = EXPANSION_FACTS) -> np.ndarray:
    """(Q, d) unit rows: each title plus the mean of its `k` nearest pool facts, normalised.

    With an empty pool (or k = 0) the titles come back unchanged."""
    titles = np.asarray(title_embeddings, dtype=np.float32)
    pool = np.asarray(pool_embeddings, dtype=np.float32)
    if titles.ndim != 2 or pool.ndim != 2 or (pool.size and pool.shape[1] != titles.shape[1]):
        raise InvalidInputError(
            f"expansion needs (Q, d) titles and (M, d) facts, got {titles.shape}, {pool.shape}")
    if k < 0:
        raise InvalidInputError(f"expansion facts must be ≥ 0, got {k}")
    if pool.shape[0] == 0 or k == 0:
        return titles.copy()
    k = min(k, pool.shape[0])
    sims = pool @ titles.T  # (M, Q)
    out = np.empty_like(titles)
    for j in range(titles.shape[0]):
        near = np.argpartition(-sims[:, j], k - 1)[:k]
        centre = pool[near].mean(axis=0)
        out[j] = normalize(titles[j] + centre, f"expanded sub-query {j + 1}")
    return out


def widened_selection(ckf: Any, query: np.ndarray, expanded: np.ndarray, gate: float,
                      limit: int, per_expansion: int = EXPANSION_WIDEN_LIMIT) -> Any:
    """Phase 1 over the union of the query's gate and each expansion's gate: the CKF's
    `Selection` type, best query relevance first (ties by row); at most `limit` rows from the
    query's gate and the best `per_expansion` from each expansion's. Relevances are cosines
    to the query, which may be below `gate`."""
    base = ckf.select(query, gate, limit)
    parts = [base.indices] + [ckf.select(v, gate, per_expansion).indices for v in expanded]
    rows = np.unique(np.concatenate(parts)).astype(np.int64)
    if rows.shape[0] == base.indices.shape[0]:
        return base
    emb = np.asarray(ckf.vectors(rows), dtype=np.float32)
    rel = (emb @ np.asarray(query, dtype=np.float32)).astype(np.float32)
    order = np.lexsort((rows, -rel))
    return type(base)(rows[order], rel[order], emb[order])
