"""The ingest-speed benchmark's own code: the page pick, the interleaved timing loop, and the
static table's encoding (bench/ingest_speed.py, bench/static_embed.py)."""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import ingest_speed
from cdr.errors import InvalidInputError
from cdr.retrieval.embed import default_embedder
from static_embed import StaticEmbedder

PARA = ("A checkpoint writes every dirty buffer to disk and records a point in the "
        "write-ahead log from which recovery can start after a crash.")


def _page(title: str, paragraphs: int) -> bytes:
    body = "".join(f"<p>{PARA} Paragraph {i} of {title}.</p>" for i in range(paragraphs))
    return f"<html><head><title>{title}</title></head><body><h1>{title}</h1>{body}" \
           "</body></html>".encode()


def test_pages_are_picked_in_sha1_order_until_the_facts_are_enough(tmp_path: Path) -> None:
    names = [f"page{i}.html" for i in range(8)]
    for n in names:
        (tmp_path / n).write_bytes(_page(n, 3))
    (tmp_path / "empty.html").write_bytes(b"<html><body></body></html>")
    by_sha = sorted([*names, "empty.html"], key=lambda n: hashlib.sha1(n.encode()).digest())
    pages, total = ingest_speed.pick_pages(tmp_path, 1)
    assert [p.name for p in pages] == [n for n in by_sha if n != "empty.html"][:1]
    assert total >= 1
    every, facts = ingest_speed.pick_pages(tmp_path, 10**6)  # not enough: all that hold facts
    assert [p.name for p in every] == [n for n in by_sha if n != "empty.html"]
    assert facts >= total


def test_cpu_flags_names_only_the_simd_flags_it_looks_for() -> None:
    flags = ingest_speed.cpu_flags()
    known = {"avx2", "fma", "avx512f", "avx512_vnni", "avx_vnni", "amx_int8"}
    assert set(flags.split()) <= known or flags in ("unknown", "none of avx2/avx512/vnni")


def test_the_timing_loop_interleaves_every_candidate_chunk_by_chunk() -> None:
    calls: list[tuple[str, int]] = []
    rng = np.random.default_rng(0)
    base = rng.standard_normal((5, 4)).astype(np.float32)
    base /= np.linalg.norm(base, axis=1, keepdims=True)
    texts = [f"t{i}" for i in range(5)]

    def fake(name: str, vecs: np.ndarray):  # type: ignore[no-untyped-def]
        def encode(part: list[str]) -> np.ndarray:
            calls.append((name, len(part)))
            return vecs[[texts.index(t) for t in part]]
        return encode

    fns = {"numpy": fake("numpy", base), "other": fake("other", -base),
           "third": fake("third", base)}
    out = ingest_speed.embed_speed(texts, fns, 2, chunk=2)
    assert [n for n, _ in calls[:3]] == ["numpy", "other", "third"]  # one warm call each
    timed = calls[3:]
    assert [k for _, k in timed] == [2, 2, 2, 2, 2, 2, 1, 1, 1] * 2  # every text, each turn
    assert [n for n, _ in timed[:9]] == ["numpy", "other", "third", "other", "third", "numpy",
                                         "third", "numpy", "other"]  # rotated each chunk
    assert all(len(v) == 2 for v in out["seconds"].values()) and len(out["loads"]) == 2
    np.testing.assert_allclose(out["cos"]["numpy"], 1.0, atol=1e-6)
    np.testing.assert_allclose(out["cos"]["other"], -1.0, atol=1e-6)
    assert out["cos"]["third"].shape == (5,)


@pytest.fixture(scope="module")
def tiny_static() -> StaticEmbedder:
    vocab = default_embedder()._tok.get_vocab_size()
    table = np.random.default_rng(7).standard_normal((vocab, 8)).astype(np.float32)
    return StaticEmbedder(table)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.text(min_size=1, max_size=60).filter(str.strip), min_size=1, max_size=5))
def test_a_static_vector_is_the_normalised_mean_of_its_pieces_rows(
        tiny_static: StaticEmbedder, texts: list[str]) -> None:
    vecs = tiny_static.encode(texts)
    assert vecs.shape == (len(texts), 8) and vecs.dtype == np.float32
    special = tiny_static._special
    for t, v in zip(texts, vecs, strict=True):
        every = tiny_static._tok.encode(t).ids
        ids = [i for i in every if i not in special] or every  # no piece: [CLS] [SEP]
        want = tiny_static.table[ids].mean(axis=0)
        np.testing.assert_allclose(v, want / np.linalg.norm(want), atol=1e-5)
        np.testing.assert_array_equal(tiny_static.encode([t])[0], v)  # batch-independent


def test_the_static_table_refuses_what_the_models_refuse(tiny_static: StaticEmbedder) -> None:
    with pytest.raises(InvalidInputError, match="empty"):
        tiny_static.encode(["fine", " "])
    assert tiny_static.encode([]).shape == (0, 8)
