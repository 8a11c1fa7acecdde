"""How well a fact supports a sentence: the score every citation is checked by.

A sentence a model wrote from a fact shares the fact's words (names, numbers, terms) and its
meaning. Neither alone is enough: a paraphrase keeps the meaning in other words, and a
sentence can reuse a fact's terms to say something the fact does not. The score is the mean of
the two — the share of the sentence's content words found in the fact (light stemming, so
"indexes" meets "index"), and the cosine of the two embeddings with the knowledge base's own
model — and is checked against one threshold, calibrated on labelled sentences
(docs/citations.md, "Calibration"). A sentence whose content words are (nearly) all the
fact's (`LEXICAL_SURE`: it quotes the fact, as the extractive writer does) scores its lexical
share alone and needs no embedding. It costs at most one embedding per sentence, a small matrix
product and set look-ups: nothing per fact of the knowledge base.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from cdr.retrieval.lexical import terms

# Chosen on the tuning sample (docs/citations.md, "Calibration"): a citation whose fact scores
# below this is not kept, and a sentence no given fact reaches is flagged unsupported.
SUPPORT_THRESHOLD = 0.5
LEXICAL_SHARE = 0.5  # the lexical part of the score; the rest is the cosine
LEXICAL_SURE = 0.9  # a sentence this much made of the fact's words quotes it: lexical alone
_SUFFIXES = ("ing", "ies", "es", "ed", "ly", "s")


def stem(word: str) -> str:
    """A word without a common English ending: enough to match "indexes" with "index"."""
    for suffix in _SUFFIXES:
        if len(word) > len(suffix) + 2 and word.endswith(suffix):
            return word[: -len(suffix)] + ("y" if suffix == "ies" else "")
    return word


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


def support_scores(lexical: np.ndarray, sentence_vecs: np.ndarray, fact_vecs: np.ndarray
                   ) -> np.ndarray:
    """(sentences × facts) support: the lexical share where it is `LEXICAL_SURE`, else
    `LEXICAL_SHARE` of it plus the rest of the cosine (unit rows, clipped to [0, 1])."""
    if lexical.size == 0:
        return lexical.astype(np.float32)
    cosine = np.clip(sentence_vecs @ fact_vecs.T, 0.0, 1.0)
    mixed = LEXICAL_SHARE * lexical + (1.0 - LEXICAL_SHARE) * cosine
    return np.asarray(np.where(lexical >= LEXICAL_SURE, lexical, mixed), np.float32)


def lexical_scores(lexical: np.ndarray) -> np.ndarray:
    """`support_scores` where no embedding is known: sure pairs their lexical share, the rest
    their lexical part alone (a lower bound of their score)."""
    return np.asarray(np.where(lexical >= LEXICAL_SURE, lexical, LEXICAL_SHARE * lexical),
                      np.float32)
