"""From a store's texts and vectors to a fact index: the parts every store shares — the
vectors' width, the §2.5 identity check, the in-memory index.

A store's collection does not say which model made its vectors, and cosine across models
means nothing (spec §2.5). So the model is named (an `--embedder` spec; the default is the
offline MiniLM) and checked on the collection itself: up to `VERIFY_SAMPLE` of its texts,
spread over it, are embedded again and must come back at cosine ≥ `VERIFY_COSINE` to their
stored vectors. Vectors another model made, or made from another text than the one read, are
refused with the median cosine found.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from cdr.errors import InvalidInputError
from cdr.stores.array_index import ArrayFactIndex

VERIFY_SAMPLE = 8
VERIFY_COSINE = 0.97


def verify_identity(where: str, embedder: Any, vectors: np.ndarray, texts: Sequence[str]) -> None:
    """Refuse `vectors` that `embedder` did not make from `texts` (see the module doc)."""
    if not len(texts):
        return
    picks = np.unique(np.linspace(0, len(texts) - 1, min(VERIFY_SAMPLE, len(texts))).astype(int))
    again = np.asarray(embedder.encode([texts[i] for i in picks]), dtype=np.float32)
    stored = vectors[picks] / np.linalg.norm(vectors[picks], axis=1, keepdims=True)
    cos = np.einsum("ij,ij->i", again, stored)
    if float(cos.min()) < VERIFY_COSINE:
        raise InvalidInputError(
            f"{where}: its vectors were not made by {embedder.model_id} from the points' "
            f"text (cosine {float(np.median(cos)):.2f} median over {len(picks)} sampled "
            f"points, {VERIFY_COSINE} needed); name the model that made them with ?model= "
            "(model=... in Python) or the payload key that holds the embedded text with ?text=")


def collection_index(vectors: Sequence[Any] | np.ndarray, texts: Sequence[str],
                     sources: Sequence[str], sections: Sequence[str], *, model: str,
                     where: str, skipped: dict[str, int] | None = None) -> ArrayFactIndex:
    """The fact index of a store's collection, its identity checked against `model`."""
    from cdr.retrieval.embed import get_embedder

    embedder = get_embedder(model)
    dim = int(embedder.dim)
    rows = [np.asarray(v, dtype=np.float32).ravel() for v in vectors]
    for i, v in enumerate(rows):
        if v.shape != (dim,):
            raise InvalidInputError(
                f"{where}: point {i} has a vector of width {v.shape[0]}; the model "
                f"{model!r} makes {dim}-d vectors (name the model that made them)")
    matrix = np.vstack(rows) if rows else np.zeros((0, dim), np.float32)
    verify_identity(where, embedder, matrix, texts)
    index = ArrayFactIndex(matrix, texts, sources, sections, model_id=embedder.model_id,
                           embedder=embedder, path=where)
    index.skipped.update(skipped or {})
    return index
