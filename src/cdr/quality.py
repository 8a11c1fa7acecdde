"""Quality measures of a multi-window document, the same way every time (DESIGN.md §6).

They work on window texts and on the fact ids of each window's envelope, so the CLI's table,
the traces and the benchmarks report the same numbers.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence

from cdr.ngrams import ngram_sequence, tokenize


def cwr6(windows: Sequence[str]) -> list[float]:
    """Per window: share of its distinct 6-grams that occur in earlier windows (0 for W1)."""
    seen: set[tuple[str, ...]] = set()
    out = []
    for text in windows:
        grams = set(ngram_sequence(tokenize(text)))
        out.append(len(grams & seen) / len(grams) if grams else 0.0)
        seen |= grams
    return out


def cumulative_repetition(windows: Sequence[str]) -> list[float]:
    """After each window: Σ(count − 1) / #6-grams over the text so far (the §1.1 measure)."""
    counts: Counter[tuple[str, ...]] = Counter()
    total = 0
    out = []
    for text in windows:
        grams = ngram_sequence(tokenize(text))
        counts.update(grams)
        total += len(grams)
        repeated = sum(c - 1 for c in counts.values())
        out.append(repeated / total if total else 0.0)
    return out


def fact_reuse(envelopes: Sequence[Sequence[str]]) -> list[float]:
    """Per window: share of its envelope's facts already in an earlier envelope."""
    seen: set[str] = set()
    out = []
    for ids in envelopes:
        s = set(ids)
        out.append(len(s & seen) / len(s) if s else 0.0)
        seen |= s
    return out


def subtopic_recall(
    envelopes: Sequence[Sequence[str]], labels: Mapping[str, str], subtopics: Sequence[str]
) -> list[float]:
    """After each window: share of the task's sub-topics with at least one fact used so far."""
    wanted = set(subtopics)
    if not wanted:
        return [0.0 for _ in envelopes]
    covered: set[str] = set()
    out = []
    for ids in envelopes:
        covered |= {labels[i] for i in ids if labels.get(i) in wanted}
        out.append(len(covered) / len(wanted))
    return out


def alpha_ndcg(
    ranked_ids: Sequence[str], labels: Mapping[str, str], subtopics: Sequence[str],
    k: int = 20, alpha: float = 0.5,
) -> float:
    """α-nDCG@k with one sub-topic per fact (Clarke et al. 2008). The ideal ranking is built
    greedily from the same facts, the usual approximation."""
    wanted = set(subtopics)

    def gains(order: Sequence[str]) -> list[float]:
        seen: Counter[str] = Counter()
        g = []
        for fid in order:
            t = labels.get(fid)
            if t in wanted:
                g.append((1 - alpha) ** seen[t])
                seen[t] += 1
            else:
                g.append(0.0)
        return g

    def dcg(g: Sequence[float]) -> float:
        return sum(x / math.log2(i + 2) for i, x in enumerate(g[:k]))

    actual = dcg(gains(ranked_ids))
    pool = [f for f in dict.fromkeys(ranked_ids) if labels.get(f) in wanted]
    ideal: list[str] = []
    seen: Counter[str] = Counter()
    while pool and len(ideal) < k:
        best = max(pool, key=lambda f: (1 - alpha) ** seen[labels[f]])
        ideal.append(best)
        seen[labels[best]] += 1
        pool.remove(best)
    best_dcg = dcg(gains(ideal))
    return actual / best_dcg if best_dcg > 0 else 0.0
