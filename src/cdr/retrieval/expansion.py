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
their CDR score uses max(relevance, residual pull) as the spec's effective relevance does —
times (relevance / gate)² for the facts below the query's gate (`widened_weights`). Unweighted,
those facts' residual pull put them first from Window 2 on and cost the envelopes a sixth of
their relevance; weighted, they are spent after the task's own facts, while the wider pool still
keeps small pools from running dry (the benchmark's sweep: bench/results/quality.md).
`top_up` (each expansion adds only what its section lacks) and a `NeighbourScorer` (e.g. BM25
fused with the cosine) were measured and are off by default.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from cdr.errors import InvalidInputError
from cdr.vectors import normalize

EXPANSION_FACTS = 5
# Each expansion adds at most its best this-many facts past the gate to Phase 1: enough to
# reach a section the query misses, few enough not to crowd out the query's own candidates.
EXPANSION_WIDEN_LIMIT = 10
# Whether an expansion adds only what the query's selection lacks for its section (top-up).
EXPANSION_TOP_UP = False
# Facts widened in below the query's gate are scored × (relevance / gate)^this (0 = off).
# 2 is the quality benchmark's pick (bench/results/quality.md, "Beyond the spec"): unweighted,
# widened facts took 0.38 mean relevance into Window 2; × (rel/gate)² they come after the
# task's own facts unless their section has nothing nearer.
EXPANSION_WIDENED_POWER = 2.0

# (sub-query texts, pool fact texts, dense cosines (M, Q)) -> scores (M, Q), higher = nearer.
NeighbourScorer = Callable[[Sequence[str], Sequence[str], np.ndarray], np.ndarray]


def expand_sub_queries(title_embeddings: np.ndarray, pool_embeddings: np.ndarray,
                       k: int = EXPANSION_FACTS, near: np.ndarray | None = None) -> np.ndarray:
    """(Q, d) unit rows: each title plus the mean of its `k` nearest pool facts, normalised.

    "Nearest" is by cosine to the title, or by `near` (M, Q) when given (another measure of
    closeness, e.g. cosine fused with BM25). With an empty pool (or k = 0) the titles come
    back unchanged."""
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
    sims = pool @ titles.T if near is None else np.asarray(near, dtype=np.float64)  # (M, Q)
    want = (pool.shape[0], titles.shape[0])
    if sims.shape != want:
        raise InvalidInputError(f"neighbour scores have shape {sims.shape}, expected {want}")
    out = np.empty_like(titles)
    for j in range(titles.shape[0]):
        near = np.argpartition(-sims[:, j], k - 1)[:k]
        centre = pool[near].mean(axis=0)
        out[j] = normalize(titles[j] + centre, f"expanded sub-query {j + 1}")
    return out


def widened_selection(index: Any, query: np.ndarray, expanded: np.ndarray, gate: float,
                      limit: int, per_expansion: int = EXPANSION_WIDEN_LIMIT,
                      top_up: bool = EXPANSION_TOP_UP) -> Any:
    """Phase 1 over the union of the query's gate and each expansion's gate: the CKF's
    `Selection` type, best query relevance first (ties by row); at most `limit` rows from the
    query's gate and up to `per_expansion` from each expansion's. Relevances are cosines
    to the query, which may be below `gate`.

    With `top_up` an expansion adds only what its section lacks: if `n` facts of the query's
    own selection already reach the gate against the expansion, it adds its best
    `per_expansion − n` facts not yet selected (none when n ≥ per_expansion). Without it each
    expansion adds its best `per_expansion` outright."""
    base = index.select(query, gate, limit)
    parts = [base.indices]
    base_emb = np.asarray(base.embeddings, dtype=np.float32)
    for v in np.asarray(expanded, dtype=np.float32):
        want = per_expansion
        if top_up:
            have = int(np.count_nonzero(base_emb @ v >= gate)) if base_emb.size else 0
            want = per_expansion - have
        if want <= 0:
            continue
        # `want` facts new to the selection: the expansion's best `want + have` include them.
        own = index.select(v, gate, per_expansion).indices
        parts.append(own[~np.isin(own, base.indices)][:want])
    rows = np.unique(np.concatenate(parts)).astype(np.int64)
    if rows.shape[0] == base.indices.shape[0]:
        return base
    emb = np.asarray(index.vectors(rows), dtype=np.float32)
    rel = (emb @ np.asarray(query, dtype=np.float32)).astype(np.float32)
    order = np.lexsort((rows, -rel))
    return type(base)(rows[order], rel[order], emb[order])


def widened_weights(relevance: np.ndarray, gate: float, power: float = 1.0) -> np.ndarray:
    """Score multipliers for a widened pool: a fact below the query's gate (it came in
    through an expansion) is weighted by how close it got, `(relevance / gate)^power`
    (the ratio clipped to [0, 1]); facts past the gate keep 1. Makes a section's off-query
    facts a later resort than facts nearer the task. power 0 weighs nothing."""
    rel = np.asarray(relevance, dtype=np.float64)
    if not np.isfinite(power) or power < 0:
        raise InvalidInputError(f"widened weight power must be ≥ 0, got {power}")
    if gate <= 0 or power == 0:
        return np.ones(rel.shape[0], dtype=np.float32)
    return (np.clip(rel / gate, 0.0, 1.0) ** power).astype(np.float32)
