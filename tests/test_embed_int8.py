"""The opt-in int8 embedding path (`cdr.retrieval.embed_int8`, issue 26): its own identity, its
vectors close to the default path's, a text's vector independent of its batch, mixing the two
paths refused with a message naming both, and a CKF moved from one path to the other by
`reembed`. The default path's vectors are checked unchanged in `tests/test_embed.py`; the
refusal through the real `cdr` command line in `tests/test_ckf_cli_embed_paths.py`."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")

from cdr.ckf import CKF, DocumentInput, ingest_texts
from cdr.ckf.reembed import reembed
from cdr.errors import EmbeddingModelMismatchError, InvalidInputError
from cdr.retrieval.embed import (
    MINILM_INT8_MODEL_ID,
    MINILM_MODEL_ID,
    MiniLMInt8Embedder,
    default_embedder,
    embedder_for,
    get_embedder,
)
from cdr.retrieval.gates import calibrated_gate

DATA = Path(__file__).parent / "data"


@pytest.fixture(autouse=True)
def _no_embedding_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests are about the model's own forward pass (its vectors, batching, threads,
    progress), so every vector here is computed, never read from the run's embedding cache
    (`CDR_EMBED_CACHE`, set for the whole run by tests/conftest.py)."""
    monkeypatch.delenv("CDR_EMBED_CACHE", raising=False)
DOCS = [
    DocumentInput("final.md", "# Cup final 1923\n\n## Attendance\n\n"
                  "The match drew a crowd far larger than the ground could hold. Police on "
                  "horseback cleared the pitch before kick-off.\n\n## Result\n\n"
                  "The home side won by two goals to nil after a scoreless first half.\n"),
    DocumentInput("games.md", "# Summer Games 1924\n\n## Ceremony\n\n"
                  "The opening ceremony was held in the main stadium in front of the crowd. "
                  "Athletes from forty nations marched behind their flags.\n"),
]


@pytest.fixture(scope="module")
def int8() -> MiniLMInt8Embedder:
    logging.getLogger().setLevel(logging.ERROR)  # onnxruntime's advice while it quantises
    return get_embedder("minilm-int8")  # type: ignore[return-value]


@pytest.fixture(scope="module")
def texts() -> list[str]:
    return [str(t) for t in np.load(DATA / "minilm_reference.npz")["texts"]]


def test_its_own_identity_and_spec_names(int8: MiniLMInt8Embedder) -> None:
    assert int8.model_id == MINILM_INT8_MODEL_ID == f"{MINILM_MODEL_ID}+int8"
    assert int8.model_id != default_embedder().model_id and int8.dim == 384
    assert get_embedder("int8") is int8 and get_embedder(MINILM_INT8_MODEL_ID) is int8
    assert embedder_for(f"{MINILM_INT8_MODEL_ID}#title-section-short") is int8
    assert embedder_for(f"{MINILM_MODEL_ID}#title-section-short") is default_embedder()


def test_vectors_are_close_to_the_float32_paths(int8: MiniLMInt8Embedder,
                                                texts: list[str]) -> None:
    """The bound holds on every x86 CPU kind because the integer sums are exact on each
    (`test_weights_fit_the_kernels_without_vnni`). Measured on these 31 texts (some past the
    256-piece cut) on an AVX2 CPU without VNNI: cosine to the float32 vectors min 0.9892, mean
    0.9945 (8-bit weights gave 0.9661 there, 0.9896 on an AVX-512 VNNI CPU)."""
    fp32 = np.load(DATA / "minilm_fp32_vectors.npy")
    got = int8.encode(texts)
    assert got.dtype == np.float32 and got.shape == fp32.shape
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    cos = np.sum(got * fp32, axis=1)
    assert cos.min() >= 0.985 and cos.mean() >= 0.99, (cos.min(), cos.mean())


def test_weights_fit_the_kernels_without_vnni(int8: MiniLMInt8Embedder) -> None:
    """Without VNNI, onnxruntime adds two uint8 x int8 products into a saturating int16, so the
    path is CPU-independent only if 255 * max|w| * 2 fits in it: every quantised weight of the
    cached graph is within 7 bits, and the products kept in float32 are not quantised."""
    import json

    import onnx
    from onnx import numpy_helper
    from safetensors.numpy import load_file

    from cdr.retrieval.embed_int8 import FLOAT_NODES, quantised_model

    root = int8._root
    path = quantised_model(root, load_file(str(root / "model.safetensors")),
                           json.loads((root / "config.json").read_text()))
    model = onnx.load(str(path))
    weights = [numpy_helper.to_array(t).astype(np.int32) for t in model.graph.initializer
               if t.data_type == onnx.TensorProto.INT8 and len(t.dims) == 2]  # not zero points
    assert len(weights) == 6 * 6 - len(FLOAT_NODES)  # 6 products a layer, 6 layers
    widest = max(int(np.abs(w).max()) for w in weights)
    assert 255 * widest * 2 <= np.iinfo(np.int16).max, widest
    matmuls = {n.name for n in model.graph.node if n.op_type == "MatMul"}
    assert set(FLOAT_NODES) <= matmuls


@pytest.mark.parametrize("batch_size", [1, 4, 64])
def test_a_texts_vector_does_not_depend_on_its_batch(int8: MiniLMInt8Embedder,
                                                     texts: list[str], batch_size: int) -> None:
    """Dynamic quantisation scales per activation matrix: in a shared batch, a text's vector
    would depend on its neighbours. Each text runs alone, so it is the same bits in any batch,
    order or call."""
    whole = int8.encode(texts)
    np.testing.assert_array_equal(int8.encode(texts, batch_size=batch_size), whole)
    np.testing.assert_array_equal(int8.encode(texts[::-1])[::-1], whole)
    np.testing.assert_array_equal(int8.encode(texts[3:5]), whole[3:5])


