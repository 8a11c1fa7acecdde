"""Phase 2 ranking: CDR (CRP-SPEC-024 §2, §5.2, §7.1) and the two baselines it is compared with.

All three modes share Phase 1's minimum-relevance gate (§2.6) and work on arrays:

- ``cdr``: importance × max(relevance, residual_pull) × novelty × (1 − ngram_penalty)
- ``relevance``: importance × relevance (SPEC-003 Phase 2, what CDR replaces)
- ``mmr``: greedy maximal marginal relevance, λ·(importance × relevance) − (1−λ)·max sim to
  the facts already picked in this window (no memory across windows, as MMR is used).
- ``sections``: per-section retrieval, what outline-driven writers (STORM-like) do: each
  section the window plans queries with its own text, relevance only, no memory across
  windows; the sections' lists are merged in turns so every planned section gets its best facts.

The CDR terms for M gated candidates cost the (M, d) candidate block's product with the
centroid and each row's largest product with ``r₁ … r_R`` (`cdr.retrieval.max_dots`: a BLAS estimate
picks the few products computed exactly); the gate itself costs the one (N, d) mat-vec a plain
cosine scan pays.

Every per-fact product here is *row-independent* (`row_dots`): a fact's relevance, coverage
and pull are computed from its own row alone, never by a BLAS product whose rounding depends
on which other rows share the matrix. So a fact's score is bit-identical whether one CKF or
any shard of a shard set ranks it, and near-tied facts keep one order.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, cast, get_args

import numpy as np

from cdr.coverage import CoverageSet, ResidualSet, weighted_centroid
from cdr.errors import InvalidInputError
from cdr.ngrams import ngram_penalty as _ngram_penalty
from cdr.retrieval.max_dots import max_row_dots
from cdr.retrieval.row_products import row_products
from cdr.vectors import (
    as_fact_matrix,
    as_matrix,
    check_gated_rows,
    check_query,
    check_relevance,
)

CDR_MIN_RELEVANCE = 0.55
MIN_NOVELTY_FLOOR = 0.20
COVERAGE_PENALTY_CAP = 0.80
DEFAULT_MMR_LAMBDA = 0.5

# The one spelling of the modes: the gateway's request schema uses the Literal, the CLI, the
# session and the trace schema the tuple.
RankingMode = Literal["cdr", "relevance", "mmr", "sections"]
RANKING_MODES: tuple[str, ...] = get_args(RankingMode)
DEFAULT_RANKING = "cdr"

_F32 = np.float32
# The per-candidate float arrays of a `Ranking`, in its field order (and its stored form's).
RANKING_ARRAYS = ("score", "relevance", "novelty", "residual_pull", "ngram_penalty",
                  "coverage_score")


@dataclass
class Ranking:
    """Ranked candidates, best first. `indices` point into the arrays given to `rank` (or are
    the caller's row ids when `rows` was passed). Per-candidate arrays are aligned with it."""

    indices: np.ndarray
    score: np.ndarray
    relevance: np.ndarray
    novelty: np.ndarray
    residual_pull: np.ndarray
    ngram_penalty: np.ndarray
    coverage_score: np.ndarray
    mode: str = "cdr"
    n_candidates: int = 0
    ngram_activations: int = 0
    extra: dict[str, float] = field(default_factory=dict)
    # Fact memory's multiplier per candidate (`cdr.fact_memory`, an opt-in session option, not the
    # spec); None when the session runs without it.
    memory: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.indices)

    def novelty_ratio(self) -> np.ndarray:
        """Score over base score, `novelty × (1 − ngram_penalty)` (docs/design.md §3.7 "Novelty
        ratio"), times the fact-memory weight when the session remembers facts (so Exit 3 sees
        stale envelopes)."""
        ratio = self.novelty * (1.0 - self.ngram_penalty)
        if self.memory is not None:
            ratio = ratio * self.memory
        return ratio.astype(_F32)

    def take(self, positions: np.ndarray) -> Ranking:
        """The sub-ranking at `positions` (e.g. what the envelope packed), order kept.

        `n_candidates` and `ngram_activations` describe the ranking pass, so they are kept.
        """
        p = np.asarray(positions, dtype=np.int64)
        return Ranking(
            self.indices[p], self.score[p], self.relevance[p], self.novelty[p],
            self.residual_pull[p], self.ngram_penalty[p], self.coverage_score[p], self.mode,
            self.n_candidates, self.ngram_activations, dict(self.extra),
            None if self.memory is None else self.memory[p],
        )

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able copy; float32 values survive the round trip through Python floats."""
        return {
            "indices": [int(x) for x in self.indices],
            **{k: np.asarray(getattr(self, k), dtype=_F32).tolist() for k in RANKING_ARRAYS},
            "mode": self.mode,
            "n_candidates": int(self.n_candidates),
            "ngram_activations": int(self.ngram_activations),
            "extra": {k: float(v) for k, v in self.extra.items()},
            **({} if self.memory is None
               else {"memory": np.asarray(self.memory, dtype=_F32).tolist()}),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Ranking:
        """The `Ranking` `to_dict` saw (KeyError/TypeError/ValueError on a damaged copy)."""
        score, relevance, novelty, residual_pull, ngram_penalty, coverage_score = (
            np.asarray(data[k], dtype=_F32) for k in RANKING_ARRAYS)
        return cls(
            np.asarray(data["indices"], dtype=np.int64),
            score, relevance, novelty, residual_pull, ngram_penalty, coverage_score,
            mode=data["mode"], n_candidates=int(data["n_candidates"]),
            ngram_activations=int(data["ngram_activations"]), extra=dict(data["extra"]),
            memory=np.asarray(data["memory"], dtype=_F32) if "memory" in data else None,
        )


def row_dots(rows: np.ndarray, vectors: np.ndarray) -> np.ndarray:
    """(M, K): `rows[i] · vectors[k]`, each from row i alone, in the inputs' float type.

    einsum (numpy's own per-row sum of products), not BLAS: BLAS kernels take rows in blocks
    and pick kernels by matrix size, so a row's last bit depends on how many rows the matrix
    has and where the row sits — one CKF and the shard holding a fact disagreed, and
    near-tied facts swapped order. einsum's result for a row depends on that row and the
    vectors only (tests/test_ranking.py checks it over random sub-matrices). Large inputs are
    cut into fixed row blocks run on all cores (`cdr.retrieval.row_products`), which changes no
    value."""
    r = np.asarray(rows)
    return row_products(r, np.asarray(vectors, dtype=r.dtype))


def novelty_from_coverage(coverage_score: np.ndarray) -> np.ndarray:
    """max(1 − clip(coverage, 0, 0.80), 0.20): anti-correlation is not rewarded
    (docs/design.md §3.3)."""
    penalty = np.clip(coverage_score, 0.0, COVERAGE_PENALTY_CAP)
    out: np.ndarray = np.maximum(1.0 - penalty, MIN_NOVELTY_FLOOR).astype(coverage_score.dtype,
                                                                          copy=False)
    return out


def cdr_components(
    embeddings: np.ndarray,
    relevance: np.ndarray,
    importance: np.ndarray,
    ngram_counts: np.ndarray | None,
    centroid: np.ndarray | None,
    residual: np.ndarray,
    coverage_nonempty: bool,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(score, novelty, residual_pull, ngram_penalty, coverage_score) for gated candidates.

    `centroid` is the Coverage Set's weighted centroid (None when its weight is 0); `residual`
    the (R, d) unit embeddings of the Residual Set. Residual pull applies only once the Coverage
    Set has entries (docs/design.md §3.2), so Window 1 is exactly importance × relevance (§2.7).
    Results keep the inputs' float type (float32 in the core, float64 in `cdr.spec`).
    """
    m = embeddings.shape[0]
    dt = embeddings.dtype
    use_pull = coverage_nonempty and residual.shape[0] > 0 and m > 0
    # Coverage is needed exactly for every row (novelty is continuous in it); of the residual
    # products only each row's largest is used, which `max_row_dots` finds exactly without
    # computing all R of them exactly. Both are einsum's bits, row by row.
    coverage = (row_dots(embeddings, np.asarray(centroid, dtype=dt)) if centroid is not None
                else np.zeros(m, dtype=dt))
    pull = (max_row_dots(embeddings, np.asarray(residual, dtype=dt)) if use_pull
            else np.zeros(m, dtype=dt))
    novelty = novelty_from_coverage(coverage)
    penalty = (
        _ngram_penalty(ngram_counts, dt) if ngram_counts is not None else np.zeros(m, dtype=dt)
    )
    score = importance.astype(dt, copy=False) * np.maximum(relevance, pull) * novelty
    score *= 1.0 - penalty
    return score.astype(dt, copy=False), novelty, pull.astype(dt, copy=False), penalty, coverage


def _mmr_order(
    embeddings: np.ndarray, base: np.ndarray, lam: float, limit: int
) -> tuple[np.ndarray, np.ndarray]:
    """Greedy MMR over the candidates: (order of the first `limit` picks, their MMR scores)."""
    m = embeddings.shape[0]
    limit = min(limit, m)
    # Redundancy starts at 0 and only grows: a fact dissimilar to everything picked is not
    # penalised, nor rewarded for anti-correlation, so the objectives picked never increase.
    max_sim = np.zeros(m, dtype=_F32)
    taken = np.zeros(m, dtype=bool)
    order = np.empty(limit, dtype=np.int64)
    scores = np.empty(limit, dtype=_F32)
    for i in range(limit):
        obj = _F32(lam) * base - _F32(1.0 - lam) * max_sim
        obj[taken] = -np.inf
        j = int(np.argmax(obj))
        order[i], scores[i], taken[j] = j, obj[j], True
        np.maximum(max_sim, row_dots(embeddings, embeddings[j]), out=max_sim)
    return order, scores


def sections_order(
    section_sims: np.ndarray, importance: np.ndarray, min_relevance: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-section lists merged in turns: (order, score, relevance) of the candidates placed.

    `section_sims` is (m, S): each candidate's cosine to each planned section. Section s ranks
    the candidates that pass the gate for it by importance × cosine; the merge takes each
    section's 1st fact, then each one's 2nd, … (sections in plan order), and a fact an earlier
    turn already placed is not placed again. So a fact sits at its best position over the
    sections: (min over s of its rank in s, then the first such s). Its score and relevance are
    those of the section that placed it. Candidates no section gates in are dropped.
    """
    sims = np.asarray(section_sims, dtype=_F32)
    m, s = sims.shape
    if m == 0 or s == 0:
        empty = np.zeros(0, dtype=_F32)
        return np.zeros(0, dtype=np.int64), empty, empty
    imp = np.asarray(importance, dtype=_F32).reshape(m, 1)
    passes = sims >= _F32(min_relevance)
    scores = np.where(passes, imp * sims, -np.inf).astype(_F32)
    # rank_in[c, j]: c's position in section j's list (ties by candidate position).
    rank_in = np.full((m, s), np.iinfo(np.int64).max, dtype=np.int64)
    for j in range(s):
        order_j = np.lexsort((np.arange(m), -scores[:, j]))
        rank_in[order_j, j] = np.arange(m)
    rank_in[~passes] = np.iinfo(np.int64).max
    best_rank = rank_in.min(axis=1)
    best_sec = rank_in.argmin(axis=1)
    keep = np.flatnonzero(passes.any(axis=1))
    order = keep[np.lexsort((best_sec[keep], best_rank[keep]))]
    picked = best_sec[order]
    return order.astype(np.int64), scores[order, picked], sims[order, picked]


def _top(score: np.ndarray, top_k: int | None) -> np.ndarray:
    """Positions of the best `top_k` scores, best first (ties: lower position first)."""
    n = score.shape[0]
    if top_k is None or top_k >= n:
        return np.argsort(-score, kind="stable")
    # Keep every score tied with the k-th best: which of them make the cut is decided by
    # position, not by where a partition happened to put them (a sharded ranking, which
    # merges by the same rule, found the difference).
    kth = np.partition(-score, top_k - 1)[top_k - 1]
    part = np.flatnonzero(-score <= kth)
    return part[np.lexsort((part, -score[part]))][:top_k]


def check_mode(mode: str) -> str:
    """`mode` if it is a ranking mode, else a clear error naming the choices."""
    if mode not in RANKING_MODES:
        raise InvalidInputError(f"unknown ranking mode {mode!r}; choose one of {RANKING_MODES}")
    return mode


# The per-candidate terms of a one-pass mode: (embeddings, relevance, importance, n-gram counts
# or None, coverage centroid or None, residual embeddings, coverage non-empty) ->
# (score, novelty, residual_pull, ngram_penalty, coverage_score).
ScoreTerms = Callable[
    [np.ndarray, np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None, np.ndarray, bool],
    tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]]


def _relevance_terms(
    embeddings: np.ndarray, relevance: np.ndarray, importance: np.ndarray,
    ngram_counts: np.ndarray | None, centroid: np.ndarray | None, residual: np.ndarray,
    coverage_nonempty: bool,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """SPEC-003 Phase 2: importance × relevance, no coverage terms."""
    zeros = np.zeros(relevance.shape[0], dtype=relevance.dtype)
    return importance * relevance, zeros + 1, zeros, zeros, zeros


@dataclass(frozen=True)
class ModeRule:
    """How one ranking mode scores. A one-pass mode has `terms`: each candidate's score comes
    from its own row, so one index and every shard of a shard set rank with the same function
    (`cdr.cluster.shard_server`) and the shards' lists merge exactly. A sequential mode (mmr
    picks against what it already picked; sections merges per-section lists) has none and is
    ranked only where all candidates are (`rank`). `uses_ngrams`: the terms read the n-gram
    counts (a shard counts them only then)."""

    terms: ScoreTerms | None
    uses_ngrams: bool = False


# The one dispatch table of the ranking modes (its keys are `RANKING_MODES`).
MODE_RULES: dict[str, ModeRule] = {
    "cdr": ModeRule(cdr_components, uses_ngrams=True),
    "relevance": ModeRule(_relevance_terms),
    "mmr": ModeRule(None),
    "sections": ModeRule(None),
}
# The modes a shard (or any index that ranks its own rows) can rank in one pass.
ONE_PASS_MODES: tuple[str, ...] = tuple(m for m, r in MODE_RULES.items() if r.terms is not None)


def score_terms(
    mode: str, embeddings: np.ndarray, relevance: np.ndarray, importance: np.ndarray,
    ngram_counts: np.ndarray | None, centroid: np.ndarray | None, residual: np.ndarray,
    coverage_nonempty: bool,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(score, novelty, residual_pull, ngram_penalty, coverage_score) of gated candidates under
    the one-pass `mode`; a sequential or unknown mode is refused by name."""
    rule = MODE_RULES.get(check_mode(mode))
    if rule is None or rule.terms is None:
        raise InvalidInputError(
            f"ranking mode {mode!r} is not one-pass; one-pass modes: {ONE_PASS_MODES}")
    return rule.terms(embeddings, relevance, importance, ngram_counts, centroid, residual,
                      coverage_nonempty)


def rank(
    embeddings: np.ndarray,
    relevance: np.ndarray,
    *,
    importance: np.ndarray | None = None,
    ngram_counts: np.ndarray | None = None,
    coverage: CoverageSet | None = None,
    residual: ResidualSet | None = None,
    mode: str = "cdr",
    min_relevance: float = CDR_MIN_RELEVANCE,
    mmr_lambda: float = DEFAULT_MMR_LAMBDA,
    top_k: int | None = None,
    rows: np.ndarray | None = None,
    sections: np.ndarray | None = None,
) -> Ranking:
    """Phase 2 over candidates whose unit embeddings and query relevances are given.

    The gate is applied here too, so callers may pass Phase 1's output or a raw block. `rows`
    maps candidate positions to the caller's ids (e.g. CKF rows) in the returned `indices`.
    Mode ``sections`` needs `sections`, the (S, d) unit embeddings of the planned sections: its
    gate and relevances are per section (`relevance`, the task query's, is not used).
    """
    check_mode(mode)
    if mode == "sections":
        return _rank_sections(embeddings, relevance, importance, sections, min_relevance,
                              top_k, rows)
    rel = np.asarray(relevance, dtype=_F32)
    if rel.ndim != 1 or rel.shape[0] != embeddings.shape[0]:
        raise InvalidInputError(
            f"relevance has shape {rel.shape}, expected ({embeddings.shape[0]},)"
        )
    gate = np.flatnonzero(rel >= _F32(min_relevance))
    all_pass = gate.shape[0] == rel.shape[0]
    emb = embeddings if all_pass else embeddings[gate]
    rel = rel if all_pass else rel[gate]
    imp = (
        np.ones(len(gate), dtype=_F32)
        if importance is None
        else np.asarray(importance, dtype=_F32)[gate]
    )
    counts = None if ngram_counts is None else np.asarray(ngram_counts)[gate]
    m = len(gate)
    zeros = np.zeros(m, dtype=_F32)
    extra: dict[str, float] = {}
    if MODE_RULES[mode].terms is not None:
        centroid = coverage.centroid() if coverage is not None else None
        res = residual.embeddings if residual is not None else np.zeros((0, emb.shape[1]), _F32)
        score, novelty, pull, penalty, cov = score_terms(
            mode, emb, rel, imp, counts, centroid, res, bool(coverage))
        order = _top(score, top_k)
    else:  # mmr (sections was ranked above)
        if not 0.0 <= mmr_lambda <= 1.0:
            raise InvalidInputError(f"mmr_lambda must be within [0, 1], got {mmr_lambda}")
        base = imp * rel
        limit = m if top_k is None else min(top_k, m)
        order, mmr_scores = _mmr_order(emb, base, mmr_lambda, limit)
        score = np.full(m, -np.inf, dtype=_F32)
        score[order] = mmr_scores
        novelty, pull, penalty, cov = zeros + 1, zeros, zeros, zeros
        extra["mmr_lambda"] = float(mmr_lambda)
    ids = gate[order] if rows is None else np.asarray(rows)[gate[order]]
    pen = penalty[order]
    return Ranking(
        ids, score[order], rel[order], novelty[order], pull[order], pen, cov[order], mode,
        m, int((penalty > 0).sum()), extra,
    )


def _rank_sections(
    embeddings: np.ndarray, relevance: np.ndarray, importance: np.ndarray | None,
    sections: np.ndarray | None, min_relevance: float, top_k: int | None,
    rows: np.ndarray | None,
) -> Ranking:
    """`rank` for mode ``sections`` (see `sections_order`)."""
    m = embeddings.shape[0]
    if np.asarray(relevance).shape != (m,):
        raise InvalidInputError(
            f"relevance has shape {np.asarray(relevance).shape}, expected ({m},)")
    if sections is None:
        raise InvalidInputError("ranking mode 'sections' needs the planned sections' embeddings")
    sec = np.asarray(sections, dtype=_F32)
    if sec.ndim != 2 or (m and sec.shape[1] != embeddings.shape[1]):
        raise InvalidInputError(
            f"sections has shape {sec.shape}, expected (S, {embeddings.shape[1]})")
    imp = np.ones(m, dtype=_F32) if importance is None else np.asarray(importance, dtype=_F32)
    sims = row_dots(np.asarray(embeddings, dtype=_F32), sec) if m else np.zeros((0, len(sec)),
                                                                               _F32)
    order, score, rel = sections_order(sims, imp, min_relevance)
    if top_k is not None:
        order, score, rel = order[:top_k], score[:top_k], rel[:top_k]
    n = len(order)
    zeros = np.zeros(n, dtype=_F32)
    ids = order if rows is None else np.asarray(rows)[order]
    n_gated = int((sims >= _F32(min_relevance)).any(axis=1).sum()) if m else 0
    return Ranking(ids, score, rel, zeros + 1, zeros, zeros, zeros, "sections", n_gated, 0,
                   {"sections": float(len(sec))})


def rank_all(
    facts: np.ndarray,
    query: np.ndarray,
    **kwargs: object,
) -> Ranking:
    """Phase 1 + Phase 2 over a whole unit-row matrix: one mat-vec for relevance, then `rank`
    on the gated rows only (indices are rows of `facts`).

    Validation rides on that mat-vec (`cdr.vectors.check_relevance`): a NaN/inf row anywhere
    is refused, and rows passing the gate must be unit rows; a float32 matrix (or memory map)
    is used as it is, never copied or converted."""
    f = as_fact_matrix(facts, "facts")
    q = check_query(query, f.shape[1])
    with np.errstate(invalid="ignore", over="ignore"):  # bad rows are refused just below
        relevance = row_dots(f, q)
    check_relevance(relevance, f, q, "facts")
    min_rel = float(kwargs.get("min_relevance", CDR_MIN_RELEVANCE))  # type: ignore[arg-type]
    gate = np.flatnonzero(relevance >= _F32(min_rel))
    importance = cast("np.ndarray | None", kwargs.pop("importance", None))
    counts = cast("np.ndarray | None", kwargs.pop("ngram_counts", None))
    if gate.shape[0] == f.shape[0]:  # everything passes (e.g. Phase 1 output): no copy
        block, rel = f, relevance
    else:  # np.take gathers the gated rows a little faster than fancy indexing
        block, rel = np.take(f, gate, axis=0), relevance[gate]
        importance = None if importance is None else np.asarray(importance)[gate]
        counts = None if counts is None else np.asarray(counts)[gate]
    check_gated_rows(block, gate, "facts")
    return rank(block, rel, importance=importance, ngram_counts=counts, rows=gate,
                **kwargs)  # type: ignore[arg-type]


def cdr_scores(
    facts: np.ndarray,
    query: np.ndarray,
    coverage: np.ndarray,
    coverage_weights: np.ndarray,
    residual: np.ndarray,
    importance: np.ndarray | None,
    ngram_counts: np.ndarray | None,
    min_relevance: float = CDR_MIN_RELEVANCE,
) -> np.ndarray:
    """The array face of the core (docs/design.md §4 "Contracts other code relies on"): CDR
    score per fact, NaN where gated.

    `facts` (N, d), `query` (d,), `coverage` (C, d), `residual` (R, d) are unit rows (validated
    here, not re-normalised); C or R may be 0. The fact matrix is validated at scan speed
    (`cdr.vectors`, "validation at scan speed"): NaN/inf rows are refused wherever they are,
    zero or non-unit rows when they pass the gate; a zero row below the gate scores NaN.
    """
    f = as_fact_matrix(facts, "facts", allow_empty=False)
    d = f.shape[1]
    q = check_query(query, d)
    cov = as_matrix(coverage, "coverage", d)
    w = np.asarray(coverage_weights, dtype=np.float64).reshape(-1)
    if w.shape[0] != cov.shape[0]:
        raise InvalidInputError(f"coverage_weights has {w.shape[0]} values for {cov.shape[0]} rows")
    if w.size and (not np.isfinite(w).all() or (w < 0).any() or (w > 1).any()):
        raise InvalidInputError("coverage_weights must be finite and within [0, 1]")
    res = as_matrix(residual, "residual", d)
    n = f.shape[0]
    if importance is not None:
        importance = np.asarray(importance, _F32).reshape(-1)
        if importance.shape[0] != n:
            raise InvalidInputError(f"importance has {importance.shape[0]} values for {n} facts")
    if ngram_counts is not None:
        ngram_counts = np.asarray(ngram_counts).reshape(-1)
        if ngram_counts.shape[0] != n:
            raise InvalidInputError(
                f"ngram_counts has {ngram_counts.shape[0]} values for {n} facts")
    with np.errstate(invalid="ignore", over="ignore"):  # bad rows are refused just below
        rel = row_dots(f, q)
    check_relevance(rel, f, q, "facts")
    gate = np.flatnonzero(rel >= _F32(min_relevance))
    block = np.take(f, gate, axis=0)
    check_gated_rows(block, gate, "facts")
    imp = np.ones(len(gate), _F32) if importance is None else importance[gate]
    if not np.isfinite(imp).all():
        raise InvalidInputError("importance must be finite")
    centroid = weighted_centroid(cov, w)
    counts = None if ngram_counts is None else ngram_counts[gate]
    score, *_ = cdr_components(
        block, rel[gate], imp, counts, centroid, res, cov.shape[0] > 0
    )
    out = np.full(n, np.nan, dtype=_F32)
    out[gate] = score
    return out
