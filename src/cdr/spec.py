"""CRP-SPEC-024 §7 as written: the spec's names and duck types, running on the fast core.

Outside checks call this module; keep it exact. Readings where the spec is unclear are those of
docs/design.md §3 "Answers to the spec's open questions" (Window 1 has no residual pull, novelty
never exceeds 1, cumulative residual updates, distinct-6-gram counting). Embeddings given here
need not be normalised: true cosines are computed, in float64.

Duck types:
- fact: ``.embedding``, ``.content``, ``.importance_weight`` (1.0 when absent)
- session: ``.coverage_set`` (entries with ``.embedding``, ``.depth_weight``, ``.window_number``),
  ``.residual_set`` (entries with ``.embedding``, ``.id``, ``.text``), ``.ngram_blacklist`` (a set
  of 6-tuples of tokens), ``.window_count``, ``.max_windows`` (5 when absent), ``.safety_budget``
  (1.0 when absent), ``.embed_model`` (``.encode(text)``) for `update_session_after_window`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from cdr.coverage import CoverageEntry, weighted_centroid
from cdr.errors import EmbeddingModelMismatchError, InvalidInputError
from cdr.ngrams import ngram_sequence, ngram_tuples, tokenize
from cdr.ranking import (
    CDR_MIN_RELEVANCE,
    COVERAGE_PENALTY_CAP,
    MIN_NOVELTY_FLOOR,
    cdr_components,
    cdr_scores,
)
from cdr.session import DEFAULT_MAX_WINDOWS, DEFAULT_RESIDUAL_EXIT_DEPTH, exit_reason
from cdr.vectors import unit_rows

__all__ = [
    "CDR_MIN_RELEVANCE",
    "COVERAGE_PENALTY_CAP",
    "MIN_NOVELTY_FLOOR",
    "CoverageEntry",
    "cdr_rank",
    "cdr_scores",
    "count_matching_ngrams",
    "should_terminate_window_loop",
    "tokenize",
    "update_session_after_window",
]


def count_matching_ngrams(content: str, blacklist: Iterable[tuple[str, ...]]) -> int:
    """Distinct 6-grams of `content` present in `blacklist` (docs/design.md §3.1 "Tokenizer for
    n-grams")."""
    bl = blacklist if isinstance(blacklist, set | frozenset) else set(blacklist)
    return sum(1 for g in ngram_tuples(content) if g in bl)


def _unit_rows(vectors: Sequence[Any], what: str) -> np.ndarray:
    """Rows as float64 unit vectors; NaN, inf, ragged or zero vectors are refused by name."""
    try:
        m = np.asarray([np.asarray(v, dtype=np.float64).reshape(-1) for v in vectors])
    except ValueError:
        raise InvalidInputError(f"{what}: embeddings have different dimensions") from None
    if m.ndim != 2:
        raise InvalidInputError(f"{what}: embeddings have different dimensions")
    if not np.isfinite(m).all():
        raise InvalidInputError(f"{what}: an embedding contains NaN or infinite values")
    return unit_rows(m, lambda row, _n: InvalidInputError(
        f"{what}: embedding {row} is a zero vector"))


def _check_dim(m: np.ndarray, dim: int, what: str) -> None:
    if m.shape[0] and m.shape[1] != dim:
        raise InvalidInputError(f"{what}: dimension {m.shape[1]} does not match the facts' {dim}")


def cdr_rank(facts: Sequence[Any], query_embedding: Any, session: Any) -> list[tuple[Any, float]]:
    """§7.1: facts scored by importance × max(relevance, residual pull) × novelty × (1 − n-gram
    penalty), gated at `CDR_MIN_RELEVANCE`, sorted by score descending (ties keep input order)."""
    facts = list(facts)
    if not facts:
        raise InvalidInputError("cdr_rank: the fact list is empty")
    f = _unit_rows([x.embedding for x in facts], "facts")
    dim = f.shape[1]
    q = _unit_rows([query_embedding], "query")[0]
    if q.shape[0] != dim:
        raise InvalidInputError(f"query: dimension {q.shape[0]} does not match the facts' {dim}")
    entries = list(getattr(session, "coverage_set", []) or [])
    weights = np.array([float(e.depth_weight) for e in entries], dtype=np.float64)
    if weights.size and (not np.isfinite(weights).all() or (weights < 0).any()
                         or (weights > 1).any()):
        raise InvalidInputError("coverage_set: depth_weight must be within [0, 1]")
    cov = _unit_rows([e.embedding for e in entries], "coverage_set") if entries else None
    residual_entries = list(getattr(session, "residual_set", []) or [])
    res = (
        _unit_rows([r.embedding for r in residual_entries], "residual_set")
        if residual_entries
        else np.zeros((0, dim))
    )
    if cov is not None:
        _check_dim(cov, dim, "coverage_set")
    _check_dim(res, dim, "residual_set")

    relevance = f @ q
    gate = np.flatnonzero(relevance >= CDR_MIN_RELEVANCE)
    if gate.size == 0:
        return []
    centroid = None if cov is None else weighted_centroid(cov, weights, np.float64)
    blacklist = getattr(session, "ngram_blacklist", None) or set()
    counts = np.array(
        [count_matching_ngrams(facts[i].content, blacklist) if blacklist else 0 for i in gate]
    )
    importance = np.array(
        [float(getattr(facts[i], "importance_weight", 1.0)) for i in gate], dtype=np.float64
    )
    score, *_ = cdr_components(
        f[gate], relevance[gate], importance, counts, centroid, res, bool(entries)
    )
    order = np.argsort(-score, kind="stable")
    return [(facts[int(gate[i])], float(score[i])) for i in order]


def should_terminate_window_loop(
    session: Any, dpe_report: Any, envelope_stats: Any
) -> tuple[bool, str | None]:
    """§7.1's exit check: (True, reason) for the first exit that holds, else (False, None)."""
    reason = exit_reason(
        completeness=float(dpe_report.completeness_score),
        residual_empty=not list(getattr(session, "residual_set", []) or []),
        window_count=int(session.window_count),
        max_windows=int(getattr(session, "max_windows", DEFAULT_MAX_WINDOWS)),
        mean_novelty_ratio=getattr(envelope_stats, "mean_novelty_ratio", None),
        safety_budget=float(getattr(session, "safety_budget", 1.0)),
    )
    return (reason is not None), reason


def _embed_one(model: Any, text: str) -> np.ndarray:
    vec = model.encode([text]) if not hasattr(model, "encode_one") else model.encode_one(text)
    vec = np.asarray(vec, dtype=np.float64)
    return vec[0] if vec.ndim == 2 else vec


def update_session_after_window(session: Any, dpe_report: Any, window_output: str) -> None:
    """§7.2: Coverage Set, Residual Set, n-gram blacklist and window count after a window.

    Residual updates are cumulative (docs/design.md §3.4 "Residual Set updates are cumulative"):
    a sub-query leaves the Residual Set once its summed depth reaches
    ``session.residual_exit_depth`` (0.70 when absent); 0.0 reproduces §7.2's "any mention
    removes it". The embedding model must be the session's (§2.5).
    """
    model = session.embed_model
    session_model = getattr(session, "embedding_model_id", None) or getattr(
        session, "model_id", None
    )
    model_id = getattr(model, "model_id", None)
    if session_model is not None and model_id is not None and session_model != model_id:
        raise EmbeddingModelMismatchError(str(session_model), str(model_id), "coverage update")
    depths = getattr(dpe_report, "sub_query_depth", {}) or {}
    cumulative = getattr(session, "cumulative_depth", None)
    if cumulative is None:
        cumulative = {}
        session.cumulative_depth = cumulative
    exit_depth = float(getattr(session, "residual_exit_depth", DEFAULT_RESIDUAL_EXIT_DEPTH))

    addressed = list(dpe_report.addressed_sub_queries)
    new_entries = []
    for sq in addressed:
        depth = float(depths.get(sq.id, 0.5))
        if not 0.0 <= depth <= 1.0:
            raise InvalidInputError(f"depth of {sq.id!r} must be within [0, 1], got {depth}")
        new_entries.append(
            CoverageEntry(_embed_one(model, sq.text), depth, int(session.window_count))
        )
        cumulative[sq.id] = min(cumulative.get(sq.id, 0.0) + depth, 1.0)
    session.coverage_set.extend(new_entries)

    addressed_ids = {sq.id for sq in addressed}
    session.residual_set = [
        sq for sq in session.residual_set
        if not (sq.id in addressed_ids and cumulative.get(sq.id, 0.0) >= exit_depth)
    ]

    tokens = tokenize(window_output)
    session.ngram_blacklist.update(ngram_sequence(tokens))
    session.window_count += 1
