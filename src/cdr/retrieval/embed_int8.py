"""The opt-in fast embedding path: all-MiniLM-L6-v2 with int8 weights on onnxruntime.

The default model runs float32 matrix products, on onnxruntime (`cdr.retrieval.embed_onnx`,
which runs the graph `build_graph` makes unquantised) or numpy's BLAS
(`cdr.retrieval.embed.MiniLMEmbedder`); either already uses most of what fp32 gives on a small
CPU. This path builds an ONNX graph of the same network from the same shipped
weights, quantises its matrix products to
int8 with onnxruntime's dynamic quantisation (weights int8 per output channel, activations
quantised per batch at run time), and runs it on onnxruntime, whose int8 kernels use the CPU's
VNNI instructions where it has them.

The weights are quantised to 7 bits (`reduce_range`, |w| <= 64) so that the integer arithmetic is
exact on every x86 kernel. Without VNNI (AVX2, AVX-512 without VNNI) onnxruntime multiplies uint8
activations by int8 weights with `vpmaddubsw`, which adds two products into a saturating int16:
255 x 127 x 2 overflows it, 255 x 64 x 2 = 32,640 does not. With 8-bit weights a CPU without VNNI
saturated and gave vectors as far as cosine 0.966 from the float32 ones, where a VNNI CPU gave
0.990; with 7-bit weights every kernel computes the same integers, and the vectors differ between
CPUs only by the float rounding of the element-wise operators.

Its vectors are close to the default's but not the same, so it is its own embedding identity
(CRP-SPEC-024 §2.5): `cdr.retrieval.embed.MINILM_INT8_MODEL_ID`. The embedder,
`cdr.retrieval.embed.MiniLMInt8Embedder`, is the default one with this network in place of
numpy's; this module builds and loads the network. A CKF, session or shard set records the identity
that built it, and every check that compares identities refuses to mix the two
(`cdr.retrieval.fact_recipe.bind`). Its relevance gate is calibrated on its own
(`cdr.retrieval.gates`).

The quantised graph is built once per weights file and kept in the cache folder
(`cdr.settings.cache_dir`), keyed by the weights' digest and the onnxruntime version, so a load
after the first takes well under a second. onnx and onnxruntime are base dependencies (the
default embedder runs on onnxruntime too); the `int8` extra names them still.
"""

from __future__ import annotations

import hashlib
import math
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from cdr import settings
from cdr.errors import InvalidInputError
from cdr.retrieval.models import sha256_file

__all__ = ["FLOAT_NODES", "REDUCE_RANGE", "build_graph", "int8_missing_message", "int8_session",
           "quantised_model"]

_OPSET = 17  # LayerNormalization
# Matrix products left in float32. The first two layers' FFN outputs read GELU activations with
# a few channels far larger than the rest, which one int8 scale per batch flattens. With 8-bit
# weights, leaving layer 0's in float32 was enough (300 Python-reference paragraphs: cosine to the
# float32 vectors min 0.988 / mean 0.994 quantised, 0.991 / 0.995 not). With 7-bit weights
# (`REDUCE_RANGE`), on the 31 test texts of `tests/data/minilm_reference.npz`: layer 0 alone
# min 0.9851 / mean 0.9939; layer 0 and 1 min 0.9892 / 0.9945 (layer 0 with layer 5, 4, 0's
# intermediate or 0's attention output instead of 1: 0.9853-0.9878). Checked after the choice on
# 238 held-out standard-library docstrings: 0.9911 / 0.9951 (layer 0 alone 0.9900 / 0.9944), at
# 75 texts/s against 88 for layer 0 alone and 36 for the float32 numpy path (AMD EPYC, AVX2).
FLOAT_NODES = ("l0.ffn.mm", "l1.ffn.mm")
# 7-bit weights: exact integer sums on kernels without VNNI (the module's docstring).
REDUCE_RANGE = True
# Changes whenever the graph or its quantisation changes, so a cached graph of another build is
# never loaded (it is part of the cache file's name with FLOAT_NODES and REDUCE_RANGE).
_BUILD_VERSION = 2


