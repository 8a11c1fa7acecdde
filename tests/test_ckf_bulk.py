"""The store's bulk array path (`CKF.append_raw`) and the int8 copy it keeps once a store is
large: rows round-trip exactly, a content already stored is refused without a trace, the copy
appears at the size threshold and grows with every commit, and a process killed in the middle
of a bulk append or of the copy's extension leaves a CKF that opens, checks clean and selects
exactly what exact float32 selects. Real SQLite, real files, real SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import cdr
import cdr.ckf.snapshot as snapshot_mod
from cdr.ckf import CKF
from cdr.ckf.arrays import ArrayFiles
from cdr.ckf.chunk import fact_id
from cdr.errors import InvalidInputError
from cdr.ngrams import ngram_hashes
from cdr.retrieval import scan
from cdr.retrieval.embed import default_embedder
from cdr.retrieval.scan import covered_rows, exact_relevance, quant_paths

needs_kernels = pytest.mark.skipif(
    not scan.HAVE_KERNELS, reason="numba (the `fast` extra) is not installed")
DIM = 384


def _unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def _rows(rng: np.random.Generator, topic: np.ndarray, n: int) -> np.ndarray:
    """Unit rows around `topic`, so a gate passes a share of them."""
    return _unit(topic + rng.normal(size=(n, DIM)) / 12)


@pytest.fixture(scope="module")
def emb():
    return default_embedder()


def _content(i: int) -> str:
    return f"bulk fact {i} about the array path of the store and its rows"


def _append(ckf: CKF, start: int, vecs: np.ndarray, source: str) -> None:
    n = len(vecs)
    contents = [_content(start + i) for i in range(n)]
    ckf.append_raw(contents, vecs, tokens=np.arange(start, start + n) % 50 + 3,
                   ngram_lists=[ngram_hashes(c) for c in contents], source=source)


def test_bulk_rows_round_trip(tmp_path, emb):
    rng = np.random.default_rng(1)
    topic = _unit(rng.normal(size=(1, DIM)))[0]
    a, b = _rows(rng, topic, 300), _rows(rng, topic, 200)
    with CKF.create(tmp_path / "rt.ckf", emb) as ckf:
        _append(ckf, 0, a, "part-a")
        _append(ckf, 300, b, "part-b")
        assert ckf.check() == []
    with CKF.open(tmp_path / "rt.ckf", emb) as ckf:
        assert ckf.n_rows == 500
        assert np.array_equal(np.asarray(ckf.embeddings), np.concatenate([a, b]))
        assert ckf.token_counts.tolist() == [(i % 50) + 3 for i in range(500)]
        off, hashes = ckf.ngram_offsets, ckf.ngram_hashes
        for row in (0, 1, 3, 299, 300, 499):
            got = np.asarray(hashes[off[row]:off[row + 1]])
            assert len(got) > 0 and np.array_equal(got, ngram_hashes(_content(row)))
        facts = ckf.facts([0, 299, 300, 499])
        assert [f.content for f in facts] == [_content(i) for i in (0, 299, 300, 499)]
        assert [f.id for f in facts] == [fact_id(_content(i)) for i in (0, 299, 300, 499)]
        assert sorted(d["source"] for d in ckf.documents()) == ["part-a", "part-b"]
        assert bool(ckf.active.all())


def test_content_already_stored_is_refused_and_nothing_changes(tmp_path, emb):
    rng = np.random.default_rng(2)
    topic = _unit(rng.normal(size=(1, DIM)))[0]
    path = tmp_path / "dup.ckf"
    with CKF.create(path, emb) as ckf:
        _append(ckf, 0, _rows(rng, topic, 100), "first")
        gen, sizes = ckf.generation, [p.stat().st_size for p in _files(ckf).paths]
        fresh = _rows(rng, topic, 50)
        # rows 0..49 of the new batch are new, row 50 repeats a stored content
        with pytest.raises(InvalidInputError, match="already in the CKF"):
            ckf.append_raw([f"new fact {i}" for i in range(50)] + [_content(7)],
                           np.concatenate([fresh, _rows(rng, topic, 1)]), source="second")
        assert ckf.generation == gen and ckf.n_rows == 100
        assert [p.stat().st_size for p in _files(ckf).paths] == sizes
        assert [d["source"] for d in ckf.documents()] == ["first"]
        assert ckf.check() == []
        # the refused batch wrote nothing; the next append proceeds normally
        _append(ckf, 100, fresh, "second")
        assert ckf.n_rows == 150 and ckf.check() == []
        assert _files(ckf).embeddings.stat().st_size == sizes[0] + 50 * DIM * 4


def _files(ckf: CKF) -> ArrayFiles:
    return ArrayFiles(ckf.path, ckf.epoch, ckf.dim, ckf.dtype)


def test_no_copy_without_kernels(monkeypatch):
    monkeypatch.setattr(scan, "HAVE_KERNELS", False)
    assert not scan.wants_quantised(10**9)


def _assert_select_is_exact(ckf: CKF, topic: np.ndarray, gate: float) -> None:
    """The store's select (with whatever copy it has) returns exactly the rows whose exact
    float32 relevance passes the gate, with those relevances."""
    sel = ckf.select(topic, gate, None)
    exact = exact_relevance(ckf.embeddings, None, topic)
    want = np.flatnonzero(exact >= np.float32(gate))
    assert sorted(sel.indices.tolist()) == want.tolist()
    assert np.allclose(sel.relevances, exact[sel.indices], rtol=0, atol=2e-6)


@needs_kernels
def test_copy_is_built_automatically_at_the_threshold(tmp_path, emb, monkeypatch):
    monkeypatch.setattr(scan, "QUANT_MIN_ROWS", 400)
    rng = np.random.default_rng(3)
    topic = _unit(rng.normal(size=(1, DIM)))[0]
    path = tmp_path / "auto.ckf"
    with CKF.create(path, emb) as ckf:
        _append(ckf, 0, _rows(rng, topic, 250), "a")
        assert covered_rows(path, ckf.epoch, DIM) == 0  # below the threshold: exact only
        assert not any(p.exists() for p in quant_paths(path, ckf.epoch))
        _append(ckf, 250, _rows(rng, topic, 200), "b")  # crosses it: the copy covers all
        assert covered_rows(path, ckf.epoch, DIM) == 450
        _append(ckf, 450, _rows(rng, topic, 30), "c")  # each commit extends it
        assert covered_rows(path, ckf.epoch, DIM) == 480
        ckf.set_document_importance("a", 0.9)  # a commit adding no rows leaves it alone
        assert covered_rows(path, ckf.epoch, DIM) == 480
    with CKF.open(path, emb) as ckf:
        for gate in (0.3, 0.5, 0.7):
            _assert_select_is_exact(ckf, topic, gate)
        with_copy = ckf.select(topic, 0.5, None)
        monkeypatch.setattr(snapshot_mod, "open_quantised", lambda *a, **k: None)
        without = ckf.select(topic, 0.5, None)
        assert with_copy.indices.tolist() == without.indices.tolist()


# A child appending through the bulk path that SIGKILLs itself at one point of its second
# append: "after-arrays" (rows appended and fsynced, SQLite not committed) or "mid-copy" (the
# commit done, the int8 copy half extended: killed after its first block of rows).
CHILD = textwrap.dedent("""
    import os, signal, sys
    import numpy as np
    from cdr.ckf import CKF
    from cdr.retrieval import scan
    from cdr.ckf.arrays import ArrayFiles

    mode, path = sys.argv[1], sys.argv[2]
    scan.QUANT_MIN_ROWS = 100
    scan._BLOCK = 64
    calls = [0]
    real_append, real_quantise = ArrayFiles.append, scan.quantise

    def append(self, *a, **k):
        out = real_append(self, *a, **k)
        calls[0] += 1
        if mode == "after-arrays" and calls[0] == 2:
            os.kill(os.getpid(), signal.SIGKILL)
        return out

    def quantise(rows):
        if mode == "mid-copy" and calls[0] == 2 and quantise.blocks == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        quantise.blocks += 1
        return real_quantise(rows)

    quantise.blocks = 0
    ArrayFiles.append = append
    scan.quantise = quantise
    rng = np.random.default_rng(7)
    ckf = CKF.open(path)
    for part in range(2):
        if part == 1:
            quantise.blocks = 0
        v = rng.standard_normal((300, 384)).astype(np.float32)
        v /= np.linalg.norm(v, axis=1, keepdims=True)
        ckf.append_raw([f"child fact {part} {i}" for i in range(300)], v,
                       tokens=np.full(300, 9), ngram_lists=[np.zeros(0, np.uint64)] * 300,
                       source=f"child-{part}")
    print("finished")
