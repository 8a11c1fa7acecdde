"""A plain per-fact implementation of CRP-SPEC-024 §7.1 with the readings of
docs/design.md §3 "Answers to the spec's open questions".

Written as literally as possible (loops, math.fsum, true cosines) so that the vectorised core
can be checked against it. Not used by the package.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def cosine(a: Sequence[float], b: Sequence[float]) -> float:
    dot = math.fsum(x * y for x, y in zip(a, b, strict=True))
    na = math.sqrt(math.fsum(x * x for x in a))
    nb = math.sqrt(math.fsum(y * y for y in b))
    return dot / (na * nb)


def reference_score(
    fact: Sequence[float],
    importance: float,
    query: Sequence[float],
    coverage: Sequence[tuple[Sequence[float], float]],
    residual: Sequence[Sequence[float]],
    ngram_count: int,
    min_relevance: float = 0.55,
) -> float | None:
    """Score of one fact, or None when the gate excludes it."""
    relevance = cosine(fact, query)
    if relevance < min_relevance:
        return None
    total = math.fsum(w for _, w in coverage)
    if coverage and total > 0:
        coverage_score = math.fsum(w * cosine(fact, e) for e, w in coverage) / total
    else:
        coverage_score = 0.0
    # docs/design.md §3.2: no residual pull while the Coverage Set is empty (Window 1 = Phase 2).
    residual_pull = max((cosine(fact, r) for r in residual), default=0.0) if coverage else 0.0
    effective = max(relevance, residual_pull)
    # docs/design.md §3.3: no boost when anti-correlated
    penalty = min(max(coverage_score, 0.0), 0.80)
    novelty = max(1.0 - penalty, 0.20)
    ngram_penalty = min(0.80, ngram_count * 0.15)
    return importance * effective * novelty * (1.0 - ngram_penalty)
