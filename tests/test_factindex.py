"""The `FactIndex` protocol: the local CKF implements it, Phase 1 is exact, shards merge exactly,
and the window loop runs on any implementation (here: a sharded in-memory view).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import cdr
from cdr.ckf import CKF, CKFCommitter, CKFSnapshot
from cdr.ckf.committer import create_ckf
from cdr.ngrams import ngram_hashes
from cdr.retrieval.factindex import (
    FactIndex,
    Selection,
    check_gate,
    merge_selections,
    select_rows,
)
from cdr.vectors import check_query
from cdr.window.loop import GenerationConfig, Generator
from cdr.writers import get_writer
from tests.conftest import BUILTIN_TYPES_OUTLINE, BUILTIN_TYPES_TASK

PROTOCOL_MEMBERS = (
    "model_id", "dim", "embedder", "path", "generation", "n_rows", "active", "importance",
    "token_counts", "ngram_offsets", "ngram_hashes", "ngram_index", "select", "facts",
    "fact_ids", "vectors", "stats", "close",
)


@pytest.fixture(scope="module")
def snapshot(types_ckf_path: Path) -> Iterable[CKFSnapshot]:
    with CKFSnapshot.open(types_ckf_path) as snap:
        yield snap


def test_local_ckf_satisfies_the_protocol(types_ckf_path: Path, snapshot: CKFSnapshot) -> None:
    with CKF.open(types_ckf_path) as handle:
        assert isinstance(handle, FactIndex)
    assert isinstance(snapshot, FactIndex)
    assert not isinstance(object(), FactIndex)
    assert not isinstance(np.zeros(3), FactIndex)
    # The read side cannot write: administration lives on the writer side only.
    for admin in ("writing", "delete_document", "compact", "append_raw", "quarantine",
                  "refresh"):
        assert not hasattr(snapshot, admin), admin
        assert hasattr(CKFCommitter, admin) or hasattr(CKF, admin), admin


def _reference_select(emb64: np.ndarray, active: np.ndarray, q: np.ndarray, gate: float,
                      limit: int | None) -> list[int]:
    """Phase 1 written the slow, obvious way: gate, sort by (-relevance, row), cut."""
    sims = emb64 @ (q.astype(np.float64) / np.linalg.norm(q))
    ranked = sorted((-sims[i], i) for i in range(len(sims)) if active[i] and sims[i] >= gate)
    return [i for _, i in (ranked if limit is None else ranked[:limit])]


@pytest.mark.parametrize("gate", [-1.0, 0.2, 0.4])
@pytest.mark.parametrize("limit", [None, 1, 25, 4000])
def test_select_equals_brute_force_numpy_on_a_real_ckf(snapshot: CKFSnapshot, gate: float,
                                                       limit: int | None) -> None:
    emb64 = np.asarray(snapshot.vectors(range(snapshot.n_rows)), dtype=np.float64)
    texts = ["mutable sequence types like lists", "truth value testing", "dictionary views"]
    queries = list(snapshot.embedder.encode(texts))
    queries.append(np.random.default_rng(7).standard_normal(snapshot.dim).astype(np.float32))
    for q in queries:
        sel = snapshot.select(q, gate, limit)
        ref = _reference_select(emb64, snapshot.active, q, gate, limit)
        sims = emb64 @ (q / np.linalg.norm(q))
        tol = 1e-5  # float32 BLAS vs float64: only near-ties and near-gate rows may differ
        near = [abs(sims[a] - sims[b]) < tol for a, b in zip(sel.indices, ref, strict=False)
                if a != b]
        assert len(sel) == len(ref) or any(abs(sims - gate) < tol)
        assert all(near), "rows differ beyond float32 rounding"
        np.testing.assert_allclose(sel.relevances, sims[sel.indices], atol=tol)
        np.testing.assert_array_equal(sel.embeddings, snapshot.vectors(sel.indices))
        assert sel.indices.dtype == np.int64 and sel.relevances.dtype == np.float32
        assert sel.embeddings.shape == (len(sel), snapshot.dim)


def test_fact_reads_agree_with_the_per_row_arrays(snapshot: CKFSnapshot) -> None:
    rows = [snapshot.n_rows - 1, 0, 17, 17]
    facts = snapshot.facts(rows)
    assert [f.row for f in facts] == rows
    assert snapshot.fact_ids(rows) == [f.id for f in facts]
    off, hashes = snapshot.ngram_offsets, snapshot.ngram_hashes
    for f in facts:
        np.testing.assert_array_equal(hashes[off[f.row]:off[f.row + 1]], ngram_hashes(f.content))
        assert f.tokens == int(snapshot.token_counts[f.row])
        assert f.importance == pytest.approx(float(snapshot.importance[f.row]))
    n = snapshot.n_rows
    assert len(snapshot.active) == len(snapshot.importance) == len(snapshot.token_counts) == n
    assert len(off) == n + 1 and snapshot.ngram_index.n_facts == n
    stats = snapshot.stats()
    assert {"model_id", "dim", "generation", "rows", "active_facts"} <= set(stats)
    assert (stats["rows"], stats["active_facts"]) == (n, int(snapshot.active.sum()))


def test_snapshot_is_one_commit_and_the_writer_side_makes_the_next(tmp_path: Path) -> None:
    root = create_ckf(tmp_path / "w.ckf", "test/model", 4)
    writer = CKFCommitter(root)
    before = CKFSnapshot.open(root)
    writer.append_raw(["a fact about snapshots and writers"], np.eye(4, dtype=np.float32)[:1],
                      source="notes")
    assert before.n_rows == 0 and before.generation == 0  # a snapshot never moves
    assert before.latest_generation() == 1  # but it can tell that the disk did
    after = CKFSnapshot.open(root)
    assert after.n_rows == 1 and after.fact_ids([0]) == [writer.fact_texts([0])[0][1]]
    assert after.select(np.array([1, 0, 0, 0], np.float32), 0.5).indices.tolist() == [0]
    for h in (before, after, writer):
        h.close()


# ---------------------------------------------------------------------- shards merge exactly

@st.composite
def _sharded_matrix(draw: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[int]]:
    """Small-integer vectors: float32 dot products are then exact in any summation order, so
    ties are real (and frequent) and equality can be asserted bit for bit."""
    n = draw(st.integers(0, 60))
    dim = 5
    ints = st.integers(-3, 3)
    emb = np.array(draw(st.lists(st.lists(ints, min_size=dim, max_size=dim), min_size=n,
                                 max_size=n)), dtype=np.float32).reshape(n, dim)
    active = np.array(draw(st.lists(st.booleans(), min_size=n, max_size=n)), dtype=bool)
    q = np.array(draw(st.lists(ints, min_size=dim, max_size=dim)), dtype=np.float32)
    cuts = sorted(draw(st.lists(st.integers(0, n), max_size=4)))
    return emb, active, q, cuts


@settings(max_examples=200, deadline=None)
@given(data=_sharded_matrix(), gate=st.integers(-20, 20),
       limit=st.one_of(st.none(), st.integers(0, 70)))
def test_merged_shard_selections_equal_the_single_index_selection(data, gate, limit) -> None:
    emb, active, q, cuts = data
    whole = select_rows(emb, active, q, float(gate), limit)
    bounds = [0, *cuts, len(emb)]
    parts = [select_rows(emb[lo:hi], active[lo:hi], q, float(gate), limit, row_offset=lo)
             for lo, hi in pairwise(bounds)]
    merged = merge_selections(parts, limit, emb.shape[1])
    np.testing.assert_array_equal(merged.indices, whole.indices)
    np.testing.assert_array_equal(merged.relevances, whole.relevances)
    np.testing.assert_array_equal(merged.embeddings, whole.embeddings)
    key = list(zip(-whole.relevances, whole.indices, strict=True))
    assert key == sorted(key)  # best first, ties by row


class ShardedView:
    """A FactIndex made only of protocol members: Phase 1 over S in-memory shards, merged;
    everything else read from one CKF snapshot. Any non-protocol access fails loudly."""

    __slots__ = ("_base", "_shards")

    def __init__(self, base: CKFSnapshot, n_shards: int) -> None:
        self._base = base
        emb = np.asarray(base.vectors(range(base.n_rows)))
        cuts = np.linspace(0, base.n_rows, n_shards + 1).astype(int)
        self._shards = [(int(lo), emb[lo:hi], base.active[lo:hi])
                        for lo, hi in pairwise(cuts)]

    def select(self, query_vector: Any, min_relevance: float, limit: int | None = None
               ) -> Selection:
        q = check_query(query_vector, self.dim, model_id=self.model_id, unit=True)
        gate, limit = check_gate(min_relevance, limit)
        parts = [select_rows(e, a, q, gate, limit, row_offset=lo)
                 for lo, e, a in self._shards]
        return merge_selections(parts, limit, self.dim)

    model_id = property(lambda self: self._base.model_id)
    dim = property(lambda self: self._base.dim)
    embedder = property(lambda self: self._base.embedder)
    path = property(lambda self: f"shards:{self._base.path}")
    generation = property(lambda self: self._base.generation)
    n_rows = property(lambda self: self._base.n_rows)
    active = property(lambda self: self._base.active)
    importance = property(lambda self: self._base.importance)
    token_counts = property(lambda self: self._base.token_counts)
    ngram_offsets = property(lambda self: self._base.ngram_offsets)
    ngram_hashes = property(lambda self: self._base.ngram_hashes)
    ngram_index = property(lambda self: self._base.ngram_index)

    def facts(self, rows: Any) -> list:
        return self._base.facts(rows)

    def fact_ids(self, rows: Any) -> list[str]:
        return self._base.fact_ids(rows)

    def vectors(self, rows: Any) -> np.ndarray:
        return self._base.vectors(rows)

    def stats(self) -> dict[str, Any]:
        return self._base.stats()

    def close(self) -> None:
        pass


@pytest.mark.parametrize("ranking", ["cdr", "mmr"])
def test_the_loop_runs_on_any_fact_index_with_identical_windows(snapshot: CKFSnapshot,
                                                                ranking: str) -> None:
    sharded = ShardedView(snapshot, 3)
    assert isinstance(sharded, FactIndex)
    assert set(PROTOCOL_MEMBERS) <= set(dir(sharded))

    def windows(index: Any) -> list[tuple]:
        gen = Generator(index, get_writer("extractive"),
                        GenerationConfig(ranking=ranking, max_windows=3, words=2000))
        session = gen.start(BUILTIN_TYPES_TASK, BUILTIN_TYPES_OUTLINE)
        return [(e.prepared.envelope.fact_ids, e.prepared.envelope.ranking.score.tolist(),
                 e.output, e.status, e.headers) for e in gen.run(BUILTIN_TYPES_TASK,
                                                                  session=session)]

    local, sharded_run = windows(snapshot), windows(sharded)
    assert len(local) >= 2 and local[0][0]
    assert sharded_run == local


# ---------------------------------------------------------------------- module structure

def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return out


def test_ckf_package_has_no_import_cycle_and_no_private_imports() -> None:
    src = Path(cdr.__file__).parent
    files = {f"cdr.ckf.{p.stem}": p for p in (src / "ckf").glob("*.py") if p.stem != "__init__"}
    files["cdr.retrieval.factindex"] = src / "retrieval" / "factindex.py"
    graph = {m: {i for i in _imports(p) if i in files and i != m} for m, p in files.items()}
    # Depth-first search for a back edge.
    state: dict[str, int] = {}

    def visit(m: str, trail: list[str]) -> None:
        state[m] = 1
        for n in graph[m]:
            assert state.get(n) != 1, f"import cycle: {' -> '.join([*trail, m, n])}"
            if n not in state:
                visit(n, [*trail, m])
        state[m] = 2

    for m in graph:
        if m not in state:
            visit(m, [])
    for name in ("snapshot", "handle", "committer", "maintenance", "state", "txn", "ingest"):
        tree = ast.parse(files[f"cdr.ckf.{name}"].read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("cdr.ckf."):
                owner = node.module.rsplit(".", 1)[1]
                if owner == "parse":  # being rewritten on markdown-it-py (issue 11)
                    continue
                private = [a.name for a in node.names if a.name.startswith("_")]
                assert not private, f"ckf/{name}.py imports {private} from {node.module}"
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                    and node.value.id in ("ckf", "committer", "snapshot") \
                    and node.attr.startswith("_") and not node.attr.startswith("__"):
                pytest.fail(f"ckf/{name}.py reaches into {node.value.id}.{node.attr}")
