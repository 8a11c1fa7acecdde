"""The benchmark's Phase 2 arms that are not built into `cdr.ranking`.

Each arm is a `cdr.window.loop.Ranker`: it receives Phase 1's gated selection — the same candidates
every arm gets — and returns a `Ranking` over CKF rows that the loop packs, plans and writes
exactly as it does for CDR. The baselines compute no novelty, so their rankings carry
novelty = 1, residual pull = 0, n-gram penalty = 0, coverage = 0.

- `mmr`: pyversity's Maximal Marginal Relevance, per window (no memory across windows, as MMR
  is used in retrieval pipelines).
- `ssd`: pyversity's Sliding Spectrum Decomposition with `recent_embeddings` = the facts of
  the earlier windows' envelopes, oldest first: a published method that remembers what was
  shown.
- `xquad`: explicit query-aspect diversification (Santos, Macdonald and Ounis, WWW 2010),
  written here from the paper, with the task's sub-queries as the aspects and S = the facts
  already selected, carried across windows (each window continues the same greedy ranking).

Two proposals for the loop are measured with the same machinery (not the spec, labelled as
such in the results): `ShownMemoryCdrRanker` (CDR that also remembers facts of earlier
envelopes).
`CachingEmbedder` only saves time.

Diversifiers pick facts one at a time; picking every candidate would cost a greedy pass over
thousands of facts per window for nothing, since the envelope holds a few dozen. They pick
`k` = enough facts to fill the envelope twice over (at the candidates' median size); the
remaining candidates follow in relevance order so packing can always fill the budget.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cdr.errors import InvalidInputError
from cdr.ranking import Ranking
from cdr.window.envelope import FACT_FRAMING_TOKENS

_F32 = np.float32
FILL_FACTOR = 2.0


def fill_k(token_counts: np.ndarray, envelope_tokens: int, factor: float = FILL_FACTOR) -> int:
    """How many facts a diversifier picks: `factor` envelopes' worth at the median fact size."""
    m = int(token_counts.shape[0])
    if m == 0:
        return 0
    median = float(np.median(token_counts)) + FACT_FRAMING_TOKENS
    return min(m, max(1, math.ceil(factor * envelope_tokens / median)))


def ranking_from_order(
    rows: np.ndarray, relevance: np.ndarray, order: np.ndarray, mode: str,
    extra: dict[str, float] | None = None,
) -> Ranking:
    """A baseline `Ranking`: the picked positions first, in pick order, then every other
    candidate by relevance. Scores are rank-based (1 for the first, falling linearly), so the
    loop's plan keeps the arm's order within a section."""
    m = int(rows.shape[0])
    order = np.asarray(order, dtype=np.int64)
    if order.size and (order.min() < 0 or order.max() >= m or np.unique(order).size != order.size):
        raise InvalidInputError("order must hold distinct positions into the candidates")
    rest = np.setdiff1d(np.arange(m), order, assume_unique=False)
    rest = rest[np.argsort(-relevance[rest], kind="stable")]
    full = np.concatenate([order, rest]).astype(np.int64)
    score = (1.0 - np.arange(m, dtype=np.float64) / max(m, 1)).astype(_F32)
    ones, zeros = np.ones(m, _F32), np.zeros(m, _F32)
    return Ranking(rows[full], score, relevance[full].astype(_F32), ones, zeros, zeros.copy(),
                   zeros.copy(), mode, m, 0, dict(extra or {}))


