"""Per-window measures of one run, on top of `cdr.report.quality` (docs/design.md §6 "Quality,
measured the same way every time").

`cdr.report.quality` gives CWR6, the cumulative 6-gram repetition, fact reuse, sub-topic recall and
an α-nDCG whose ideal is built from the ranked facts themselves. That ideal cannot see a
sub-topic the arm never retrieved, so a window that shows one section only scores 1.0. The
benchmark reports it ("within window"), and also `alpha_ndcg_vs_page`: the ideal is built from
every labelled fact of the task's page, and sub-topics shown in earlier windows count as seen,
so a window scores well only by bringing sub-topics the document has not had yet.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from cdr.ngrams import NGRAM_SIZE, tokenize
from cdr.report import quality


def _dcg(gains: Sequence[float], k: int) -> float:
    return sum(g / math.log2(i + 2) for i, g in enumerate(gains[:k]))


def _gains(order: Sequence[str], labels: Mapping[str, str], seen: Counter[str],
           alpha: float) -> list[float]:
    counts = Counter(seen)
    out = []
    for fid in order:
        t = labels.get(fid)
        if t is None:
            out.append(0.0)
            continue
        out.append((1.0 - alpha) ** counts[t])
        counts[t] += 1
    return out


def alpha_ndcg_vs_page(
    ranked_ids: Sequence[str],
    labels: Mapping[str, str],
    page_counts: Mapping[str, int],
    prior: Mapping[str, int] | None = None,
    k: int = 20,
    alpha: float = 0.5,
) -> float:
    """α-nDCG@k of `ranked_ids` (one sub-topic per fact, `labels`; unlabelled facts gain 0).

    `page_counts` holds how many facts each sub-topic has on the page (the ideal's pool);
    `prior` how often each sub-topic was shown in earlier windows (both the ranking and the
    ideal start from it). The ideal is greedy, the usual approximation; it is exact here,
    because with one sub-topic per fact the greedy pick is always optimal.
    """
    seen: Counter[str] = Counter(prior or {})
    actual = _dcg(_gains(ranked_ids, labels, seen, alpha), k)
    left = Counter({t: n for t, n in page_counts.items() if n > 0})
    counts = Counter(seen)
    ideal: list[float] = []
    while left and len(ideal) < k:
        best = max(left, key=lambda t: ((1.0 - alpha) ** counts[t], t))
        ideal.append((1.0 - alpha) ** counts[best])
        counts[best] += 1
        left[best] -= 1
        if left[best] == 0:
            del left[best]
    best_dcg = _dcg(ideal, k)
    return actual / best_dcg if best_dcg > 0 else 0.0


@dataclass
class WindowData:
    """What one window put in front of the writer and what came out."""

    ranked_ids: list[str]  # envelope facts in ranking order (best first)
    text: str
    relevances: list[float]  # query relevance of the envelope facts
    on_page: int  # envelope facts from the task's page
    written_ids: list[str]  # envelope facts whose text appears in the window
    completeness: float
    status: str
    novelty_ratio: float | None
    candidates: int


@dataclass
class RunMetrics:
    """Per-window series for one (task, arm) run."""

    cwr6: list[float] = field(default_factory=list)
    cumulative_repetition: list[float] = field(default_factory=list)
    fact_reuse: list[float] = field(default_factory=list)
    subtopic_recall: list[float] = field(default_factory=list)
    written_recall: list[float] = field(default_factory=list)
    alpha_ndcg_page: list[float] = field(default_factory=list)
    alpha_ndcg_window: list[float] = field(default_factory=list)
    mean_relevance: list[float] = field(default_factory=list)
    on_page_share: list[float] = field(default_factory=list)
    envelope_facts: list[float] = field(default_factory=list)
    words: list[float] = field(default_factory=list)
    completeness: list[float] = field(default_factory=list)
    status: list[str] = field(default_factory=list)

    SERIES = ("cwr6", "cumulative_repetition", "fact_reuse", "subtopic_recall",
              "written_recall", "alpha_ndcg_page", "alpha_ndcg_window", "mean_relevance",
              "on_page_share", "envelope_facts", "words", "completeness")


def run_metrics(
    windows: Sequence[WindowData],
    labels: Mapping[str, str],
    subtopics: Sequence[str],
    page_counts: Mapping[str, int],
    k: int = 20,
) -> RunMetrics:
    """All per-window measures of a run, the same way for every arm."""
    texts = [w.text for w in windows]
    envelopes = [w.ranked_ids for w in windows]
    # A window that wrote nothing has no 6-grams to repeat: NaN, not a flattering 0.
    cwr = [c if len(tokenize(t)) >= NGRAM_SIZE else math.nan
           for c, t in zip(quality.cwr6(texts), texts, strict=True)]
    m = RunMetrics(
        cwr6=cwr,
        cumulative_repetition=quality.cumulative_repetition(texts),
        fact_reuse=quality.fact_reuse(envelopes),
        subtopic_recall=quality.subtopic_recall(envelopes, labels, subtopics),
        written_recall=quality.subtopic_recall([w.written_ids for w in windows], labels,
                                               subtopics),
    )
    prior: Counter[str] = Counter()
    for w in windows:
        m.alpha_ndcg_page.append(alpha_ndcg_vs_page(w.ranked_ids, labels, page_counts, prior, k))
        m.alpha_ndcg_window.append(quality.alpha_ndcg(w.ranked_ids, labels, subtopics, k))
        prior.update(labels[f] for f in dict.fromkeys(w.ranked_ids[:k]) if f in labels)
        n = len(w.ranked_ids)
        m.mean_relevance.append(sum(w.relevances) / n if n else float("nan"))
        m.on_page_share.append(w.on_page / n if n else float("nan"))
        m.envelope_facts.append(float(n))
        m.words.append(float(len(w.text.split())))
        m.completeness.append(w.completeness)
        m.status.append(w.status)
    return m


def first_exit(status: Sequence[str]) -> int:
    """1-based window at which the run's own exit rule fired (len(status) if it never did)."""
    for i, s in enumerate(status):
        if s != "in-progress":
            return i + 1
    return len(status)
