"""A `FactIndex` over arrays held in memory: what an external store's collection becomes.

Everything a CKF precomputes at ingest is computed once here, when the index is built: unit
vectors, token counts, 6-gram hashes and their inverted index, so ranking, the n-gram guard,
BM25 fusion and document support run on it exactly as on a CKF (`select` is the shared
`select_rows`). It is read-only: one object is one state of the collection.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from cdr.errors import InvalidInputError
from cdr.ngrams import NgramIndex, ngram_hashes
from cdr.retrieval.factindex import Selection, select_rows
from cdr.text.tokens import count_tokens_batch


def _rows(rows: Iterable[int] | np.ndarray) -> np.ndarray:
    return np.asarray(rows if isinstance(rows, np.ndarray) else list(rows), dtype=np.int64)


def fact_id(content: str) -> str:
    """The id a CKF gives a fact of this content (whitespace runs collapsed, sha256), so a
    session's fact ids mean the same facts on a CKF and on a store holding the same texts."""
    return hashlib.sha256(" ".join(content.split()).encode("utf-8")).hexdigest()[:32]


@dataclass(frozen=True, slots=True)
class StoredFact:
    """One fact of an external collection, as envelopes, prompts and traces read it."""

    row: int
    id: str
    content: str
    source: str
    section: str
    tokens: int
    importance: float = 1.0
    is_code: bool = False


class ArrayFactIndex:
    """Facts from `contents` (with their `sources` and `sections`) and their unit `vectors`
    under the embedding identity `model_id`, read through `embedder`."""

    def __init__(self, vectors: np.ndarray, contents: Sequence[str], sources: Sequence[str],
                 sections: Sequence[str], *, model_id: str, embedder: Any,
                 path: str | Path) -> None:
        emb = np.ascontiguousarray(vectors, dtype=np.float32)
        n = len(contents)
        if emb.ndim != 2 or emb.shape[0] != n or len(sources) != n or len(sections) != n:
            raise InvalidInputError(f"{path}: {emb.shape} vectors for {n} texts, "
                                    f"{len(sources)} sources, {len(sections)} sections")
        norms = np.linalg.norm(emb, axis=1)
        if n and not (np.isfinite(norms).all() and (norms > 0).all()):
            raise InvalidInputError(f"{path}: a vector is zero or not finite")
        self._emb = emb / norms[:, None] if n else emb
        self._contents = list(contents)
        self._sources = list(map(str, sources))
        self._sections = list(map(str, sections))
        self._ids = [fact_id(c) for c in self._contents]
        self._tokens = count_tokens_batch(self._contents)
        self._ngrams = NgramIndex.from_hash_lists(ngram_hashes(c) for c in self._contents)
        self._model_id = model_id
        self._embedder = embedder
        self._path = str(path)
        digest = hashlib.sha256("\n".join(self._ids).encode()).digest()
        self._generation = int.from_bytes(digest[:7], "big")
        # points the store held that are not facts here, by reason (`cdr.stores.qdrant`)
        self.skipped: dict[str, int] = {}

    # ------------------------------------------------------------------ the FactIndex protocol

    @property
    def model_id(self) -> str:
        return self._model_id

    @property
    def dim(self) -> int:
        return int(self._emb.shape[1])

    @property
    def embedder(self) -> Any:
        return self._embedder

    @property
    def path(self) -> str:
        return self._path

    @property
    def generation(self) -> int:
        return self._generation

    @property
    def n_rows(self) -> int:
        return len(self._contents)

    @cached_property
    def active(self) -> np.ndarray:
        return np.ones(self.n_rows, dtype=bool)

    @cached_property
    def importance(self) -> np.ndarray:
        return np.ones(self.n_rows, dtype=np.float32)

    @property
    def token_counts(self) -> np.ndarray:
        return self._tokens

    @property
    def ngram_offsets(self) -> np.ndarray:
        return self._ngrams.offsets

    @property
    def ngram_hashes(self) -> np.ndarray:
        return self._ngrams.hashes

    @property
    def ngram_index(self) -> NgramIndex:
        return self._ngrams

    @property
    def embeddings(self) -> np.ndarray:
        return self._emb

    def select(self, query_vector: Any, min_relevance: float,
               limit: int | None = None) -> Selection:
        q = np.asarray(query_vector, dtype=np.float32)
        if q.shape != (self.dim,):
            raise InvalidInputError(f"query vector of shape {q.shape}; this index is {self.dim}-d")
        return select_rows(self._emb, self.active, q, min_relevance, limit)

    def facts(self, rows: Iterable[int] | np.ndarray) -> list[StoredFact]:
        return [StoredFact(r, self._ids[r], self._contents[r], self._sources[r],
                           self._sections[r], int(self._tokens[r]))
                for r in _rows(rows).tolist()]

    def fact_ids(self, rows: Iterable[int] | np.ndarray) -> list[str]:
        return [self._ids[r] for r in _rows(rows).tolist()]

    def vectors(self, rows: Iterable[int] | np.ndarray) -> np.ndarray:
        out: np.ndarray = self._emb[_rows(rows)]
        return out

    def stats(self) -> dict[str, Any]:
        return {"model_id": self.model_id, "dim": self.dim, "generation": self.generation,
                "rows": self.n_rows, "active_facts": self.n_rows,
                "documents": len(set(self._sources)), "backend": "external store"}

    def close(self) -> None:
        """Nothing to release: the collection was read into memory when the index was made."""