def xquad_order(
    relevance: np.ndarray,
    aspect_sims: np.ndarray,
    k: int,
    lam: float = 0.5,
    prior: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Greedy xQuAD: (order, scores, aspect mass left).

    score(d) = (1 − λ)·P(d|q) + λ·Σᵢ P(qᵢ|q)·P(d|qᵢ)·Πⱼ∈S (1 − P(dⱼ|qᵢ)),
    with P(qᵢ|q) uniform. `relevance` is P(d|q) (M,), `aspect_sims` is P(d|qᵢ) (M, Q), both
    within [0, 1]. `prior` is Πⱼ∈S (1 − P(dⱼ|qᵢ)) over facts selected before this call
    (ones when None); the returned mass left continues it.
    """
    rel = np.asarray(relevance, dtype=np.float64)
    p = np.asarray(aspect_sims, dtype=np.float64)
    if p.ndim != 2 or p.shape[0] != rel.shape[0]:
        raise InvalidInputError(f"aspect_sims has shape {p.shape}, expected ({rel.shape[0]}, Q)")
    if not 0.0 <= lam <= 1.0:
        raise InvalidInputError(f"lambda must be within [0, 1], got {lam}")
    if ((rel < 0) | (rel > 1)).any() or ((p < 0) | (p > 1)).any():
        raise InvalidInputError("xQuAD probabilities must lie within [0, 1]")
    m, q = p.shape
    left = np.ones(q) if prior is None else np.asarray(prior, dtype=np.float64).copy()
    if left.shape != (q,):
        raise InvalidInputError(f"prior has shape {left.shape}, expected ({q},)")
    weight = np.full(q, 1.0 / q) if q else np.zeros(0)
    k = min(int(k), m)
    taken = np.zeros(m, dtype=bool)
    order = np.empty(k, dtype=np.int64)
    scores = np.empty(k, dtype=np.float64)
    for i in range(k):
        obj = (1.0 - lam) * rel + lam * (p @ (weight * left))
        obj[taken] = -np.inf
        j = int(np.argmax(obj))
        order[i], scores[i], taken[j] = j, obj[j], True
        left *= 1.0 - p[j]
    return order, scores, left


def max_normalised(x: np.ndarray, axis: int = 0) -> np.ndarray:
    """Scores as probabilities within [0, 1]: negatives clipped, divided by the maximum."""
    c = np.clip(np.asarray(x, dtype=np.float64), 0.0, None)
    top = c.max(axis=axis, keepdims=True) if c.size else c
    return np.divide(c, top, out=np.zeros_like(c), where=top > 0)


@dataclass
class ArmRanker:
    """Base of the stateful rankers: remembers the rows of earlier envelopes (oldest first)."""

    envelope_tokens: int
    token_counts: np.ndarray  # per CKF row
    shown: list[int] = field(default_factory=list)

    def remember(self, rows: np.ndarray) -> None:
        """Called by the benchmark after each window with the rows the envelope packed."""
        self.shown.extend(int(r) for r in rows)

    def k_for(self, selection: Any) -> int:
        return fill_k(self.token_counts[selection.indices], self.envelope_tokens)


@dataclass
class PyversityRanker(ArmRanker):
    """MMR or SSD through pyversity; SSD sees the earlier envelopes' facts as recent context."""

    strategy: str = "mmr"
    diversity: float = 0.5
    name: str = "mmr"
    # rows -> unit vectors (`FactIndex.vectors`), for SSD's recent context
    fact_vectors: Callable[[list[int]], np.ndarray] | None = None

    def __call__(self, session: Any, selection: Any, importance: np.ndarray,
                 ngram_counts: np.ndarray | None) -> Ranking:
        from pyversity import Strategy, diversify

        rel = np.asarray(selection.relevances, dtype=_F32)
        base = np.asarray(importance, dtype=_F32) * rel
        k = self.k_for(selection)
        kwargs: dict[str, Any] = {}
        strategy = Strategy(self.strategy)
        if strategy == Strategy.SSD and self.shown:
            seen = list(dict.fromkeys(self.shown))  # first showing order, oldest first
            if self.fact_vectors is None:
                raise InvalidInputError("the SSD arm needs fact_vectors (rows -> unit vectors)")
            kwargs["recent_embeddings"] = np.asarray(self.fact_vectors(seen), dtype=_F32)
        if k == 0:
            order = np.zeros(0, dtype=np.int64)
        else:
            res = diversify(selection.embeddings, base, k, strategy=strategy,
                            diversity=self.diversity, **kwargs)
            order = np.asarray(res.indices, dtype=np.int64)
        return ranking_from_order(selection.indices, rel, order, self.name,
                                  {"diversity": self.diversity, "k": float(k)})


@dataclass
class XQuADRanker(ArmRanker):
    """xQuAD over the task's sub-queries; S carries over from window to window."""

    lam: float = 0.5
    name: str = "xquad"

    def __call__(self, session: Any, selection: Any, importance: np.ndarray,
                 ngram_counts: np.ndarray | None) -> Ranking:
        rows = np.asarray(selection.indices)
        rel = np.asarray(selection.relevances, dtype=_F32)
        aspects = np.asarray(session.sub_query_embeddings, dtype=_F32)
        p_rel = max_normalised(np.asarray(importance, dtype=np.float64) * rel)
        p_asp = max_normalised(selection.embeddings @ aspects.T)
        seen = np.isin(rows, np.asarray(self.shown, dtype=np.int64))
        prior = np.ones(aspects.shape[0])
        if seen.any():
            prior = np.prod(1.0 - p_asp[seen], axis=0)
        fresh = np.flatnonzero(~seen)
        k = min(self.k_for(selection), fresh.size)
        order, _, _ = xquad_order(p_rel[fresh], p_asp[fresh], k, self.lam, prior)
        return ranking_from_order(rows, rel, fresh[order], self.name,
                                  {"lambda": self.lam, "k": float(k)})


SHOWN_FACTOR = 0.2  # the spec's novelty floor, reused as the weight of an already-shown fact


@dataclass
class ShownMemoryCdrRanker(ArmRanker):
    """A proposal, not the spec: CDR whose novelty also remembers facts, not only topics.

    CDR's Coverage Set holds sub-query embeddings, so a fact that sat in an earlier envelope
    but was not written keeps its full score and returns; the n-gram guard only sees what was
    written. Here a fact from an earlier envelope has its novelty (and so its score) multiplied
    by `factor`, which also lets Exit 3 see an envelope made of old facts.
    """

    factor: float = SHOWN_FACTOR
    name: str = "cdr+shown"

    def __call__(self, session: Any, selection: Any, importance: np.ndarray,
                 ngram_counts: np.ndarray | None) -> Ranking:
        from cdr.ranking import rank

        r = rank(selection.embeddings, selection.relevances, importance=importance,
                 ngram_counts=ngram_counts, coverage=session.coverage,
                 residual=session.residual, mode="cdr", min_relevance=session.min_relevance,
                 rows=selection.indices)
        if not self.shown or len(r) == 0:
            return r
        shown = np.isin(r.indices, np.asarray(self.shown, dtype=np.int64))
        weight = np.where(shown, _F32(self.factor), _F32(1.0)).astype(_F32)
        r.score = (r.score * weight).astype(_F32)
        r.novelty = (r.novelty * weight).astype(_F32)
        r.mode = self.name
        return r.take(np.argsort(-r.score, kind="stable"))


class CachingEmbedder:
    """The CKF's embedder with a memo: the extractive writer writes facts verbatim, so DPE
    Stage 8 embeds the same paragraphs again and again across windows and arms. The model is
    deterministic, so a cached vector is the vector; only the time changes."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.model_id: str = inner.model_id
        self.dim: int = int(inner.dim)
        self._cache: dict[str, np.ndarray] = {}
        self.computed = 0

    def encode(self, texts: Any, *, batch_size: int = 32, progress: Any = None) -> np.ndarray:
        texts = list(texts)
        missing = [t for t in dict.fromkeys(texts) if t not in self._cache]
        if missing:
            vecs = self.inner.encode(missing, batch_size=batch_size)
            self._cache.update(zip(missing, np.asarray(vecs, dtype=_F32), strict=True))
            self.computed += len(missing)
        if progress is not None:
            progress(len(texts))
        if not texts:
            return np.zeros((0, self.dim), dtype=_F32)
        return np.stack([self._cache[t] for t in texts])
