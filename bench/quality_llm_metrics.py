"""Per-window measures of generated text (issue 9 §3), pure functions over texts and vectors.

- CWR6 and the cumulative 6-gram repetition come from `cdr.report.quality` (docs/design.md §6
  "Quality, measured the same way every time", SPEC-024 §1.1).
- Semantic repetition: the share of a window's sentences whose cosine to some sentence of an
  earlier window reaches a threshold — the repetition a model produces by restating, which
  6-grams miss. Sentence level, because paragraph cosines of MiniLM bunch together.
- Grounding: the share of a window's sentences whose best cosine to a fact of that window's
  envelope reaches a threshold.
- Thresholds are calibrated on pairs drawn from the outputs themselves (`calibrate`): the
  cosine that best separates positive from negative pairs (Youden's J).

Embedding is left to the caller (vectors in, numbers out), so every function here is exact on
small given cases.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from cdr.report.quality import (  # noqa: F401  (re-exported: the report and tests use them here)
    MIN_SENTENCE_WORDS,
    semantic_repetition,
    sentences,
    unit_rows,
)

_WORD = re.compile(r"[A-Za-z0-9_]+")
_STOP = ("a an the and or of to in on for with by is are be was were it its this that these "
         "those as at from can you your if not no but so which will may also than then there "
         "their they use used using into each any all when how what")
STOPWORDS = frozenset(_STOP.split())


def content_words(text: str) -> set[str]:
    """Lower-cased words that are not stop words: what lexical overlap is measured on."""
    return {w for w in (m.lower() for m in _WORD.findall(text)) if w not in STOPWORDS}


def jaccard(a: set[str], b: set[str]) -> float:
    return len(a & b) / len(a | b) if a or b else 0.0


def containment(a: set[str], b: set[str]) -> float:
    """Share of `a`'s words that `b` holds."""
    return len(a & b) / len(a) if a else 0.0


def grounding(sentence_vecs: np.ndarray, fact_vecs: np.ndarray, threshold: float) -> float:
    """Share of sentences whose best cosine to a fact reaches `threshold` (NaN: no sentence;
    0 when there are no facts: nothing could ground them)."""
    s = unit_rows(np.asarray(sentence_vecs, dtype=np.float64))
    if s.shape[0] == 0:
        return math.nan
    f = unit_rows(np.asarray(fact_vecs, dtype=np.float64))
    if f.shape[0] == 0:
        return 0.0
    return float(np.mean((s @ f.T).max(axis=1) >= threshold))


def subtopic_coverage(sentence_vecs: np.ndarray, fact_vecs: np.ndarray,
                      fact_topics: Sequence[str], n_topics: int, threshold: float) -> float:
    """Share of the task's `n_topics` sub-topics the text covers: a sub-topic counts when some
    sentence's cosine to one of its labelled facts (`fact_topics[i]` for row i of
    `fact_vecs`) reaches `threshold` — the text says something that section says."""
    s = unit_rows(np.asarray(sentence_vecs, dtype=np.float64))
    f = unit_rows(np.asarray(fact_vecs, dtype=np.float64))
    if n_topics <= 0:
        return math.nan
    if s.shape[0] == 0 or f.shape[0] == 0:
        return 0.0
    hit = (s @ f.T).max(axis=0) >= threshold
    return len({fact_topics[i] for i in np.flatnonzero(hit)}) / n_topics


@dataclass
class Calibration:
    """A threshold chosen on labelled cosines, and how well it separates them."""

    threshold: float
    positives: int
    negatives: int
    true_positive_rate: float
    false_positive_rate: float
    positive_median: float
    negative_median: float
    negative_p99: float


def calibrate(pos: Sequence[float], neg: Sequence[float]) -> Calibration:
    """The cosine threshold with the best Youden's J (TPR − FPR) over the candidate cuts (every
    observed cosine); ties go to the higher threshold (fewer false repetitions)."""
    p = np.sort(np.asarray(pos, dtype=np.float64))
    n = np.sort(np.asarray(neg, dtype=np.float64))
    if p.size == 0 or n.size == 0:
        raise ValueError(f"calibration needs both kinds of pairs ({p.size} positive, "
                         f"{n.size} negative)")
    cuts = np.unique(np.concatenate([p, n]))
    tpr = 1.0 - np.searchsorted(p, cuts, side="left") / p.size  # share ≥ cut
    fpr = 1.0 - np.searchsorted(n, cuts, side="left") / n.size
    j = tpr - fpr
    best = int(np.flatnonzero(j == j.max())[-1])
    return Calibration(float(cuts[best]), int(p.size), int(n.size), float(tpr[best]),
                       float(fpr[best]), float(np.median(p)), float(np.median(n)),
                       float(np.quantile(n, 0.99)))