""")


@needs_kernels
@pytest.mark.parametrize("mode", ["after-arrays", "mid-copy"])
def test_sigkill_mid_bulk_leaves_the_ckf_intact(tmp_path, emb, monkeypatch, mode):
    path = tmp_path / "kill.ckf"
    CKF.create(path, emb).close()
    env = dict(os.environ, PYTHONPATH=str(Path(cdr.__file__).parents[1]))
    proc = subprocess.run([sys.executable, "-c", CHILD, mode, str(path)], env=env,
                          capture_output=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-2000:]
    monkeypatch.setattr(scan, "QUANT_MIN_ROWS", 100)
    with CKF.open(path, emb) as ckf:
        if mode == "after-arrays":
            # the second batch's bytes are on disk past the committed length, and ignored
            assert ckf.n_rows == 300 and ckf.generation == 1
            assert _files(ckf).embeddings.stat().st_size == 600 * DIM * 4
            assert covered_rows(path, ckf.epoch, DIM) == 300
        else:
            # committed; the copy stopped after one block of the new rows
            assert ckf.n_rows == 600 and ckf.generation == 2
            assert covered_rows(path, ckf.epoch, DIM) == 300 + 64
        assert ckf.check() == []
        topic = np.asarray(ckf.embeddings[5], dtype=np.float32)
        _assert_select_is_exact(ckf, topic, 0.1)  # copy + exactly scanned uncovered tail
        rng = np.random.default_rng(8)
        _append(ckf, 10_000, _rows(rng, topic, 40), "after")  # the next writer repairs
        assert ckf.check() == []
        assert covered_rows(path, ckf.epoch, DIM) == ckf.n_rows
        _assert_select_is_exact(ckf, topic, 0.1)


def test_rescoring_rows_come_from_a_separate_map_of_the_same_file(tmp_path):
    """Candidates are rescored through a second mapping (advised MADV_RANDOM), never by
    changing the store's own map, whose full scans need readahead; slices and in-memory
    arrays are used as they are."""
    path = tmp_path / "rows.f32"
    data = _unit(np.random.default_rng(4).normal(size=(50, DIM)))
    data.tofile(path)
    own = np.memmap(path, dtype=np.float32, mode="r", shape=(50, DIM))
    view = scan._random_rows(own)
    assert view is not own and np.shares_memory(view, own) is False
    assert np.array_equal(view, data) and view.shape == own.shape
    assert scan._random_rows(own) is view  # one mapping per store snapshot, reused
    part = own[10:20]
    assert scan._random_rows(part) is part
    assert scan._random_rows(data) is data
