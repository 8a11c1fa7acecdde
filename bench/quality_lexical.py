"""Lexical help for expanded sub-queries, measured (issue 13): BM25 (`bm25s`, Snowball
stemming via PyStemmer) over the session's gated pool, fused with the cosine by reciprocal
rank, to pick each sub-query's nearest facts for its expansion.

A section title is a few words ("Sleeping", "Introspection"); a small embedding model places
it poorly, while the documents' own word for it ("sleep") is an exact lexical match. The fused
score is Reciprocal Rank Fusion (Cormack, Clarke and Büttcher, SIGIR 2009):
1/(k + rank by cosine) + 1/(k + rank by BM25), k = 60, so neither score's scale matters.
This is a benchmark arm (`GenerationConfig.expansion_scorer`), not a library option: the
report says why (bench/results/quality.md, "Lexical help").
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

RRF_K = 60


def _ranks(scores: np.ndarray) -> np.ndarray:
    """Rank of each row per column, 1 = best (ties broken by row order)."""
    order = np.argsort(-scores, axis=0, kind="stable")
    ranks = np.empty_like(order)
    cols = np.arange(scores.shape[1])
    ranks[order, cols[None, :]] = np.arange(1, scores.shape[0] + 1)[:, None]
    return ranks


class Bm25Fused:
    """`NeighbourScorer`: RRF of the cosine rank and the BM25 rank of each pool fact for each
    sub-query. A sub-query with no term in the pool keeps its cosine order."""

    def __init__(self, k: int = RRF_K) -> None:
        self.k = k

    def __repr__(self) -> str:  # stable across processes: part of the checkpoint key
        return f"Bm25Fused(k={self.k})"

    def bm25(self, queries: Sequence[str], texts: Sequence[str]) -> np.ndarray:
        import bm25s
        import Stemmer

        stem = Stemmer.Stemmer("english")
        tok = dict(stopwords="en", stemmer=stem, return_ids=False, show_progress=False)
        index = bm25s.BM25()
        index.index(bm25s.tokenize(list(texts), **tok), show_progress=False)
        out = np.zeros((len(texts), len(queries)))
        for j, q in enumerate(bm25s.tokenize(list(queries), **tok)):
            if q:
                out[:, j] = index.get_scores(q)
        return out

    def __call__(self, queries: Sequence[str], texts: Sequence[str],
                 dense: np.ndarray) -> np.ndarray:
        dense = np.asarray(dense, dtype=np.float64)
        lex = self.bm25(queries, texts)
        fused = 1.0 / (self.k + _ranks(dense))
        has = lex.max(axis=0) > 0
        fused[:, has] += 1.0 / (self.k + _ranks(lex[:, has]))
        return fused
