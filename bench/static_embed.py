"""A static embedding table distilled from the packaged MiniLM: a candidate first stage for
ingest speed (`bench/ingest_speed.py`), measured, not shipped.

Distillation (the model2vec recipe without its PCA and weighting): every word piece of the
vocabulary runs alone through the default model (`[CLS] piece [SEP]`, mean-pooled as every text
is), and its unit vector is that piece's row. A text's vector is the normalised mean of its
pieces' rows ([CLS] and [SEP] left out), so encoding is a tokeniser call and a gather: no
network. The table is built once (about 30k short texts) and kept in the cache folder.
Its vectors are not the model's, so it has its own identity (`STATIC_MODEL_ID`).
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

import _paths  # noqa: F401  (cdr importable from a checkout)
from cdr import settings
from cdr.errors import EmbeddingModelMismatchError
from cdr.retrieval.embed import default_embedder, validate_texts
from cdr.vectors import unit_rows

STATIC_MODEL_ID = "cdr-bench/all-MiniLM-L6-v2-static"


def distil(path: Path) -> np.ndarray:
    model = default_embedder()
    vocab = model._tok.get_vocab()
    size = max(vocab.values()) + 1
    cls, sep = vocab["[CLS]"], vocab["[SEP]"]
    ids = [[cls, i, sep] for i in range(size)]
    table = np.zeros((size, model.dim), np.float32)
    t0 = time.perf_counter()
    for start in range(0, size, 512):
        rows = np.arange(start, min(start + 512, size))
        batch = np.asarray([ids[i] for i in rows], np.int64)
        table[rows] = model._forward(batch, np.ones(batch.shape, bool))
    print(f"static table: {size} word pieces in {time.perf_counter() - t0:.0f} s", flush=True)
    np.save(path, table)
    return table


class StaticEmbedder:
    """Mean of the distilled rows of a text's word pieces, normalised."""

    model_id = STATIC_MODEL_ID

    def __init__(self, table: np.ndarray | None = None) -> None:
        """The distilled table (built on first use, then read from the cache folder), or
        `table` (one row per word piece of the model's vocabulary)."""
        base = default_embedder()
        self._tok = base._tok
        self._special = {base._tok.token_to_id("[CLS]"), base._tok.token_to_id("[SEP]")}
        if table is None:
            path = settings.cache_dir() / "bench" / "minilm-static.npy"
            path.parent.mkdir(parents=True, exist_ok=True)
            table = np.load(path) if path.exists() else distil(path)
        self.table = np.asarray(table, np.float32)
        self.dim = int(self.table.shape[1])

    def encode(self, texts: Sequence[str], *, batch_size: int = 32, progress: Any = None
               ) -> np.ndarray:
        texts = validate_texts(texts)
        out = np.empty((len(texts), self.dim), np.float32)
        for r, enc in enumerate(self._tok.encode_batch(texts)):
            ids = [i for i in enc.ids if i not in self._special] or enc.ids
            out[r] = self.table[ids].mean(axis=0)
        if progress is not None and texts:
            progress(len(texts))
        return unit_rows(out, lambda _row, n: ValueError(f"{n} zero rows"))


_static: StaticEmbedder | None = None


def static_embedder() -> StaticEmbedder:
    global _static
    if _static is None:
        _static = StaticEmbedder()
    return _static


def static_copy(src: Any, name: str) -> Any:
    """`src` re-embedded by the static table, in its own folder of the retrieval cache."""
    from cdr.ckf import CKF
    from cdr.ckf.reembed import reembed
    from retrieval import CKF_DIR

    recipe = src.recipe
    dst = CKF_DIR / f"{name}-static-{recipe}.ckf"
    if not dst.exists():
        tmp = dst.with_name(dst.name + ".copying")
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(src.path, tmp)
        tmp.rename(dst)
    try:
        return CKF.open(dst, static_embedder())
    except EmbeddingModelMismatchError:  # not re-embedded yet (or a kill left it part way)
        pass
    ckf = CKF.open(dst)
    reembed(ckf, recipe, embedder=static_embedder())
    ckf.close()
    return CKF.open(dst, static_embedder())
