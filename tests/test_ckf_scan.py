"""The Phase 1 scan engine: the int8 copy + exact rescoring and the float16 kernel give exactly
the gated set and the float32 relevances of the exact path, on random matrices and at the
gate's edge; the copy builds incrementally and survives a torn tail."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cdr.retrieval import scan
from cdr.retrieval.scan import (
    QuantisedRows,
    build_quantised,
    covered_rows,
    exact_relevance,
    gated_rows,
    open_quantised,
    quantise,
)

needs_kernels = pytest.mark.skipif(
    not scan.HAVE_KERNELS, reason="numba (the `fast` extra) is not installed")


def _unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


@st.composite
def matrices(draw):
    """Unit rows around a query (a share above any gate), duplicates of rows at the edge,
    rows with tiny components (float16 subnormals), and the query itself as a row."""
    d = draw(st.sampled_from([2, 7, 64, 384]))
    n = draw(st.integers(1, 300))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    q = _unit(rng.normal(size=(1, d)))[0]
    spread = draw(st.floats(0.05, 3.0))
    f = _unit(q + spread * rng.normal(size=(n, d)) / np.sqrt(d) * 3)
    if draw(st.booleans()):
        f[rng.integers(0, n)] = q
    if draw(st.booleans()) and n > 2:
        f[1] = f[0]  # a duplicate: both sides of the edge together
    if draw(st.booleans()):
        tiny = rng.random((n, d)) < 0.2
        f = _unit(np.where(tiny, f * 1e-6, f))
    dtype = draw(st.sampled_from([np.float32, np.float16]))
    f = f.astype(dtype)
    active = rng.random(n) < draw(st.sampled_from([1.0, 0.7]))
    gate_kind = draw(st.sampled_from(["row", "random", "low", "high"]))
    return f, q, active, gate_kind, rng


def _gate(kind: str, exact: np.ndarray, rng: np.random.Generator) -> float:
    if kind == "row":  # exactly some row's relevance: that row sits on the edge
        return float(exact[rng.integers(0, len(exact))])
    if kind == "random":
        return float(rng.uniform(-0.2, 1.0))
    return -1.0 if kind == "low" else 1.0


@needs_kernels
@settings(max_examples=120, deadline=None)
@given(matrices(), st.floats(0.0, 1.0))
def test_quantised_scan_equals_exact_path(case, covered_share):
    f, q, active, gate_kind, rng = case
    n = f.shape[0]
    m = round(covered_share * n)  # rows past the copy are scanned exactly
    blas_path = m == 0 and f.dtype == np.float32  # the default path: einsum (row-independent)
    exact = np.einsum("ij,j->i", f, q) if blas_path else exact_relevance(f, None, q)
    gate = _gate(gate_kind, exact, rng)
    want = np.flatnonzero((exact >= np.float32(gate)) & active)
    quant = QuantisedRows(*quantise(f[:m])) if m else None
    rows, rel = gated_rows(f, q, gate, active, quant)
    assert rows.tolist() == want.tolist()
    assert np.array_equal(rel, exact[want])  # bit for bit
    # and the exact kernel is an exact float32 dot product (BLAS may differ in the last bits)
    blas = f.astype(np.float32) @ q
    assert np.allclose(exact, blas, rtol=0, atol=2e-6)


@needs_kernels
@settings(max_examples=60, deadline=None)
@given(matrices())
def test_int8_bound_is_an_upper_bound(case):
    """The bound the survivors are picked by never falls below a row's true cosine."""
    f, q, _, _, _ = case
    codes, params = quantise(f)
    approx = params[:, 0].astype(np.float64) * (codes.astype(np.float64) @ q.astype(np.float64))
    truth = f.astype(np.float64) @ q.astype(np.float64)
    assert np.all(approx + params[:, 1] >= truth - 1e-12)
    assert np.all(np.abs(codes.astype(np.int16)) <= 127)


def test_without_kernels_the_same_rows_come_back(monkeypatch):
    """numba absent: float16 uses numpy block conversion, the int8 copy is ignored."""
    rng = np.random.default_rng(3)
    q = _unit(rng.normal(size=(1, 32)))[0]
    f = _unit(q + rng.normal(size=(500, 32)) / 4).astype(np.float16)
    active = np.ones(500, bool)
    want = np.flatnonzero(f.astype(np.float32) @ q >= np.float32(0.6))
    monkeypatch.setattr(scan, "HAVE_KERNELS", False)
    rows, rel = gated_rows(f, q, 0.6, active, QuantisedRows(*quantise(f)))
    assert rows.tolist() == want.tolist()
    assert np.allclose(rel, f[want].astype(np.float32) @ q, atol=1e-6)


def test_build_is_incremental_and_survives_a_torn_tail(tmp_path):
    rng = np.random.default_rng(5)
    f = _unit(rng.normal(size=(1000, 16)))
    assert covered_rows(tmp_path, 0, 16) == 0 and open_quantised(tmp_path, 0, 16, 1000) is None
    assert build_quantised(tmp_path, 0, f[:300]) == 300
    codes_p, _ = scan.quant_paths(tmp_path, 0)
    with open(codes_p, "ab") as fh:  # an interrupted build: codes written, params not
        fh.write(b"\x01" * 16 * 7)
    assert covered_rows(tmp_path, 0, 16) == 300
    seen: list[int] = []
    assert build_quantised(tmp_path, 0, f, lambda done, total: seen.append(done)) == 1000
    assert seen[-1] == 1000
    whole = tmp_path / "whole"
    whole.mkdir()
    build_quantised(whole, 0, f)
    for a, b in zip(scan.quant_paths(tmp_path, 0), scan.quant_paths(whole, 0), strict=True):
        assert a.read_bytes() == b.read_bytes()
    got = open_quantised(tmp_path, 0, 16, 600)  # a reader of an older snapshot: its prefix
    assert got is not None and got.n == 600
    assert np.array_equal(np.asarray(got.codes), quantise(f[:600])[0])
    assert open_quantised(tmp_path, 1, 16, 1000) is None  # another epoch: no copy