def test_an_int8_ckf_refuses_the_float32_path_and_back(int8: MiniLMInt8Embedder,
                                                      tmp_path: Path) -> None:
    with CKF.create(tmp_path / "int8.ckf", int8) as ckf:
        ingest_texts(ckf, DOCS)
        assert ckf.model_id == f"{MINILM_INT8_MODEL_ID}#title-section-short"
    with pytest.raises(EmbeddingModelMismatchError, match="path mismatch") as err:
        CKF.open(tmp_path / "int8.ckf", default_embedder())
    assert "int8 path" in str(err.value) and "float32 path" in str(err.value)
    with CKF.create(tmp_path / "fp32.ckf") as ckf:
        ingest_texts(ckf, DOCS)
    with pytest.raises(EmbeddingModelMismatchError, match="path mismatch"):
        CKF.open(tmp_path / "fp32.ckf", int8)


def test_an_int8_ckf_opened_without_an_embedder_queries_with_its_own_path(
        int8: MiniLMInt8Embedder, tmp_path: Path) -> None:
    with CKF.create(tmp_path / "kb.ckf", int8) as ckf:
        ingest_texts(ckf, DOCS)
    with CKF.open(tmp_path / "kb.ckf") as ckf:
        q = ckf.encode_query("crowd at the cup final")
        np.testing.assert_array_equal(q, int8.encode(["crowd at the cup final"])[0])


def test_reembed_moves_a_ckf_to_the_int8_path_and_back(int8: MiniLMInt8Embedder,
                                                       tmp_path: Path) -> None:
    with CKF.create(tmp_path / "fresh.ckf", int8) as ckf:
        ingest_texts(ckf, DOCS)
        want = ckf.vectors(np.arange(ckf.n_rows)).copy()
    with CKF.create(tmp_path / "kb.ckf") as ckf:
        ingest_texts(ckf, DOCS)
        old = ckf.vectors(np.arange(ckf.n_rows)).copy()
        rep = reembed(ckf, "title-section-short", embedder=int8, chunk_rows=3)
        assert rep.model_id == ckf.model_id == f"{MINILM_INT8_MODEL_ID}#title-section-short"
        # one text per run: the same bits as a fresh int8 ingest, whatever the chunks
        np.testing.assert_array_equal(ckf.vectors(np.arange(ckf.n_rows)), want)
        assert ckf.check() == []
        back = reembed(ckf, "title-section-short", embedder=default_embedder())
        assert back.model_id == f"{MINILM_MODEL_ID}#title-section-short"
        np.testing.assert_allclose(ckf.vectors(np.arange(ckf.n_rows)), old, atol=2e-6)


def test_the_gate_of_the_int8_path_is_its_own(int8: MiniLMInt8Embedder) -> None:
    """Chosen on the TUNE tasks of the int8 path's own CKFs (bench/embed_paths.py)."""
    ident = f"{MINILM_INT8_MODEL_ID}#title-section-short"
    assert calibrated_gate(ident) == 0.45
    assert calibrated_gate(ident, "bm25") == 0.40
    assert calibrated_gate(ident, "bm25", "support") == 0.30


def test_without_onnxruntime_the_error_names_the_extra(monkeypatch, tmp_path: Path) -> None:
    import builtins

    real = builtins.__import__

    def no_ort(name: str, *args, **kwargs):
        if name.startswith("onnxruntime"):
            raise ImportError(name)
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_ort)
    with pytest.raises(InvalidInputError, match=r"cdr-retrieval\[int8\]"):
        MiniLMInt8Embedder()


def test_the_cached_graph_is_reused(int8: MiniLMInt8Embedder, tmp_path: Path,
                                    monkeypatch) -> None:
    """A second load reads the cached int8 graph; a damaged cache folder does not matter to a
    fresh one (CDR_CACHE_DIR elsewhere builds anew, same vectors)."""
    monkeypatch.setenv("CDR_CACHE_DIR", str(tmp_path / "cache"))
    fresh = MiniLMInt8Embedder()
    built = list((tmp_path / "cache" / "onnx").glob("minilm-int8-*.onnx"))
    assert len(built) == 1
    np.testing.assert_array_equal(fresh.encode(["a crowd at the final"]),
                                  int8.encode(["a crowd at the final"]))
    shutil.rmtree(tmp_path / "cache")


def test_a_shard_set_keeps_its_path_when_ingested_again(int8: MiniLMInt8Embedder,
                                                        tmp_path: Path) -> None:
    """A shard set built by the int8 path takes new documents with that path when no embedder
    is named, and refuses the float32 one."""
    from cdr.cluster.shardset import ingest_sharded, read_manifest

    docs = tmp_path / "docs"
    docs.mkdir()
    for d in DOCS:
        (docs / d.source).write_text(str(d.data), encoding="utf-8")
    ingest_sharded(tmp_path / "set", [str(docs)], 2, embedder=int8)
    assert read_manifest(tmp_path / "set").model_id.startswith(MINILM_INT8_MODEL_ID)
    (docs / "more.md").write_text("# More\n\nA third page arrived later, with a sentence of "
                                  "its own about the crowd.\n", encoding="utf-8")
    rep = ingest_sharded(tmp_path / "set", [str(docs)], 2)
    assert rep.facts_added > 0
    with pytest.raises(EmbeddingModelMismatchError, match="path mismatch"):
        (docs / "last.md").write_text("# Last\n\nOne more page about the final.\n",
                                      encoding="utf-8")
        ingest_sharded(tmp_path / "set", [str(docs)], 2, embedder=default_embedder())
