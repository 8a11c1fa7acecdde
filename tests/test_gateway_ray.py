"""`cdr serve --ckf ray://HOST:PORT/PATH`: a real gateway process serving a shard set through
Ray actors. Its sidecar envelopes equal, field for field (etag, facts, plan, prompt), what the
library computes on one CKF holding the same facts; a chat completion writes a multi-window
document; a document listing merges every shard's; and a shard actor
that stays down fails the request with a 503 naming the shard.

Needs a Ray head the gateway process can join: `CDR_RAY_ADDRESS` (`.ci/run` starts one on
127.0.0.1 with token auth); skipped with that reason otherwise.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.ray_head import require_ray_head

ray = require_ray_head()

from cdr.ckf.snapshot import CKFSnapshot  # noqa: E402
from cdr.cluster.ray_index import RayShardedIndex, connect  # noqa: E402
from cdr.cluster.shardset import list_documents, shard_of  # noqa: E402
from cdr.writers import get_writer  # noqa: E402
from tests.gateway_server import CRP, TASK, GatewayServer, base_env  # noqa: E402
from tests.test_gateway_envelope_cache import bearer, library_envelope, shown  # noqa: E402
from tests.test_ray_index import _docs_of, build_pair  # noqa: E402

pytest_plugins = ["tests.gateway_server"]
RETRY_SECONDS = 3  # how long the gateway waits for a dead shard before its 503


@pytest.fixture(scope="module")
def shard_pair(gateway_ckf: Path, tmp_path_factory: pytest.TempPathFactory
               ) -> Iterator[tuple[Path, Path, RayShardedIndex]]:
    """The gateway CKF's facts as one CKF and as a 3-shard set, whose actors this process
    creates first (no restarts, so a killed one stays down; the gateway opens the same
    named actors) and stops at the end."""
    with CKFSnapshot.open(gateway_ckf) as base:
        docs, model_id, dim = _docs_of(base), base.model_id, base.dim
    # Each document by its file name: the CKF's sources are absolute paths in this run's
    # temporary directory, so their shards (sha256 of the source) changed from run to run and
    # one shard in ~20 runs held no document (the listing test then saw two shards of three).
    docs = [(Path(source).name, imp, contents, vectors) for source, imp, contents, vectors in docs]
    assert {shard_of(source, 3) for source, *_ in docs} == {0, 1, 2}
    single, shards = build_pair(tmp_path_factory.mktemp("ray-gw"), docs, 3, model_id, dim)
    connect(os.environ["CDR_RAY_ADDRESS"])
    index = RayShardedIndex(shards, max_restarts=0)
    try:
        yield single, shards, index
    finally:
        index.close(stop_actors=True)


@pytest.fixture(scope="module")
def ray_gateway(shard_pair, tmp_path_factory: pytest.TempPathFactory
                ) -> Iterator[GatewayServer]:
    _, shards, _ = shard_pair
    tmp = tmp_path_factory.mktemp("ray-gw-server")
    env = base_env(tmp, CDR_RAY_RETRY_SECONDS=str(RETRY_SECONDS))
    address = f"ray://{os.environ['CDR_RAY_ADDRESS']}{shards}"
    with GatewayServer(env, via_cli=True, ckf=address, workdir=tmp) as server:  # type: ignore[arg-type]
        yield server


def test_sidecar_windows_on_ray_shards_equal_the_library_on_one_ckf(
        shard_pair, ray_gateway: GatewayServer) -> None:
    single, _, _ = shard_pair
    db = Path(ray_gateway.env["CDR_SESSION_DB"])
    with ray_gateway.client() as c:
        health = c.get("/healthz").json()
        assert health["ckf"]["path"].startswith("ray://") and health["ckf"]["active_facts"] > 50
        r = c.post("/v1/sessions", json={"task": TASK, **CRP})
        assert r.status_code == 201, r.text
        sid, token = r.json()["session_id"], r.json()["token"]
        windows = 0
        while True:
            env = c.post(f"/v1/sessions/{sid}/envelope", headers=bearer(token))
            assert env.status_code == 200, env.text
            body = env.json()
            assert shown(body) == library_envelope(single, db, sid)
            text = get_writer("extractive").generate(body["messages"], body["max_tokens"]).text
            w = c.post(f"/v1/sessions/{sid}/windows", headers=bearer(body["token"]),
                       json={"text": text, "etag": body["etag"]})
            assert w.status_code == 200, w.text
            windows += 1
            token = w.json()["token"]
            if w.json()["status"] != "in-progress":
                break
        assert windows >= 2 and w.json()["status"] == "task-complete"
        got = c.get(f"/v1/sessions/{sid}", headers=bearer(token))
        assert got.status_code == 200, got.text
        trace = got.json()
        assert len(trace["windows"]) == windows and trace["status"] == "task-complete"

        stats = c.get("/v1/ckf/stats").json()
        assert len(stats["shards"]) == 3 and stats["active_facts"] == health["ckf"][
            "active_facts"]


def test_the_gateway_index_offers_shard_ranking_only_for_a_shard_set(
        shard_pair, gateway_ckf: Path) -> None:
    """The gateway's per-request wrapper forwards `rank_window`, so the loop ranks on the
    shards; over a local CKF it does not pretend to."""
    from cdr.gateway.selections import CachingIndex, SelectionCache
    from cdr.retrieval.factindex import RankingIndex

    assert isinstance(CachingIndex(shard_pair[2], SelectionCache()), RankingIndex)
    with CKFSnapshot.open(gateway_ckf) as local:
        assert not isinstance(CachingIndex(local, SelectionCache()), RankingIndex)


def test_chat_completion_on_ray_shards_writes_a_multi_window_document(
        ray_gateway: GatewayServer) -> None:
    with ray_gateway.client() as c:
        r = c.post("/v1/chat/completions", json={
            "model": "cdr", "messages": [{"role": "user", "content": TASK}], "crp": CRP})
    assert r.status_code == 200, r.text
    crp = r.json()["crp"]
    assert crp["windows"] >= 2 and crp["status"] == "task-complete"
    assert r.headers["CRP-Context-Mode"] == "full"


def test_listing_documents_of_a_shard_set_merges_every_shards(
        shard_pair, ray_gateway: GatewayServer) -> None:
    """Uploads and deletes go to the owning shard (tests/test_gateway_ray_writes.py); the
    listing asks every shard and gives each document once, with its shard."""
    _, shards, index = shard_pair
    with ray_gateway.client() as c:
        listed = c.get("/v1/ckf/documents")
    assert listed.status_code == 200, listed.text
    docs = listed.json()["documents"]
    want = list_documents(shards)
    assert [(d["doc_id"], d["shard"], d["n_facts"]) for d in docs] == \
        [(d["doc_id"], d["shard"], d["n_facts"]) for d in want]
    assert {d["shard"] for d in docs} == {0, 1, 2}
    assert index.documents() == want  # the library's call on the actors, same answer
    assert str(shards) not in listed.text  # no server path in the response


def test_a_shard_actor_that_stays_down_is_a_503_naming_it(
        shard_pair, ray_gateway: GatewayServer) -> None:
    _, _, index = shard_pair
    with ray_gateway.client() as c:
        r = c.post("/v1/sessions", json={"task": TASK, **CRP})
        assert r.status_code == 201, r.text
        sid, token = r.json()["session_id"], r.json()["token"]
        first = c.post(f"/v1/sessions/{sid}/envelope", headers=bearer(token))
        assert first.status_code == 200, first.text
        os.kill(index.shard_pids()[2], signal.SIGKILL)  # created with max_restarts=0
        down = c.post(f"/v1/sessions/{sid}/envelope", headers=bearer(first.json()["token"]))
    assert down.status_code == 503, down.text
    assert "shard-2 of" in down.json()["error"]["message"]
    assert "unavailable" in down.json()["error"]["message"]