def int8_missing_message() -> str:
    return ("the onnxruntime embedders (the default MiniLM, minilm-int8) need onnx and "
            "onnxruntime, dependencies of cdr-retrieval this install lacks: pip install "
            "'cdr-retrieval[int8]' puts them back; --embedder minilm-numpy runs without them")


def _import_runtime() -> tuple[Any, Any]:
    try:
        import onnx
        import onnxruntime
    except ImportError:
        raise InvalidInputError(int8_missing_message()) from None
    return onnx, onnxruntime


def build_graph(weights: dict[str, np.ndarray], cfg: dict[str, Any]) -> Any:
    """The float32 ONNX graph of the BERT encoder: (input_ids (b, L) int64, positions (L,)
    int64, key_bias (b, 1, 1, L) float32) -> hidden (b, L, d). Pooling and normalisation stay
    in numpy, as in the default path; GELU is the exact (erf) form the model was trained with."""
    onnx, _ = _import_runtime()
    from onnx import TensorProto, helper, numpy_helper

    w = {k.removeprefix("bert."): v for k, v in weights.items()}
    d, heads = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
    hd = d // heads
    eps = float(cfg.get("layer_norm_eps", 1e-12))
    inits: list[Any] = []
    nodes: list[Any] = []

    def const(name: str, value: np.ndarray) -> str:
        inits.append(numpy_helper.from_array(np.ascontiguousarray(value), name))
        return name

    def node(op: str, ins: list[str], out: str, **attrs: Any) -> str:
        nodes.append(helper.make_node(op, ins, [out], name=out, **attrs))
        return out

    def linear(x: str, weight: np.ndarray, bias: np.ndarray, name: str) -> str:
        y = node("MatMul", [x, const(f"{name}.w", weight.T.astype(np.float32))], f"{name}.mm")
        return node("Add", [y, const(f"{name}.b", bias.astype(np.float32))], name)

    def layer_norm(x: str, prefix: str, name: str) -> str:
        return node("LayerNormalization", [x, const(f"{name}.g", w[f"{prefix}.weight"]),
                                           const(f"{name}.beta", w[f"{prefix}.bias"])],
                    name, axis=-1, epsilon=eps)

    pos_table = w["embeddings.position_embeddings.weight"] + w[
        "embeddings.token_type_embeddings.weight"][0]
    x = node("Gather", [const("word", w["embeddings.word_embeddings.weight"]), "input_ids"],
             "emb.word")
    pos = node("Gather", [const("pos", pos_table), "positions"], "emb.pos")
    x = node("Add", [x, pos], "emb.sum")
    x = layer_norm(x, "embeddings.LayerNorm", "emb.ln")
    heads_shape = const("shape.heads", np.array([0, 0, heads, hd], np.int64))
    flat_shape = const("shape.flat", np.array([0, 0, d], np.int64))
    scale = const("scale", np.array(1.0 / math.sqrt(hd), np.float32))
    half, one = const("half", np.array(0.5, np.float32)), const("one", np.array(1.0, np.float32))
    rsqrt2 = const("rsqrt2", np.array(1.0 / math.sqrt(2.0), np.float32))
    for i in range(int(cfg["num_hidden_layers"])):
        p, n = f"encoder.layer.{i}", f"l{i}"
        a = f"{p}.attention"

        def proj(kind: str, perm: list[int], a: str = a, n: str = n, x: str = x) -> str:
            y = linear(x, w[f"{a}.self.{kind}.weight"], w[f"{a}.self.{kind}.bias"],
                       f"{n}.{kind}")
            y = node("Reshape", [y, heads_shape], f"{n}.{kind}.heads")
            return node("Transpose", [y], f"{n}.{kind}.t", perm=perm)

        q = proj("query", [0, 2, 1, 3])
        k = proj("key", [0, 2, 3, 1])
        v = proj("value", [0, 2, 1, 3])
        s = node("MatMul", [q, k], f"{n}.scores")
        s = node("Mul", [s, scale], f"{n}.scaled")
        s = node("Add", [s, "key_bias"], f"{n}.masked")
        s = node("Softmax", [s], f"{n}.probs", axis=-1)
        c = node("MatMul", [s, v], f"{n}.ctx")
        c = node("Transpose", [c], f"{n}.ctx.t", perm=[0, 2, 1, 3])
        c = node("Reshape", [c, flat_shape], f"{n}.ctx.flat")
        o = linear(c, w[f"{a}.output.dense.weight"], w[f"{a}.output.dense.bias"], f"{n}.attn")
        o = node("Add", [o, x], f"{n}.attn.res")
        x = layer_norm(o, f"{a}.output.LayerNorm", f"{n}.ln1")
        h = linear(x, w[f"{p}.intermediate.dense.weight"], w[f"{p}.intermediate.dense.bias"],
                   f"{n}.inter")
        g = node("Mul", [h, rsqrt2], f"{n}.gelu.s")
        g = node("Erf", [g], f"{n}.gelu.erf")
        g = node("Add", [g, one], f"{n}.gelu.1p")
        g = node("Mul", [h, g], f"{n}.gelu.x")
        g = node("Mul", [g, half], f"{n}.gelu")
        f = linear(g, w[f"{p}.output.dense.weight"], w[f"{p}.output.dense.bias"], f"{n}.ffn")
        f = node("Add", [f, x], f"{n}.ffn.res")
        x = layer_norm(f, f"{p}.output.LayerNorm", f"{n}.ln2")
    nodes.append(helper.make_node("Identity", [x], ["hidden"], name="hidden"))
    graph = helper.make_graph(
        nodes, "minilm",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["b", "L"]),
         helper.make_tensor_value_info("positions", TensorProto.INT64, ["L"]),
         helper.make_tensor_value_info("key_bias", TensorProto.FLOAT, ["b", 1, 1, "L"])],
        [helper.make_tensor_value_info("hidden", TensorProto.FLOAT, ["b", "L", d])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", _OPSET)])
    model.ir_version = min(model.ir_version, 9)
    onnx.checker.check_model(model)
    return model


def weights_digest(path: Path) -> str:
    """The weights file's short identity in a cached graph's name (both onnxruntime paths)."""
    return sha256_file(path)[:16]


def quantised_model(root: Path, weights: dict[str, np.ndarray], cfg: dict[str, Any]) -> Path:
    """The int8 graph of the weights in `root`, built and cached on first use (atomically: a
    reader never sees a half-written file, two builders race harmlessly)."""
    _, ort = _import_runtime()
    from onnxruntime.quantization import QuantType, quantize_dynamic

    out_dir = settings.cache_dir() / "onnx"
    build = hashlib.sha256(repr((_BUILD_VERSION, FLOAT_NODES, REDUCE_RANGE)).encode()
                           ).hexdigest()[:8]
    out = out_dir / (f"minilm-int8-{weights_digest(root / 'model.safetensors')}-{build}"
                     f"-ort{ort.__version__}.onnx")
    if out.exists():
        return out
    out_dir.mkdir(parents=True, exist_ok=True)
    import onnx

    with tempfile.TemporaryDirectory(dir=out_dir) as tmp:
        fp32 = Path(tmp) / "fp32.onnx"
        onnx.save(build_graph(weights, cfg), str(fp32))
        q8 = Path(tmp) / "int8.onnx"
        quantize_dynamic(str(fp32), str(q8), weight_type=QuantType.QInt8, per_channel=True,
                         reduce_range=REDUCE_RANGE, op_types_to_quantize=["MatMul"],
                         nodes_to_exclude=list(FLOAT_NODES))
        os.replace(q8, out)
    return out


def int8_session(root: Path, weights: dict[str, np.ndarray], cfg: dict[str, Any]) -> Any:
    """An onnxruntime session of the int8 graph, one thread per run: the encoder runs batches
    on its own threads (as the default path does with BLAS), which also shares out the
    element-wise work."""
    _, ort = _import_runtime()
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(str(quantised_model(root, weights, cfg)), opts,
                                providers=["CPUExecutionProvider"])

