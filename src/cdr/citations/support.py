"""How well a fact supports a sentence: the score every citation is checked by.

A sentence a model wrote from a fact shares the fact's words (names, numbers, terms) and its
meaning. Neither alone is enough: a paraphrase keeps the meaning in other words, and a
sentence can reuse a fact's terms to say something the fact does not. The score is the mean of
the two — the share of the sentence's content words found in the fact (light stemming, so
"indexes" meets "index"), and the cosine of the two embeddings with the knowledge base's own
model — and is checked against one threshold, calibrated on labelled sentences
(docs/citations.md, "Calibration"). A sentence whose content words are (nearly) all the
fact's (`LEXICAL_SURE`: it quotes the fact, as the extractive writer does), with words enough
and no negation the fact lacks, scores its lexical share alone and needs no embedding. It
costs at most one embedding per sentence, a small matrix product and set look-ups: nothing
per fact of the knowledge base.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np

from cdr.retrieval.lexical import terms

_WORDS = re.compile(r"[\w']+")

# Chosen on the hand-labelled pairs of the tuning reports (`bench/citations_llm.py
# --calibrate`, docs/results/citations.md): a citation whose fact scores below this is not
# kept, and a sentence no given fact reaches is flagged unsupported.
SUPPORT_THRESHOLD = 0.56
LEXICAL_SHARE = 0.5  # the lexical part of the score; the rest is the cosine
LEXICAL_SURE = 0.9  # a sentence this much made of the fact's words quotes it: lexical alone
SURE_MIN_WORDS = 4  # ...when it has words enough to say so, and no negation the fact lacks
NEGATIONS = frozenset(("not", "no", "never", "cannot", "nor", "neither", "without", "none",
                       "nothing", "nobody", "nowhere"))
_SUFFIXES = ("ing", "ies", "es", "ed", "ly", "s")


def stem(word: str) -> str:
    """A word without a common English ending: enough to match "indexes" with "index"."""
    for suffix in _SUFFIXES:
        if len(word) > len(suffix) + 2 and word.endswith(suffix):
            return word[: -len(suffix)] + ("y" if suffix == "ies" else "")
    return word


def negations(text: str) -> frozenset[str]:
    """The negating words of a text ("n't" counts as "not"): BM25's terms drop them."""
    words = {w.casefold() for w in _WORDS.findall(text)}
    return frozenset((words & NEGATIONS) | ({"not"} if any(w.endswith("n't") for w in words)
                                            else set()))


def lexical_sure(lexical: np.ndarray, sentence_words: Sequence[frozenset[str]],
                 sentence_negations: Sequence[frozenset[str]],
                 fact_negations: Sequence[frozenset[str]]) -> np.ndarray:
    """(sentences × facts): where a sentence quotes a fact — nearly all its content words are
    the fact's, it has `SURE_MIN_WORDS` of them, and it negates nothing the fact does not —
    so that its words alone settle its support."""
    sure = lexical >= LEXICAL_SURE
    for i, words in enumerate(sentence_words):
        if len(words) < SURE_MIN_WORDS:
            sure[i] = False
        elif sentence_negations[i]:
            sure[i] &= np.array([sentence_negations[i] <= f for f in fact_negations], bool)
    return sure


def content_words(text: str) -> frozenset[str]:
    """The stemmed words that carry a text's content (BM25's terms: no function words)."""
    return frozenset(stem(t) for t in terms(text))


def lexical_support(sentence: Sequence[frozenset[str]], facts: Sequence[frozenset[str]]
                    ) -> np.ndarray:
    """(sentences × facts): the share of each sentence's content words found in each fact;
    0 for a sentence with no content words."""
    out = np.zeros((len(sentence), len(facts)), dtype=np.float32)
    for i, words in enumerate(sentence):
        if not words:
            continue
        for j, fact in enumerate(facts):
            out[i, j] = len(words & fact) / len(words)
    return out


def support_scores(lexical: np.ndarray, sentence_vecs: np.ndarray, fact_vecs: np.ndarray,
                   sure: np.ndarray | None = None) -> np.ndarray:
    """(sentences × facts) support: the lexical share where the sentence quotes the fact
    (`sure`, `lexical_sure`), else `LEXICAL_SHARE` of it plus the rest of the cosine (unit
    rows, clipped to [0, 1])."""
    if lexical.size == 0:
        return lexical.astype(np.float32)
    cosine = np.clip(sentence_vecs @ fact_vecs.T, 0.0, 1.0)
    mixed = LEXICAL_SHARE * lexical + (1.0 - LEXICAL_SHARE) * cosine
    return np.asarray(mixed if sure is None else np.where(sure, lexical, mixed), np.float32)


def lexical_scores(lexical: np.ndarray, sure: np.ndarray) -> np.ndarray:
    """`support_scores` where no embedding is known: quoting pairs their lexical share, the
    rest their lexical part alone (a lower bound of their score)."""
    return np.asarray(np.where(sure, lexical, LEXICAL_SHARE * lexical), np.float32)
