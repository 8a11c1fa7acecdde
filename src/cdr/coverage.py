"""Coverage Set and Residual Set (CRP-SPEC-024 §2.1, §3).

The Coverage Set keeps its entries (for headers, traces and serialisation). Because entries are
unit vectors, the spec's weighted mean of cosines equals one dot product with the weighted
centroid (docs/design.md §2 "The math, and why it is cheap"):

    Σ wᵢ (f·eᵢ) / Σ wᵢ = f · (Σ wᵢ eᵢ / Σ wᵢ)

so scoring N facts is one matrix-vector product, whatever the number of entries.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from cdr.errors import InvalidInputError
from cdr.vectors import as_vector, from_b64, normalize, to_b64, unit_matrix


@dataclass(frozen=True)
class CoverageEntry:
    """One addressed sub-query: what was covered, how deeply, and in which window."""

    embedding: np.ndarray
    depth_weight: float
    window_number: int


def weighted_centroid(embeddings: np.ndarray, weights: object,
                      dtype: type = np.float32) -> np.ndarray | None:
    """Σ wᵢ eᵢ / Σ wᵢ, summed in float64 (None while the total weight is 0).

    Not normalised: with unit rows eᵢ, its dot with a unit f *is* the weighted mean cosine
    of f to the entries (docs/design.md §2 "The math, and why it is cheap"), which is what the
    Coverage-Score needs."""
    w = np.asarray(weights, dtype=np.float64).reshape(-1)
    total = float(w.sum())
    if total <= 0.0:
        return None
    return (w @ np.asarray(embeddings, dtype=np.float64) / total).astype(dtype)


def check_depth(depth: float) -> float:
    """Depth weights are fractions (§3.2): anything outside [0, 1] or non-finite is refused."""
    d = float(depth)
    if not np.isfinite(d) or d < 0.0 or d > 1.0:
        raise InvalidInputError(f"depth_weight must be within [0, 1], got {depth!r}")
    return d


class CoverageSet:
    """The entries, scored through their weighted centroid, so `coverage_scores` is one
    mat-vec whatever the number of entries.

    Zero-weight entries are accepted and counted (they are in the Coverage-Depth header) but
    contribute nothing; while the total weight is 0 every coverage score is 0. Duplicate entries
    are legitimate (a sub-query covered in two windows) and count twice, as the spec's sum does.
    """

    def __init__(self, dim: int) -> None:
        if dim < 1:
            raise InvalidInputError(f"dimension must be positive, got {dim}")
        self.dim = dim
        self._embeddings: list[np.ndarray] = []
        self._weights: list[float] = []
        self._windows: list[int] = []

    def __len__(self) -> int:
        return len(self._weights)

    def __bool__(self) -> bool:
        return bool(self._weights)

    def add(self, embedding: object, depth_weight: float, window_number: int) -> CoverageEntry:
        """Append an entry; the embedding is normalised (cosine is what the spec asks for)."""
        e = normalize(as_vector(embedding, "coverage embedding", self.dim), "coverage embedding")
        w = check_depth(depth_weight)
        if int(window_number) < 0:
            raise InvalidInputError(f"window_number must be >= 0, got {window_number}")
        self._embeddings.append(e)
        self._weights.append(w)
        self._windows.append(int(window_number))
        return CoverageEntry(e, w, int(window_number))

    @property
    def entries(self) -> list[CoverageEntry]:
        return [
            CoverageEntry(e, w, n)
            for e, w, n in zip(self._embeddings, self._weights, self._windows, strict=True)
        ]

    @property
    def embeddings(self) -> np.ndarray:
        if not self._embeddings:
            return np.zeros((0, self.dim), dtype=np.float32)
        return np.stack(self._embeddings)

    @property
    def weights(self) -> np.ndarray:
        return np.asarray(self._weights, dtype=np.float32)

    @property
    def window_numbers(self) -> np.ndarray:
        return np.asarray(self._windows, dtype=np.int32)

    def centroid(self) -> np.ndarray | None:
        """The entries' `weighted_centroid` (None while their total weight is 0)."""
        return weighted_centroid(self.embeddings, self._weights)

    def to_dict(self) -> dict[str, Any]:
        """Embeddings as base64 float32, weights and window numbers as lists (exact)."""
        return {"embeddings": to_b64(self.embeddings), "weights": list(self._weights),
                "windows": list(self._windows)}

    @classmethod
    def from_dict(cls, dim: int, data: Mapping[str, Any]) -> CoverageSet:
        weights = data["weights"]
        coverage = cls(dim)
        embeddings = from_b64(data["embeddings"], np.float32, (len(weights), dim))
        for e, w, n in zip(embeddings, weights, data["windows"], strict=True):
            coverage.add(e, w, n)
        return coverage

    def coverage_scores(self, facts: np.ndarray) -> np.ndarray:
        """Weighted mean cosine of each (unit) fact row to the entries; 0 when empty."""
        c = self.centroid()
        if c is None:
            return np.zeros(facts.shape[0], dtype=np.float32)
        out: np.ndarray = facts @ c
        return out


@dataclass(frozen=True)
class SubQuery:
    """A part of the task decomposition (§3.1): id, text and the words it should receive."""

    id: str
    text: str
    expected_words: int = 300

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "text": self.text, "expected_words": self.expected_words}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SubQuery:
        return cls(data["id"], data["text"], int(data["expected_words"]))


class ResidualSet:
    """Sub-queries not yet addressed, with their (unit) embeddings stacked for one mat-mul."""

    def __init__(self, sub_queries: list[SubQuery], embeddings: object, dim: int) -> None:
        self.dim = dim
        self.sub_queries = list(sub_queries)
        emb = unit_matrix(embeddings, "residual embeddings", dim)
        if emb.shape[0] != len(self.sub_queries):
            raise InvalidInputError(
                f"residual set: {len(self.sub_queries)} sub-queries but {emb.shape[0]} embeddings"
            )
        self.embeddings = emb if emb.shape[0] else np.zeros((0, dim), np.float32)

    def __len__(self) -> int:
        return len(self.sub_queries)

    @property
    def ids(self) -> list[str]:
        return [sq.id for sq in self.sub_queries]

    def residual_pull(self, facts: np.ndarray) -> np.ndarray:
        """max cosine of each fact to the residual sub-queries (§2.2); 0 when empty."""
        if not self.sub_queries:
            return np.zeros(facts.shape[0], dtype=np.float32)
        out: np.ndarray = (facts @ self.embeddings.T).max(axis=1)
        return out
