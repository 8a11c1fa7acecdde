"""Shard-side ranking merged in one round (`cdr.cluster.shard_merge`), without Ray: the shard
servers are the plain objects the Ray actors wrap, called in this process. On facts with many exact
and near ties (duplicated rows, rows one float32 step apart, three importance levels), the
merged ranking equals one CKF's bit for bit — rows, order, every score component, ids — for
Phase 1 limits with and without a global cut-off, and the second round is asked exactly
when one round cannot prove the merge (and only of those shards)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pytest

from cdr.ckf.committer import CKFCommitter, create_ckf
from cdr.ckf.snapshot import CKFSnapshot
from cdr.cluster.shard_merge import ShardTop, merge_window
from cdr.cluster.shard_server import ShardServer
from cdr.cluster.shardset import create_shard_set, shard_of
from cdr.coverage import CoverageSet, ResidualSet, SubQuery
from cdr.ranking import rank
from cdr.retrieval.factindex import WindowQuery
from cdr.vectors import check_query

DIM = 384  # a real model's width: BLAS picks its blocked kernels at this size


def unit(v: np.ndarray) -> np.ndarray:
    return (v / np.linalg.norm(v, axis=-1, keepdims=True)).astype(np.float32)


def near_tied_docs(seed: int, n_docs: int, q: np.ndarray) -> list[tuple[str, float, list[str],
                                                                        np.ndarray]]:
    """Documents whose facts sit near the query, a third of them exact duplicates of earlier
    facts and a third one float32 step away from one (scores tie or nearly tie)."""
    rng = np.random.default_rng(seed)
    pool: list[np.ndarray] = []
    docs = []
    for d in range(n_docs):
        vecs = []
        for _ in range(int(rng.integers(10, 30))):
            r = rng.random()
            if pool and r < 0.33:
                v = pool[int(rng.integers(len(pool)))]
            elif pool and r < 0.66:
                v = pool[int(rng.integers(len(pool)))].copy()
                j = int(rng.integers(DIM))
                v[j] = np.nextafter(v[j], np.float32(2.0))
            else:
                v = unit(q + rng.standard_normal(DIM).astype(np.float32) * rng.uniform(0.03, 0.07))
                pool.append(v)
            vecs.append(v)
        words = ["alpha", "beta"]
        contents = [" ".join(rng.choice(words, 8)) + f" d{d}f{k}" for k in range(len(vecs))]
        docs.append((f"doc/{seed}/{d}", float(rng.choice([0.5, 0.6, 1.0])), contents,
                     np.stack(vecs)))
    return docs


@dataclass
class Shards:
    single: CKFSnapshot
    servers: list[ShardServer]
    offsets: list[int]
    q: np.ndarray


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Shards]:
    root = tmp_path_factory.mktemp("merge")
    q = unit(np.random.default_rng(0).standard_normal(DIM).astype(np.float32))
    docs = near_tied_docs(1, 70, q)
    n_shards = 4
    ss = create_shard_set(root / "set", n_shards, "test/model", DIM)
    single = CKFCommitter(create_ckf(root / "single", "test/model", DIM))
    offsets = []
    total = 0
    for i, path in enumerate(ss.paths):
        offsets.append(total)
        w = CKFCommitter(path)
        for source, imp, contents, vecs in docs:
            if shard_of(source, n_shards) == i:
                for writer in (w, single):
                    writer.append_raw(contents, vecs, source=source, importance=imp)
                total += len(contents)
        w.close()
    single.close()
    servers = [ShardServer(str(p), i) for i, p in enumerate(ss.paths)]
    snap = CKFSnapshot.open(root / "single")
    assert snap.n_rows == total > 1000
    yield Shards(snap, servers, offsets, q)
    snap.close()


def window(s: Shards, rng: np.random.Generator, mode: str, limit: int | None,
           top_k: int | None) -> tuple[WindowQuery, dict[str, Any]]:
    q = unit(s.q + rng.standard_normal(DIM).astype(np.float32) * 0.02)
    coverage = CoverageSet(DIM)
    for k in range(int(rng.integers(0, 4))):
        coverage.add(unit(q + rng.standard_normal(DIM).astype(np.float32) * 0.05), 0.6, k + 1)
    res = unit(q + rng.standard_normal((int(rng.integers(0, 4)), DIM)).astype(np.float32) * 0.06)
    residual = ResidualSet([SubQuery(f"s{k}", "t") for k in range(len(res))],
                           res.reshape(-1, DIM), DIM)
    hashes = np.unique(s.single.ngram_hashes)
    blacklist = rng.choice(hashes, int(rng.integers(0, 30)), replace=False).astype(np.uint64)
    gate = float(rng.choice([0.55, 0.8, 0.9]))
    w = WindowQuery(q, gate, limit, coverage.centroid(), bool(coverage), residual.embeddings,
                    blacklist, mode, top_k)
    return w, {"coverage": coverage, "residual": residual, "mode": mode, "min_relevance": gate,
               "top_k": top_k}


def sharded(s: Shards, w: WindowQuery) -> tuple[Any, ...]:
    # As `RayShardedIndex.rank_window` does: the shards get the query as one CKF's select
    # makes it (normalised once, here).
    w = replace(w, query=check_query(w.query, DIM, model_id="test/model", unit=True))
    tops = [srv.rank(w, None, o)[1] for srv, o in zip(s.servers, s.offsets, strict=True)]

    def ask_again(which: list[int], cut: tuple[float, int]) -> list[ShardTop]:
        return [s.servers[i].rank(w, cut, s.offsets[i])[1] for i in which]

    return merge_window(tops, w.limit, w.top_k, DIM, w.mode, ask_again)


def test_one_round_merge_equals_one_ckf_bit_for_bit_on_near_ties(shards: Shards) -> None:
    s = shards
    rng = np.random.default_rng(5)
    rounds: dict[str, int] = {"one": 0, "two": 0}
    ties = 0
    for case in range(60):
        mode = "cdr" if case % 4 else "relevance"
        limit = [None, 40, 150, 400, 4000][case % 5]
        top_k = [None, 1, 8, 64][case % 4]
        w, kw = window(s, rng, mode, limit, top_k)
        sel = s.single.select(w.query, w.gate, limit)
        counts = (s.single.ngram_index.count_in(w.blacklist)[sel.indices]
                  if len(w.blacklist) else None)
        want = rank(sel.embeddings, sel.relevances, importance=s.single.importance[sel.indices],
                    ngram_counts=counts, rows=sel.indices, **kw)
        got, emb, tokens, ids, again = sharded(s, w)
        np.testing.assert_array_equal(got.indices, want.indices, err_msg=f"case {case}")
        for name in ("score", "relevance", "novelty", "residual_pull", "ngram_penalty",
                     "coverage_score"):
            np.testing.assert_array_equal(getattr(got, name), getattr(want, name),
                                          err_msg=f"case {case}: {name}")
        assert (got.n_candidates, got.ngram_activations) == \
            (want.n_candidates, want.ngram_activations), case
        assert ids == s.single.fact_ids(want.indices)
        np.testing.assert_array_equal(tokens, s.single.token_counts[want.indices])
        np.testing.assert_array_equal(emb, s.single.vectors(want.indices).reshape(-1, DIM))
        if limit is None or len(sel) < (limit or 0):
            assert again == []  # no global cut-off: one round is always exact
        rounds["two" if again else "one"] += 1
        ties += int((np.diff(want.score) == 0).sum())
    assert rounds["one"] and rounds["two"], rounds  # both paths were exercised
    assert ties > 50  # the data really has tied scores to order


def test_the_second_round_is_asked_only_of_shards_that_cannot_prove_the_merge(
        shards: Shards) -> None:
    s = shards
    rng = np.random.default_rng(11)
    asked_some = False
    for _ in range(20):
        w, _ = window(s, rng, "cdr", 60, 5)
        w = replace(w, query=check_query(w.query, DIM, model_id="test/model", unit=True))
        tops = [srv.rank(w, None, o)[1] for srv, o in zip(s.servers, s.offsets, strict=True)]
        full = [srv.rank(w, None, o)[1] for srv, o in
                zip(s.servers, s.offsets, strict=True)]
        seen: list[list[int]] = []

        def ask_again(which: list[int], cut: tuple[float, int], w: WindowQuery = w,
                      seen: list[list[int]] = seen) -> list[ShardTop]:
            seen.append(which)
            return [s.servers[i].rank(w, cut, s.offsets[i])[1] for i in which]

        *_, again = merge_window(tops, w.limit, w.top_k, DIM, w.mode, ask_again)
        assert seen == ([again] if again else [])
        for i in again:  # a shard asked again had held candidates back
            assert not full[i].complete
        asked_some |= bool(again)
    assert asked_some
