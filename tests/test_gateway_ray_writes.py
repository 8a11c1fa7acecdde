"""Writes through gateways serving a Ray shard set, and the gateways following the shards.

Two real `cdr serve --ckf ray://HOST:PORT/PATH` replicas (one SQLite session/job store) over
a 3-shard set of their own, actors on a real Ray head:

* An upload is ingested into the shard `shard_of("upload/NAME", 3)` names — the placement of
  `cdr ingest --shards` — and only there; its job is pollable from the other replica; once
  it succeeded both replicas' index holds the new facts (stats, a session grounded on them).
* A delete removes the document from its shard; both replicas stop counting its facts; an
  unknown id is a 404 JSON error, as on a local CKF. Bad uploads get the local 415/422.
* `cdr ingest --shards` run from outside changes a shard: both replicas pick the new
  generation up without a restart, and a session whose envelope was handed out before the
  change goes on with the client's token.

Needs `CDR_RAY_ADDRESS` (a Ray head the gateway processes join; `.ci/run` starts one).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.ray_head import require_ray_head

ray = require_ray_head()

from cdr.ckf.snapshot import CKFSnapshot  # noqa: E402
from cdr.cluster.ray_index import RayShardedIndex, connect  # noqa: E402
from cdr.cluster.shardset import ingest_sharded, shard_dir, shard_of  # noqa: E402
from tests.gateway_server import CRP, TASK, GatewayServer, base_env  # noqa: E402
from tests.test_ray_index import _docs_of, build_pair  # noqa: E402

pytest_plugins = ["tests.gateway_server"]
N_SHARDS = 3
TIDE = ("# Tide pools\n\nTide pools are rocky pools on the seashore, filled with seawater when "
        "the tide goes out. Anemones, limpets and small crabs live in them.\n\nAt low tide "
        "the pools warm in the sun, and the animals in them must bear heat and salt.\n")


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture(scope="module")
def shard_set(gateway_ckf: Path, tmp_path_factory: pytest.TempPathFactory
              ) -> Iterator[Path]:
    """A 3-shard set of the gateway CKF's facts; its actors are stopped at the end."""
    with CKFSnapshot.open(gateway_ckf) as base:
        docs, model_id, dim = _docs_of(base), base.model_id, base.dim
    _, root = build_pair(tmp_path_factory.mktemp("ray-writes"), docs, N_SHARDS, model_id,
                         dim)
    connect(os.environ["CDR_RAY_ADDRESS"])
    yield root
    RayShardedIndex(root).close(stop_actors=True)


@pytest.fixture(scope="module")
def replicas(shard_set: Path, tmp_path_factory: pytest.TempPathFactory
             ) -> Iterator[list[GatewayServer]]:
    tmp = tmp_path_factory.mktemp("ray-writes-gw")
    env = base_env(tmp, CDR_RAY_RETRY_SECONDS="20")  # one session/job file for both
    address = f"ray://{os.environ['CDR_RAY_ADDRESS']}{shard_set}"
    servers = [GatewayServer(env, via_cli=True, ckf=address, workdir=tmp / f"r{i}")  # type: ignore[arg-type]
               for i in range(2)]
    try:
        for s in servers:
            (tmp / s.workdir.name).mkdir(exist_ok=True)
            s.start()
        yield servers
    finally:
        for s in servers:
            s.stop()


def active(server: GatewayServer) -> int:
    r = httpx.get(f"{server.url}/v1/ckf/stats", timeout=60)
    assert r.status_code == 200, r.text
    return int(r.json()["active_facts"])


def wait_for(what: Callable[[], Any], until: Callable[[Any], bool], seconds: float = 120
             ) -> Any:
    deadline = time.monotonic() + seconds
    while not until(got := what()):
        assert time.monotonic() < deadline, got
        time.sleep(0.2)
    return got


def shard_sources(root: Path) -> list[set[str]]:
    out = []
    for i in range(N_SHARDS):
        with CKFSnapshot.open(shard_dir(root, i)) as snap:
            out.append({d["source"] for d in snap.documents() if d["n_facts"]})
    return out


