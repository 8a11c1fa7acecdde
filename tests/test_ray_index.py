"""The Ray-served shard set on a real local Ray cluster: its ranking equals one CKF's exactly
(hypothesis, every mode), the window loop runs on it unchanged, a killed shard process is
restarted and the window retried with the same result, a shard that stays down fails the
request with a 503-style error naming it, and ingest embeds in parallel Ray tasks.

The cluster: `CDR_RAY_ADDRESS` (a head `.ci/run` started on 127.0.0.1), else a tiny local
one (2 CPUs, no dashboard, loopback) started here and shut down at the end of the module.
"""

from __future__ import annotations

import itertools
import os
import shutil
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cdr.cluster.ray_index import export_ray_env  # does not import ray

export_ray_env(os.environ.get("CDR_RAY_ADDRESS"))  # Ray reads its RAY_* settings on import
ray = pytest.importorskip(
    "ray", reason="Ray is not installed: pip install 'cdr-retrieval[ray]' (.ci/run installs it and "
                  "starts a Ray head for these tests)")

from cdr.ckf.committer import CKFCommitter, create_ckf  # noqa: E402
from cdr.ckf.snapshot import CKFSnapshot  # noqa: E402
from cdr.cluster.ray_index import RayShardedIndex, ShardUnavailableError, connect  # noqa: E402
from cdr.cluster.shardset import create_shard_set, shard_of  # noqa: E402
from cdr.coverage import CoverageSet, ResidualSet, SubQuery  # noqa: E402
from cdr.ranking import rank  # noqa: E402
from cdr.retrieval.factindex import (  # noqa: E402
    FactIndex,
    RankingIndex,
    WindowQuery,
)
from cdr.window.loop import GenerationConfig, Generator  # noqa: E402
from cdr.writers import get_writer  # noqa: E402
from tests.conftest import BUILTIN_TYPES_OUTLINE, BUILTIN_TYPES_TASK  # noqa: E402

DIM = 16  # 64-byte rows, as every real model (384, 768, ...): see the exactness test
Doc = tuple[str, float, list[str], np.ndarray]  # source, importance, contents, unit vectors


@pytest.fixture(scope="module")
def cluster() -> Iterator[None]:
    address = os.environ.get("CDR_RAY_ADDRESS")
    if address:
        connect(address)
    else:
        connect(None, num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1")
    yield
    ray.shutdown()


def build_pair(root: Path, docs: list[Doc], n_shards: int, model_id: str, dim: int,
               quarantine: set[str] = frozenset()) -> tuple[Path, Path]:
    """The same documents as one CKF and as a shard set, with one row order: the single
    CKF holds shard 0's facts first, then shard 1's, ... (the shard set's global rows)."""
    ss = create_shard_set(root / "set", n_shards, model_id, dim)
    single = CKFCommitter(create_ckf(root / "single", model_id, dim))
    for i, path in enumerate(ss.paths):
        shard = CKFCommitter(path)
        for source, imp, contents, vectors in docs:
            if shard_of(source, n_shards) != i:
                continue
            for w in (shard, single):
                w.append_raw(contents, vectors, source=source, importance=imp)
        for w in (shard, single):
            snap = CKFSnapshot.open(w.path)
            rows = [r for r, f in enumerate(snap.facts(range(snap.n_rows)))
                    if f.content in quarantine]
            snap.close()
            if rows:
                w.set_quarantine(rows, True)
        shard.close()
    single.close()
    return root / "single", ss.root


def random_docs(seed: int, n_docs: int) -> tuple[list[Doc], set[str]]:
    """Small-integer directions (many exact ties, duplicates included), two-word texts (many
    shared 6-grams, so blacklists bite), mixed importance, a few quarantined facts."""
    rng = np.random.default_rng(seed)
    docs: list[Doc] = []
    pool: list[np.ndarray] = []
    quarantined: set[str] = set()
    for d in range(n_docs):
        k = int(rng.integers(1, 9))
        contents = [" ".join(rng.choice(["alpha", "beta"], 9)) + f" d{d}f{j}" for j in range(k)]
        vecs = []
        for _ in range(k):
            if pool and rng.random() < 0.25:
                v = pool[int(rng.integers(len(pool)))]
            else:
                v = rng.integers(-2, 3, DIM).astype(np.float32)
                v[0] = v[0] or 1.0
                v /= np.linalg.norm(v)
                pool.append(v)
            vecs.append(v)
        docs.append((f"src/{seed}/{d}.md", float(rng.choice([0.5, 0.6, 1.0])), contents,
                     np.stack(vecs)))
        quarantined.update(c for c in contents if rng.random() < 0.1)
    return docs, quarantined


@dataclass
class Pair:
    single: CKFSnapshot
    index: RayShardedIndex


@pytest.fixture(scope="module")
def pairs(cluster: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Pair]]:
    out = []
    for seed, n_docs, n_shards in ((1, 14, 2), (2, 24, 4), (3, 1, 3)):
        docs, quarantined = random_docs(seed, n_docs)
        single, shards = build_pair(tmp_path_factory.mktemp(f"pair{seed}"), docs, n_shards,
                                    "test/model", DIM, quarantined)
        out.append(Pair(CKFSnapshot.open(single), RayShardedIndex(shards, retry_seconds=30)))
    yield out
    for p in out:
        p.index.close(stop_actors=True)
        p.single.close()


