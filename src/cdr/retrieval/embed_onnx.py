"""The default model's float32 network on onnxruntime: the same vectors, faster.

`cdr.retrieval.embed.MiniLMEmbedder` runs all-MiniLM-L6-v2 as a numpy forward pass, one text per
pass (a BLAS matrix product rounds a row differently with the rows beside it, so in a batch a
text's vector would depend on its neighbours). This module runs the float32 ONNX graph that the
int8 path builds (`cdr.retrieval.embed_int8.build_graph`, exact erf GELU) unquantised on
onnxruntime, whose MLAS kernels compute each row of a matrix product alone: a text's vector is
the same bit for bit in any batch of texts of its length, so `MiniLMOnnxEmbedder` batches
texts of equal length (`exact_length_batches`) and gets the matrix products' full speed without
making a vector depend on its batch.

Its vectors are the numpy path's to cosine ≥ 0.9999 (measured min 0.999998 on the reference
texts, `tests/test_embed.py`): within the bound the numpy path itself keeps to
sentence-transformers, so both paths share one model id and one set of calibrated gates
(CRP-SPEC-024 §2.5; `cdr.retrieval.gates`). What computes the vectors is still part of the
embedding cache's key (`cdr.retrieval.embed_cache`), so a cached vector is never one path's
served for the other's.

The graph is built once per weights file and kept in the cache folder (`cdr.settings.cache_dir`),
keyed by the weights' digest and the build; onnx (to build it) and onnxruntime (to run it) are
base dependencies.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from cdr import settings
from cdr.retrieval.embed_int8 import weights_digest

__all__ = ["MAX_BATCH_TOKENS", "exact_length_batches", "float32_model", "float32_session"]

# Largest batch in word pieces (texts x length), as the numpy path's: bounds a worker's
# activations (the (b, heads, L, L) attention scores dominate) to ~150 MB at 256 pieces.
MAX_BATCH_TOKENS = 4096
# Changes whenever the graph changes, so a cached graph of another build is never loaded.
_BUILD_VERSION = 1


def exact_length_batches(order: np.ndarray, sorted_lengths: np.ndarray,
                         batch_size: int) -> list[np.ndarray]:
    """Cut length-sorted rows into batches of texts of one length only: at most `batch_size`
    texts and MAX_BATCH_TOKENS word pieces (a text longer than that alone). No text is ever
    padded, so a batch computes exactly what each of its texts would alone."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    batches: list[np.ndarray] = []
    start = 0
    lengths = sorted_lengths.tolist()
    for i, length in enumerate(lengths):
        count = i - start
        if count and (length != lengths[start] or count == batch_size
                      or (count + 1) * length > MAX_BATCH_TOKENS):
            batches.append(order[start:i])
            start = i
    if len(order):
        batches.append(order[start:])
    return batches


def _weights_digest(path: Path, out_dir: Path) -> str:
    """The weights file's digest, read back from a note the first load left (keyed by the
    file's path, size and modification time) instead of hashing 90 MB on every load."""
    st = path.stat()
    key = hashlib.sha256(repr((str(path.resolve()), st.st_size, st.st_mtime_ns)).encode())
    note = out_dir / f"weights-{key.hexdigest()[:16]}.digest"
    try:
        digest = note.read_text(encoding="ascii").strip()
        if len(digest) == 16:
            return digest
    except OSError:
        pass
    digest = weights_digest(path)
    out_dir.mkdir(parents=True, exist_ok=True)
    part = note.with_name(f"{note.name}.{os.getpid()}.part")
    part.write_text(digest, encoding="ascii")
    os.replace(part, note)
    return digest


def float32_model(root: Path, weights: dict[str, np.ndarray], cfg: dict[str, Any]) -> Path:
    """The float32 graph of the weights in `root`, built and cached on first use (atomically:
    a reader never sees a half-written file, two builders race harmlessly). onnx, slow to
    import (2 s here), is imported only to build it."""
    out_dir = settings.cache_dir() / "onnx"
    build = hashlib.sha256(repr(("fp32", _BUILD_VERSION)).encode()).hexdigest()[:8]
    digest = _weights_digest(root / "model.safetensors", out_dir)
    out = out_dir / f"minilm-fp32-{digest}-{build}.onnx"
    if out.exists():
        return out
    from cdr.retrieval.embed_int8 import build_graph

    graph = build_graph(weights, cfg)  # imports onnx, or says how to install it
    import onnx

    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out_dir) as tmp:
        part = Path(tmp) / "fp32.onnx"
        onnx.save(graph, str(part))
        os.replace(part, out)
    return out


def _runtime() -> Any:
    try:
        import onnxruntime
    except ImportError:
        from cdr.errors import InvalidInputError
        from cdr.retrieval.embed_int8 import int8_missing_message

        raise InvalidInputError(int8_missing_message()) from None
    return onnxruntime


def float32_session(root: Path, weights: dict[str, np.ndarray], cfg: dict[str, Any]) -> Any:
    """An onnxruntime session of the float32 graph, one thread per run: the encoder runs
    batches on its own threads (two workers each on one thread encoded 10-25% more texts/s
    than one run on two threads here, 2 cores), which also shares out the element-wise work."""
    ort = _runtime()
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    graph = float32_model(root, weights, cfg)
    return ort.InferenceSession(str(graph), opts, providers=["CPUExecutionProvider"])
