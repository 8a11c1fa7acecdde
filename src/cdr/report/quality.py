"""Quality measures of a multi-window document, the same way every time (docs/design.md §6 "Quality,
measured the same way every time").

They work on window texts and on the fact ids of each window's envelope, so the CLI's table,
the traces and the benchmarks report the same numbers.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Mapping, Sequence

import numpy as np

from cdr.ngrams import ngram_sequence, tokenize
from cdr.text.sentences import split_sentences


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


# -- semantic repetition: restating an earlier window in other words ------------------------

_FENCE = re.compile(r"^\s*(```|~~~)")
_HEADING = re.compile(r"^\s*#{1,6}\s")
_BULLET = re.compile(r"^\s*(?:[-*+]|\d+[.)])\s+")
MIN_SENTENCE_WORDS = 4
# Calibrated by `make bench-llm` on the reference model's outputs, 6 tasks × 5 arms
# (bench/results/quality-llm.md: the all-MiniLM-L6-v2 cosine with the best Youden's J between
# 414 paraphrase and 4,000 same-topic non-paraphrase sentence pairs; TPR 94%, FPR 5.3%).
SEMANTIC_REPETITION_THRESHOLD = 0.607


def sentences(text: str, min_words: int = MIN_SENTENCE_WORDS) -> list[str]:
    """The prose sentences of Markdown `text`: headings and code blocks left out, list items
    and paragraphs split at sentence ends (`cdr.text.sentences`); fragments under `min_words`
    words dropped."""
    out: list[str] = []
    in_code = False
    block: list[str] = []

    def flush() -> None:
        if block:
            para = " ".join(block)
            out.extend(split_sentences(para))
            block.clear()

    for line in text.splitlines():
        if _FENCE.match(line):
            flush()
            in_code = not in_code
            continue
        if in_code or _HEADING.match(line):
            flush()
            continue
        if not line.strip():
            flush()
            continue
        if _BULLET.match(line):
            flush()
            line = _BULLET.sub("", line)
        block.append(line.strip())
    flush()
    return [s for s in out if len(s.split()) >= min_words]


def unit_rows(v: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length (zero rows left as they are), in float64."""
    v = np.asarray(v, dtype=np.float64)
    if v.size == 0:
        return v.reshape(0, v.shape[-1] if v.ndim == 2 else 0)
    n = np.linalg.norm(v, axis=1, keepdims=True)
    return v / np.where(n == 0, 1.0, n)


def semantic_repetition(windows: Sequence[np.ndarray], threshold: float) -> list[float]:
    """Per window, the share of its sentences (rows of its (k, d) array) whose cosine to some
    sentence of an earlier window is ≥ `threshold`. Window 1 has nothing earlier: 0. A window
    with no sentences: NaN (it wrote nothing to judge)."""
    out: list[float] = []
    earlier: list[np.ndarray] = []
    for vecs in windows:
        v = unit_rows(np.asarray(vecs, dtype=np.float64))
        if v.shape[0] == 0:
            out.append(math.nan)
            continue
        if earlier:
            prev = np.concatenate(earlier)
            best = (v @ prev.T).max(axis=1)
            out.append(float(np.mean(best >= threshold)))
        else:
            out.append(0.0)
        earlier.append(v)
    return out