def test_the_sharded_index_is_a_fact_index_with_the_single_ckfs_arrays(pairs) -> None:
    for p in pairs:
        s, x = p.single, p.index
        assert (x.n_rows, x.model_id, x.dim) == (s.n_rows, s.model_id, s.dim)
        for name in ("active", "importance", "token_counts", "ngram_offsets", "ngram_hashes"):
            np.testing.assert_array_equal(getattr(x, name), getattr(s, name), err_msg=name)
        rows = [s.n_rows - 1, 0, s.n_rows // 2, 0]
        assert x.fact_ids(rows) == s.fact_ids(rows)
        assert [(f.row, f.content, f.source) for f in x.facts(rows)] == \
            [(f.row, f.content, f.source) for f in s.facts(rows)]
        np.testing.assert_array_equal(x.vectors(rows), s.vectors(rows))
        assert x.stats()["rows"] == s.n_rows
        assert x.stats()["active_facts"] == int(s.active.sum())
    with pytest.raises(Exception, match="out of range"):
        pairs[0].index.facts([pairs[0].index.n_rows])


@st.composite
def sessions(draw: Any, n_pairs: int) -> dict[str, Any]:
    ints = st.lists(st.integers(-2, 2), min_size=DIM, max_size=DIM).filter(any)
    vec = ints.map(lambda v: np.array(v, np.float32) / np.linalg.norm(v))
    return {
        "pair": draw(st.integers(0, n_pairs - 1)),
        "q": draw(vec),
        "gate": draw(st.sampled_from([-1.0, -0.3, 0.0, 0.25, 0.6])),
        "limit": draw(st.one_of(st.none(), st.integers(1, 60))),
        "top_k": draw(st.one_of(st.none(), st.integers(1, 40))),
        "mode": draw(st.sampled_from(["cdr", "relevance", "mmr"])),
        "coverage": draw(st.lists(st.tuples(vec, st.sampled_from([0.0, 0.4, 1.0])),
                                  max_size=3)),
        "residual": draw(st.lists(vec, max_size=3)),
        "blacklist_seed": draw(st.integers(0, 2**16)),
        "blacklist_size": draw(st.sampled_from([0, 1, 5, 40])),
    }


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_sharded_ranking_equals_the_single_ckf_ranking_exactly(pairs, data) -> None:
    w = data.draw(sessions(len(pairs)))
    p = pairs[w["pair"]]
    s, x = p.single, p.index
    coverage = CoverageSet(DIM)
    for k, (v, weight) in enumerate(w["coverage"]):
        coverage.add(v, weight, k + 1)
    residual = ResidualSet([SubQuery(f"s{k}", "t") for k in range(len(w["residual"]))],
                           np.array(w["residual"], np.float32).reshape(-1, DIM), DIM)
    hashes = np.unique(s.ngram_hashes)
    rng = np.random.default_rng(w["blacklist_seed"])
    blacklist = rng.choice(hashes, min(w["blacklist_size"], len(hashes)), replace=False) \
        if len(hashes) else np.zeros(0, np.uint64)

    # One CKF: Phase 1, then Phase 2 over the selection (what the window loop does).
    sel = s.select(w["q"], w["gate"], w["limit"])
    counts = s.ngram_index.count_in(blacklist)[sel.indices] if len(blacklist) else None
    kw = {"coverage": coverage, "residual": residual, "mode": w["mode"],
          "min_relevance": w["gate"], "top_k": w["top_k"]}
    want = rank(sel.embeddings, sel.relevances, importance=s.importance[sel.indices],
                ngram_counts=counts, rows=sel.indices, **kw)

    if w["mode"] == "mmr":  # sequential: the gated pool comes from the shards, ranked here
        pool = x.select(w["q"], w["gate"], w["limit"])
        np.testing.assert_array_equal(pool.indices, sel.indices)
        np.testing.assert_array_equal(pool.relevances, sel.relevances)
        np.testing.assert_array_equal(pool.embeddings, sel.embeddings)
        pcounts = x.ngram_index.count_in(blacklist)[pool.indices] if len(blacklist) else None
        got = rank(pool.embeddings, pool.relevances, importance=x.importance[pool.indices],
                   ngram_counts=pcounts, rows=pool.indices, **kw)
        emb, tokens, ids = x.vectors(got.indices), x.token_counts[got.indices], \
            x.fact_ids(got.indices)
    else:
        got, emb, tokens, ids = x.rank_window(WindowQuery(
            w["q"], w["gate"], w["limit"], coverage.centroid(), bool(coverage),
            residual.embeddings, blacklist.astype(np.uint64), w["mode"], w["top_k"]))

    np.testing.assert_array_equal(got.indices, want.indices)  # same rows, same order
    for name in ("score", "relevance", "novelty", "residual_pull", "ngram_penalty",
                 "coverage_score"):  # bit for bit: every per-fact product is row-independent
        np.testing.assert_array_equal(getattr(got, name), getattr(want, name), err_msg=name)
    assert (got.mode, got.n_candidates, got.ngram_activations) == \
        (want.mode, want.n_candidates, want.ngram_activations)
    np.testing.assert_array_equal(emb, s.vectors(want.indices).reshape(-1, DIM))
    np.testing.assert_array_equal(tokens, s.token_counts[want.indices])
    assert ids == s.fact_ids(want.indices)


def test_near_ties_rank_alike_on_ray_shards_and_one_ckf(cluster: None,
                                                        tmp_path: Path) -> None:
    """Many exact and near ties at a real model's width (d = 384): duplicated rows and rows
    one float32 step apart. BLAS products made the shards' scores differ from one CKF's in
    the last bit and such facts swap places; every per-fact product is now row-independent,
    so rows, order and scores are identical — with and without a second round."""
    from tests.test_shard_merge import DIM as WIDE
    from tests.test_shard_merge import near_tied_docs, unit

    rng = np.random.default_rng(3)
    q0 = unit(rng.standard_normal(WIDE).astype(np.float32))
    single_path, shards = build_pair(tmp_path, near_tied_docs(2, 50, q0), 4, "test/model",
                                     WIDE)
    single = CKFSnapshot.open(single_path)
    x = RayShardedIndex(shards, retry_seconds=30)
    rounds = set()
    try:
        for case in range(16):
            q = unit(q0 + rng.standard_normal(WIDE).astype(np.float32) * 0.02)
            res = unit(q + rng.standard_normal((3, WIDE)).astype(np.float32) * 0.06)
            cov = CoverageSet(WIDE)
            cov.add(unit(q + rng.standard_normal(WIDE).astype(np.float32) * 0.05), 0.6, 1)
            residual = ResidualSet([SubQuery(f"s{k}", "t") for k in range(3)], res, WIDE)
            mode = "relevance" if case % 4 == 0 else "cdr"
            limit, top_k = [(None, 64), (300, 64), (60, 5), (4000, None)][case % 4]
            sel = single.select(q, 0.55, limit)
            want = rank(sel.embeddings, sel.relevances, importance=single.importance[
                sel.indices], coverage=cov, residual=residual, mode=mode, min_relevance=0.55,
                top_k=top_k, rows=sel.indices)
            got, _, _, ids = x.rank_window(WindowQuery(
                q, 0.55, limit, cov.centroid(), True, residual.embeddings,
                np.zeros(0, np.uint64), mode, top_k))
            rounds.add(x.rounds)
            np.testing.assert_array_equal(got.indices, want.indices, err_msg=f"case {case}")
            np.testing.assert_array_equal(got.score, want.score, err_msg=f"case {case}")
            np.testing.assert_array_equal(got.relevance, want.relevance)
            assert ids == single.fact_ids(want.indices)
            assert int((np.diff(want.score) == 0).sum()) > 0  # there were ties to order
    finally:
        x.close(stop_actors=True)
        single.close()
    assert rounds == {1, 2}


# ---------------------------------------------------------------------- the window loop


def _docs_of(snapshot: CKFSnapshot) -> list[Doc]:
    """A real CKF's facts (MiniLM vectors) regrouped as documents, in row order."""
    facts = snapshot.facts(range(snapshot.n_rows))
    vecs = snapshot.vectors(range(snapshot.n_rows))
    by_source: dict[str, list[int]] = {}
    for f in facts:
        by_source.setdefault(f.source, []).append(f.row)
    return [(src, facts[rows[0]].importance, [facts[r].content for r in rows], vecs[rows])
            for src, rows in by_source.items()]


@pytest.fixture(scope="module")
def real_pair(cluster: None, types_ckf_path: Path,
              tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    with CKFSnapshot.open(types_ckf_path) as base:
        docs, model_id, dim = _docs_of(base), base.model_id, base.dim
    single, shards = build_pair(tmp_path_factory.mktemp("real"), docs, 3, model_id, dim)
    pair = Pair(CKFSnapshot.open(single), RayShardedIndex(shards, retry_seconds=60))
    yield pair
    pair.index.close(stop_actors=True)
    pair.single.close()


def _windows(index: Any, ranking: str, between: Any = None, **config: Any) -> list[tuple]:
    gen = Generator(index, get_writer("extractive"),
                    GenerationConfig(ranking=ranking, max_windows=3, words=2000, **config))
    session = gen.start(BUILTIN_TYPES_TASK, BUILTIN_TYPES_OUTLINE)
    out = []
    for e in gen.run(BUILTIN_TYPES_TASK, session=session):
        out.append((e.prepared.envelope.fact_ids, e.prepared.envelope.ranking.score.tolist(),
                    e.prepared.envelope.to_dict(), e.output, e.status, e.headers))
        if between is not None and len(out) == 1:
            between()
    return out


def assert_same_windows(got: list[tuple], want: list[tuple]) -> None:
    """Same facts in the same order, same text, status and headers, the same envelope
    (score components bit for bit, as in the hypothesis test above)."""
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g[0] == w[0]  # packed fact ids, in layout order
        assert g[1] == w[1]  # scores
        assert g[2] == w[2]  # the whole envelope, ranking included
        assert g[3:] == w[3:]  # output, status, headers


# A small envelope, the default one, one so large that 64 candidates cannot fill it (the loop
# asks the shards again for more until greedy packing is settled), `envelope=fit` (its own
# fact cap), the "fresh" profile, whose fact memory re-sorts the whole ranking: it is ranked
# centrally over select(), as mmr is; and "focused", whose fused relevance (cdr.retrieval.lexical)
# needs BM25 over the whole row space: the same order as one CKF's, from the same statistics.
CONFIGS = [{"max_envelope_facts": 3}, {}, {"context_tokens": 60000}, {"envelope": "fit"},
           {"profile": "fresh"}, {"profile": "focused"}]


@pytest.mark.parametrize("config", CONFIGS,
                         ids=["3-facts", "default", "60k-context", "fit", "fresh", "focused"])
@pytest.mark.parametrize("ranking", ["cdr", "relevance", "mmr"])
def test_the_loop_on_ray_shards_writes_the_same_windows_as_on_one_ckf(
        real_pair: Pair, ranking: str, config: dict[str, Any],
        monkeypatch: pytest.MonkeyPatch) -> None:
    assert isinstance(real_pair.index, FactIndex)
    assert isinstance(real_pair.index, RankingIndex)
    assert not isinstance(real_pair.single, RankingIndex)
    local = _windows(real_pair.single, ranking, **config)
    assert len(local) >= 2 and local[0][0]
    asked: list[int | None] = []  # top_k of each rank_window call the loop made
    real = RayShardedIndex.rank_window

    def counted(self: RayShardedIndex, w: WindowQuery) -> Any:
        asked.append(w.top_k)
        return real(self, w)

    monkeypatch.setattr(RayShardedIndex, "rank_window", counted)
    assert_same_windows(_windows(real_pair.index, ranking, **config), local)
    if ranking == "mmr" or config.get("profile") in ("fresh", "focused"):  # ranked centrally
        assert asked == []
    else:  # ranked on the shards, shipping only the top candidates
        assert len(asked) >= len(local) and all(k is not None and k < 4000 for k in asked)
        if "context_tokens" in config:
            assert max(asked) > 64  # the first 64 did not settle the large envelope


def _wait_for_new_pid(index: RayShardedIndex, shard: int, old: int) -> int:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        pid = index.shard_pids()[shard]
        if pid != old:
            return pid
        time.sleep(0.5)
    raise AssertionError(f"shard-{shard} was not restarted")


def test_a_killed_shard_process_is_restarted_and_the_run_is_unchanged(real_pair: Pair) -> None:
    x = real_pair.index
    want = _windows(real_pair.single, "cdr")
    victim = 1
    old = x.shard_pids()[victim]

    def kill() -> None:  # mid-run, between window 1 and window 2
        os.kill(old, signal.SIGKILL)

    got = _windows(x, "cdr", between=kill)
    assert_same_windows(got, want)
    assert _wait_for_new_pid(x, victim, old) != old  # Ray restarted it; it re-mapped its shard


def test_a_shard_that_stays_down_fails_the_request_naming_it(cluster: None,
                                                             tmp_path: Path) -> None:
    docs, _ = random_docs(9, 6)
    _, shards = build_pair(tmp_path, docs, 2, "test/model", DIM)
    x = RayShardedIndex(shards, retry_seconds=120, max_restarts=0)
    q = np.ones(DIM, np.float32)
    try:
        assert len(x.select(q, -1.0, 5)) == 5
        pid = x.shard_pids()[1]
        x.retry_seconds = 3  # how long a caller waits for a shard before giving up
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(ShardUnavailableError, match=r"shard-1 of .* is unavailable") as e:
            x.select(q, -1.0, 5)
        assert e.value.http_status == 503 and e.value.shard == 1
    finally:
        x.close(stop_actors=True)


# ---------------------------------------------------------------------- ingest on the cluster


def test_ingest_on_the_cluster_equals_a_local_ingest(cluster: None, tmp_path: Path) -> None:
    from cdr.ckf import CKF, ingest
    from cdr.cli.samples import pydoc_topics_dir
    from cdr.cluster.ray_ingest import RayEmbedder
    from cdr.cluster.shardset import ingest_sharded, read_manifest

    docs = pydoc_topics_dir(tmp_path / "docs", topics=["truth", "pass", "lambda", "del"])
    ticks: list[tuple[str, int, int]] = []
    model = RayEmbedder(None, workers=2, task_texts=16)
    asked: list[int] = []  # texts each encode call asked for
    real_encode = model.encode
    model.encode = lambda texts, **kw: (asked.append(len(texts)), real_encode(texts, **kw))[1]
    try:
        rep = ingest_sharded(tmp_path / "kb", [str(docs)], 2, embedder=model,
                             progress=lambda *a: ticks.append(a))
        assert model._prefetched == {}  # every text ingest announced was taken
    finally:
        model.close()
    assert sum(asked) == rep.embedded  # prefetched or not, each new text embedded once
    assert rep.facts_added > 0 and rep.embedded == rep.facts_added
    embeds = [t for t in ticks if t[0] == "embed"]
    assert embeds[-1][1] == embeds[-1][2] == rep.embedded  # one bar over the whole job
    with CKF.create(tmp_path / "local") as local:
        ingest(local, [str(docs)])
        by_id = dict(zip(local.fact_ids(range(local.n_rows)), local.vectors(
            range(local.n_rows)), strict=True))
    n = 0
    for path in read_manifest(tmp_path / "kb").paths:
        with CKFSnapshot.open(path) as s:
            for fid, v in zip(s.fact_ids(range(s.n_rows)), s.vectors(range(s.n_rows)),
                              strict=True):
                np.testing.assert_allclose(v, by_id[fid], atol=1e-5)
                n += 1
    assert n == len(by_id)


def test_reembed_on_ray_workers_equals_a_local_reembed(cluster: None, tmp_path: Path) -> None:
    """`cdr ckf reembed` on the cluster's embedding actors (issue 26): every fact gets the
    vector a local re-embedding gives it, each text embedded once although the next chunk is
    queued ahead, and the new identity committed."""
    from cdr.ckf import CKF, ingest
    from cdr.ckf.reembed import reembed
    from cdr.cli.samples import pydoc_topics_dir
    from cdr.cluster.ray_ingest import RayEmbedder

    docs = pydoc_topics_dir(tmp_path / "docs", topics=["truth", "pass", "lambda"])
    with CKF.create(tmp_path / "kb", recipe="plain") as kb:
        ingest(kb, [str(docs)])
    shutil.copytree(tmp_path / "kb", tmp_path / "local")
    with CKF.open(tmp_path / "local") as local:
        reembed(local, "title-section-short")
        want = local.vectors(range(local.n_rows)).copy()
    model = RayEmbedder(None, workers=2, task_texts=8)
    asked: list[int] = []
    real_encode = model.encode
    model.encode = lambda texts, **kw: (asked.append(len(texts)), real_encode(texts, **kw))[1]
    try:
        with CKF.open(tmp_path / "kb") as kb:
            seen: list[int] = []
            rep = reembed(kb, "title-section-short", embedder=model, chunk_rows=3,
                          progress=lambda d, t: seen.append(d))
            assert rep.embedded == kb.n_rows > 6 and sum(asked) == kb.n_rows
            assert model._prefetched == {}  # every queued chunk was asked for
            assert seen[-1] == kb.n_rows and seen == sorted(seen)
            assert kb.model_id.endswith("all-MiniLM-L6-v2#title-section-short")
            np.testing.assert_allclose(kb.vectors(range(kb.n_rows)), want, atol=1e-5)
    finally:
        model.close()


def test_cli_reembed_on_the_cluster(cluster: None, tmp_path: Path) -> None:
    """`cdr ckf reembed --ray HOST:PORT --ray-workers 2` re-embeds on the cluster's actors."""
    import json

    from typer.testing import CliRunner

    from cdr.ckf import CKF, ingest
    from cdr.cli import app
    from cdr.cli.samples import pydoc_topics_dir

    docs = pydoc_topics_dir(tmp_path / "docs", topics=["truth", "pass"])
    with CKF.create(tmp_path / "kb") as kb:
        ingest(kb, [str(docs)])
        n = kb.n_rows
    address = os.environ.get("CDR_RAY_ADDRESS") or "127.0.0.1:6379"  # joined already
    res = CliRunner().invoke(app, ["ckf", "reembed", "--ckf", str(tmp_path / "kb"), "--recipe",
                                   "plain", "--ray", address, "--ray-workers", "2", "--json"])
    assert res.exit_code == 0, res.output
    rep = json.loads(res.output[res.output.index("{"):])
    assert rep["embedded"] == rep["rows"] == n and not rep["model_id"].endswith("#plain")
    with CKF.open(tmp_path / "kb") as kb:
        assert kb.recipe == "plain" and kb.check() == []


def test_ray_embedder_pieces_prefetch_and_a_clear_error_without_cpus(cluster: None) -> None:
    from cdr.cluster.ray_ingest import RayEmbedder
    from cdr.errors import CdrError
    from cdr.retrieval.embed import default_embedder

    model = RayEmbedder(None, workers=2, task_texts=4)
    try:
        # Equal pieces, a few per worker, none above task_texts, covering every text once.
        for n in (1, 2, 7, 8, 9, 30):
            pieces = model._pieces(n)
            assert [b - a for a, b in pieces] and pieces[0][0] == 0 and pieces[-1][1] == n
            assert all(p[1] == q[0] for p, q in itertools.pairwise(pieces))
            sizes = [b - a for a, b in pieces]
            assert max(sizes) <= 4 and max(sizes) - min(sizes) <= 1
            assert len(pieces) >= min(n, 2 * 4)
        texts = [f"sentence number {i} about {w}" for i, w in
                 enumerate(["lists", "tuples", "sets", "dicts"] * 5)]
        local = default_embedder().encode(texts)
        np.testing.assert_allclose(model.encode(texts), local, atol=1e-5)
        model.prefetch(texts[3:15])
        assert len(model._prefetched) == 12
        got = model.encode(texts)  # part from the prefetch, the rest embedded now
        np.testing.assert_allclose(got, local, atol=1e-5)
        assert model._prefetched == {}
        model.prefetch(texts[:2])
        model.forget()
        assert model._prefetched == {}
        assert model.encode([]).shape == (0, model.dim)
    finally:
        model.close()
    # More workers than the cluster has CPUs: a clear error instead of a wait forever.
    with pytest.raises(CdrError, match="did not start within 3 s: each needs one free CPU"):
        RayEmbedder(None, workers=16, start_seconds=3)


# ------------------------------------------ a real ingest: one CKF and `--shards 3` of a folder

# A paragraph several documents carry word for word (a notice every page repeats): one CKF
# stores it once; a shard set once per shard holding one of them, which the index reads once.
SHARED = ("Every built-in type described on this page can be tested for truth value, compared "
          "for equality and converted to a string with str(); instances of user classes "
          "behave the same way unless the class defines __bool__, __eq__ or __str__, which "
          "the interpreter then calls instead of the default behaviour described here.")
SHARED_IN = ("truth", "typesseq", "typesmapping", "integers", "strings", "lists", "dict",
             "floating")


@dataclass
class IngestedPair:
    single: CKFSnapshot
    index: RayShardedIndex
    shared_rows: int  # rows of the shard set that hold a fact another shard holds too


@pytest.fixture(scope="module")
def ingested_pair(cluster: None, tmp_path_factory: pytest.TempPathFactory
                  ) -> Iterator[IngestedPair]:
    """The same folder ingested as `cdr ingest` does, once into one CKF and once into a
    3-shard set: different row orders, and a paragraph held by documents in every shard."""
    from cdr.ckf import CKF, ingest
    from cdr.cli.samples import pydoc_topics_dir
    from cdr.cluster.shardset import ingest_sharded
    from tests.conftest import BUILTIN_TYPES_TOPICS, DISTRACTOR_TOPICS

    root = tmp_path_factory.mktemp("ingested")
    docs = pydoc_topics_dir(root / "docs", topics=list(BUILTIN_TYPES_TOPICS + DISTRACTOR_TOPICS))
    for name in SHARED_IN:
        page = docs / f"{name}.txt"
        page.write_text(page.read_text(encoding="utf-8").rstrip() + "\n\n" + SHARED + "\n",
                        encoding="utf-8")
    with CKF.create(root / "one.ckf") as ckf:
        assert not ingest(ckf, [str(docs)], source_type="official").skipped
    assert not ingest_sharded(root / "set", [str(docs)], 3, source_type="official").skipped
    single = CKFSnapshot.open(root / "one.ckf")
    index = RayShardedIndex(root / "set", retry_seconds=60)
    ids = index.fact_ids(range(index.n_rows))
    hidden = int((~index.active).sum()) - int((~single.active).sum())
    shared = len(ids) - len(set(ids))
    yield IngestedPair(single, index, shared)
    index.close(stop_actors=True)
    single.close()
    assert hidden == shared  # every second copy hidden, nothing else


def _layout_free(windows: list[tuple]) -> list[tuple]:
    """The windows without row numbers (the two layouts number rows differently)."""
    out = []
    for fact_ids, scores, env, *rest in windows:
        ranking = {k: v for k, v in env["ranking"].items() if k != "indices"}
        out.append((fact_ids, scores, {**env, "ranking": ranking}, *rest))
    return out


@pytest.mark.parametrize("profile", ["focused", "spec", "fresh"])
@pytest.mark.parametrize("ranking", ["cdr", "relevance"])
def test_a_sharded_ingest_writes_the_same_windows_as_one_ckf_under_every_profile(
        ingested_pair: IngestedPair, profile: str, ranking: str) -> None:
    """What `cdr ingest --shards 3` and `cdr ingest` of one folder give `cdr generate`: the
    same envelopes (the same facts in the same order, every score component bit for bit:
    each text is embedded alone, so its vector does not depend on how either ingest batched
    it), the same text, statuses and headers, under the faces' default profile (BM25 fusion,
    document support, the section pool, navigation) and the others."""
    p = ingested_pair
    assert p.shared_rows >= 2  # the folder does exercise facts held by several shards
    want = _layout_free(_windows(p.single, ranking, profile=profile))
    got = _layout_free(_windows(p.index, ranking, profile=profile))
    assert len(want) >= 2 and len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g[0] == w[0]  # packed fact ids, in layout order
        assert g[3:] == w[3:]  # output, status, headers (the ETag included)
        gr, wr = g[2]["ranking"], w[2]["ranking"]
        assert {k: v for k, v in g[2].items() if k != "ranking"} == \
            {k: v for k, v in w[2].items() if k != "ranking"}
        for key, value in wr.items():
            if isinstance(value, list):
                np.testing.assert_array_equal(gr[key], value, err_msg=key)
            else:
                assert gr[key] == value, key


def test_the_shared_fact_reads_once_with_the_source_one_ckf_gives_it(
        ingested_pair: IngestedPair) -> None:
    p = ingested_pair
    from cdr.ckf.chunk import fact_id

    fid = fact_id(SHARED)
    single_rows = [f for f in p.single.facts(np.flatnonzero(p.single.active))
                   if f.id == fid]
    sharded = [f for f in p.index.facts(np.flatnonzero(p.index.active)) if f.id == fid]
    assert len(single_rows) == 1 and len(sharded) == 1
    # the holder whose source sorts first, in both layouts, whatever the ingest order
    assert sharded[0].source == single_rows[0].source
    assert Path(sharded[0].source).name == f"{min(SHARED_IN)}.txt"
    assert sharded[0].importance == single_rows[0].importance