@needs_kernels
def test_ckf_select_with_the_copy_equals_without(tmp_path):
    """Through the store: a CKF with an int8 copy selects what it selected before, for a
    float32 and a float16 store, with rows appended after the copy was built."""
    from cdr.ckf import CKF
    from cdr.retrieval.embed import default_embedder

    emb = default_embedder()
    rng = np.random.default_rng(11)
    topic = _unit(rng.normal(size=(1, emb.dim)))[0]
    for dtype in ("float32", "float16"):
        path = tmp_path / f"{dtype}.ckf"
        with CKF.create(path, emb, dtype=dtype) as ckf:
            for part in range(2):
                vecs = _unit(topic + rng.normal(size=(400, emb.dim)) / 12)
                ckf.append_raw([f"fact {part} {i}" for i in range(400)], vecs,
                               tokens=np.full(400, 5), ngram_lists=[np.zeros(0, np.uint64)] * 400,
                               source=f"s{part}")
                if part == 0:
                    before = [ckf.select(topic, g, None) for g in (0.3, 0.5)]
                    build_quantised(ckf.path, ckf.epoch, ckf.embeddings)
            after_tail = [ckf.select(topic, g, None) for g in (0.3, 0.5)]
        with CKF.open(path, emb) as ckf:
            assert open_quantised(ckf.path, ckf.epoch, ckf.dim, ckf.n_rows).n == 400
            for g, sel in zip((0.3, 0.5), after_tail, strict=True):
                again = ckf.select(topic, g, None)
                assert again.indices.tolist() == sel.indices.tolist()
                assert np.array_equal(again.relevances, sel.relevances)
            exact = exact_relevance(ckf.embeddings, None, topic)
            for g, sel in zip((0.3, 0.5), after_tail, strict=True):
                want = np.flatnonzero(exact >= np.float32(g))
                assert sorted(sel.indices.tolist()) == want.tolist()
            assert len(before[0]) < len(after_tail[0])


def test_cli_index_builds_the_copy_and_select_agrees(tmp_path):
    """`cdr ckf index --ckf PATH`: builds the copy, idempotent, errors are one line."""
    from typer.testing import CliRunner

    from cdr.ckf import CKF
    from cdr.cli.ckf import app
    from cdr.retrieval.embed import default_embedder

    emb = default_embedder()
    rng = np.random.default_rng(2)
    topic = _unit(rng.normal(size=(1, emb.dim)))[0]
    path = tmp_path / "kb.ckf"
    with CKF.create(path, emb) as ckf:
        vecs = _unit(topic + rng.normal(size=(300, emb.dim)) / 10)
        ckf.append_raw([f"f{i}" for i in range(300)], vecs,
                       tokens=np.full(300, 5), ngram_lists=[np.zeros(0, np.uint64)] * 300)
        before = ckf.select(topic, 0.4, None)
    runner = CliRunner()
    for _ in range(2):
        res = runner.invoke(app, ["ckf", "index", "--ckf", str(path)])
        assert res.exit_code == 0, res.output
        assert "int8 copy covers 300 rows" in res.stdout
    with CKF.open(path, emb) as ckf:
        after = ckf.select(topic, 0.4, None)
    assert after.indices.tolist() == before.indices.tolist()
    assert np.allclose(after.relevances, before.relevances, rtol=0, atol=2e-6)
    res = runner.invoke(app, ["ckf", "index", "--ckf", str(tmp_path / "missing.ckf")])
    assert res.exit_code != 0


def test_compaction_drops_the_old_epochs_copy(tmp_path):
    from cdr.ckf import CKF
    from cdr.retrieval.embed import default_embedder

    emb = default_embedder()
    rng = np.random.default_rng(4)
    with CKF.create(tmp_path / "c.ckf", emb) as ckf:
        for part in range(2):
            ckf.append_raw([f"p{part} {i}" for i in range(50)],
                           _unit(rng.normal(size=(50, emb.dim))), tokens=np.full(50, 5),
                           ngram_lists=[np.zeros(0, np.uint64)] * 50, source=f"s{part}")
        build_quantised(ckf.path, 0, ckf.embeddings)
        assert all(p.exists() for p in scan.quant_paths(ckf.path, 0))
        ckf.delete_document("s0")
        ckf.compact()
        assert ckf.epoch == 1 and ckf.n_rows == 50
        assert not any(p.exists() for p in scan.quant_paths(ckf.path, 0))
        assert open_quantised(ckf.path, 1, ckf.dim, ckf.n_rows) is None


def test_numba_is_imported_only_when_a_kernel_runs() -> None:
    """Every process that touches a fact index imports the scan module; numba's own import is
    left to the first kernel call, so a gateway or a `cdr` command on a float32 store never
    pays it."""
    code = ("import sys, numpy as np\n"
            "import cdr.gateway.app, cdr.cli\n"
            "from cdr.retrieval import scan\n"
            "before = 'numba' in sys.modules\n"
            "rows = np.eye(4, dtype=np.float32)\n"
            "scan.gated_rows(rows, rows[0], 0.5, np.ones(4, bool))  # float32: exact BLAS path\n"
            "print(before, 'numba' in sys.modules, scan.HAVE_KERNELS)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["False", "False", str(scan.HAVE_KERNELS)]