def mean_over(values: Sequence[float], start: int = 1, stop: int | None = None) -> float:
    """Mean of `values[start:stop]` ignoring NaN (windows 2–5 are `start=1`); NaN if none."""
    v = [x for x in values[start:stop] if not math.isnan(x)]
    return sum(v) / len(v) if v else math.nan


def repetition_split(windows: Sequence[str]) -> tuple[float, float]:
    """The document's cumulative 6-gram repetition, Σ(count − 1) / #6-grams, split in two
    parts that add up to it: (within, across). `within` counts a 6-gram's extra occurrences
    inside one window (the model's own phrasing); `across` counts each further window a
    6-gram appears in (restating an earlier window). Windows are 6-grammed one by one, as
    `cdr.report.quality.cumulative_repetition` does."""
    from collections import Counter

    from cdr.ngrams import ngram_sequence, tokenize

    total = within = 0
    windows_with: Counter[tuple[str, ...]] = Counter()
    for text in windows:
        grams = Counter(ngram_sequence(tokenize(text)))
        total += sum(grams.values())
        within += sum(c - 1 for c in grams.values())
        windows_with.update(grams.keys())
    across = sum(n - 1 for n in windows_with.values())
    return (within / total, across / total) if total else (0.0, 0.0)


def section_sentences(text: str) -> list[tuple[str | None, str]]:
    """(section heading in lower case, or None before the first `## `, sentence) in order:
    the sentences `semantic_repetition` counts, each with the section it was written under."""
    from cdr.window.assemble import split_sections

    return [(h.lower() if h else None, s) for h, body in split_sections(text)
            for s in sentences(body)]


def semantic_repetition_split(windows: Sequence[Sequence[tuple[str | None, np.ndarray]]],
                              threshold: float) -> tuple[float, float, int]:
    """Where windows 2+'s restating sentences come from: (share of their sentences whose
    closest earlier sentence, at cosine ≥ `threshold`, was written under the same section;
    share whose closest was under another section; sentences counted). The two shares add up
    to the pooled semantic repetition of windows 2+. Each window is [(section, vector)]."""
    same = cross = n = 0
    earlier: list[tuple[str | None, np.ndarray]] = []
    for window in windows:
        if earlier and window:
            prev = unit_rows(np.stack([v for _, v in earlier]))
            cur = unit_rows(np.stack([v for _, v in window]))
            sims = cur @ prev.T
            best = sims.argmax(axis=1)
            for i, (section, _) in enumerate(window):
                n += 1
                if sims[i, best[i]] >= threshold:
                    if section is not None and earlier[best[i]][0] == section:
                        same += 1
                    else:
                        cross += 1
        earlier.extend(window)
    return (same / n, cross / n, n) if n else (math.nan, math.nan, 0)


def lexical_restating(windows: Sequence[Sequence[str]], min_jaccard: float) -> list[float]:
    """Per window, the share of its sentences sharing ≥ `min_jaccard` of their content words
    (Jaccard) with some sentence of an earlier window (0 for W1; NaN for a window without
    sentences). A check on semantic repetition that uses no embedding model: the repeat guard
    (cdr.window.repeat_guard) judges meaning with the same model the semantic measure uses, so a
    guarded arm's semantic figure is not independent of what the guard removed."""
    out: list[float] = []
    earlier: list[set[str]] = []
    for i, window in enumerate(windows):
        words = [content_words(s) for s in window]
        if not words:
            out.append(math.nan)
        elif i == 0:
            out.append(0.0)
        else:
            hits = sum(1 for w in words if any(jaccard(w, e) >= min_jaccard for e in earlier))
            out.append(hits / len(words))
        earlier.extend(words)
    return out