def test_upload_goes_to_the_owning_shard_and_both_replicas_see_it(replicas, shard_set):
    a, b = replicas
    before = active(a)
    r = httpx.post(f"{a.url}/v1/ckf/documents", timeout=120,
                   files={"file": ("tide-pools.md", TIDE.encode(), "text/markdown")})
    assert r.status_code == 202, r.text
    assert r.headers["Location"] == f"/v1/ckf/jobs/{r.json()['id']}"
    job = wait_for(lambda: httpx.get(f"{b.url}/v1/ckf/jobs/{r.json()['id']}",
                                     timeout=60).json(),
                   lambda j: j["status"] not in ("queued", "running"))
    assert job["status"] == "succeeded", job
    [doc] = job["documents"]
    assert doc["source"] == "upload/tide-pools.md" and doc["facts"] >= 1
    owner = shard_of("upload/tide-pools.md", N_SHARDS)
    where = shard_sources(shard_set)
    assert [("upload/tide-pools.md" in s) for s in where] == [
        i == owner for i in range(N_SHARDS)]
    # The accepting replica reloaded before saying `succeeded`; the other follows.
    assert active(a) == before + doc["facts"]
    wait_for(lambda: active(b), lambda n: n == before + doc["facts"], 30)
    # A session on the other replica is grounded on the new facts.
    s = httpx.post(f"{b.url}/v1/sessions", timeout=120, json={
        "task": "Write about tide pools and the animals living in them",
        "outline": ["Tide pools", "Animals of the pools"], "words": 300,
        "window_tokens": 300, "max_windows": 2})
    assert s.status_code == 201, s.text
    env = httpx.post(f"{b.url}/v1/sessions/{s.json()['session_id']}/envelope",
                     headers=bearer(s.json()["token"]), timeout=120)
    assert env.status_code == 200, env.text
    assert "seashore" in str(env.json()["messages"])

    # Delete through the other replica: gone from the shard, from both indexes.
    gone = httpx.delete(f"{b.url}/v1/ckf/documents/{doc['doc_id']}", timeout=120)
    assert gone.status_code == 200, gone.text
    assert gone.json() == {"id": doc["doc_id"], "deleted": True,
                           "facts_removed": doc["facts"]}
    assert not any("upload/tide-pools.md" in s for s in shard_sources(shard_set))
    assert active(b) == before
    wait_for(lambda: active(a), lambda n: n == before, 30)
    again = httpx.delete(f"{a.url}/v1/ckf/documents/{doc['doc_id']}", timeout=120)
    assert again.status_code == 404 and "no document" in again.json()["error"]["message"]


def test_bad_uploads_on_a_shard_set_get_the_local_errors(replicas):
    a, _ = replicas
    with httpx.Client(base_url=a.url, timeout=60) as c:
        bad_type = c.post("/v1/ckf/documents", files={"file": ("x.exe", b"MZ\x00\x01")})
        too_short = c.post("/v1/ckf/documents", files={"file": ("x.md", b"")})
        twice = c.post("/v1/ckf/documents", files=[("file", ("a.md", TIDE.encode())),
                                                   ("file", ("a.md", TIDE.encode()))])
    assert bad_type.status_code == 415 and bad_type.json()["error"]["code"] == \
        "unsupported_file_type"
    assert too_short.status_code == 422, too_short.text
    assert twice.status_code == 422 and "appears twice" in twice.json()["error"]["message"]


def test_replicas_follow_an_outside_ingest_and_sessions_in_flight_go_on(
        replicas, shard_set, tmp_path):
    a, b = replicas
    r = httpx.post(f"{a.url}/v1/sessions", json={"task": TASK, **CRP}, timeout=120)
    assert r.status_code == 201, r.text
    sid = r.json()["session_id"]
    env = httpx.post(f"{a.url}/v1/sessions/{sid}/envelope",
                     headers=bearer(r.json()["token"]), timeout=120).json()
    before = active(a)

    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "glaciers.md").write_text(
        "# Glaciers\n\nA glacier is a persistent body of dense ice that moves under its own "
        "weight. Glaciers form where snow accumulates faster than it melts.\n")
    rep = ingest_sharded(shard_set, [docs], N_SHARDS)  # what `cdr ingest --shards` runs
    assert rep.facts_added >= 1
    for s in (a, b):  # no restart: each replica notices the new generation
        wait_for(lambda s=s: active(s), lambda n: n == before + rep.facts_added, 30)

    from cdr.writers import get_writer

    text = get_writer("extractive").generate(env["messages"], env["max_tokens"]).text
    w = httpx.post(f"{b.url}/v1/sessions/{sid}/windows", headers=bearer(env["token"]),
                   json={"text": text, "etag": env["etag"]}, timeout=120)
    assert w.status_code == 200, w.text
    nxt = httpx.post(f"{a.url}/v1/sessions/{sid}/envelope",
                     headers=bearer(w.json()["token"]), timeout=120)
    assert nxt.status_code == 200, nxt.text
