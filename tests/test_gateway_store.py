"""A Qdrant collection served as a named knowledge base by a real `cdr serve` (`--kb
NAME=qdrant:...`): the official `openai` client writes a document from it, its stats are
the collection's, and an upload or a delete is a 409 that changes nothing."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from openai import OpenAI

from cdr.ckf import CKF
from cdr.gateway.auth import hash_key
from tests.conftest import build_topics_ckf, built_once
from tests.gateway_server import OUTLINE, SECRET, TASK, copy_ckf
from tests.kb_server import KbServer

qdrant_client = pytest.importorskip("qdrant_client")
pytest_plugins = ["tests.gateway_server", "tests.kb_server"]

KEY = "cdr_admin_Qd7vR2mX9pL4wT6yK1nB8cJ3dF5gS0eZ"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def collection(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, int]:
    """A local-mode collection of the gateway test CKF's topics, embedded alone (LangChain's
    payload shape): (its address, its points)."""
    path = built_once(tmp_path_factory, "store-plain-ckf", lambda root: build_topics_ckf(
        root, ("exceptions", "try", "with"), recipe="plain"))
    ckf = CKF.open(path)
    facts = ckf.facts(np.arange(ckf.n_rows))
    vectors = np.asarray(ckf.embeddings, np.float32)
    storage = tmp_path_factory.mktemp("store") / "qdrant"
    client = qdrant_client.QdrantClient(path=str(storage))
    client.create_collection("manual", vectors_config=qdrant_client.models.VectorParams(
        size=ckf.dim, distance=qdrant_client.models.Distance.COSINE))
    client.upsert("manual", points=[qdrant_client.models.PointStruct(
        id=str(uuid.UUID(int=i + 1)), vector=vectors[i].tolist(),
        payload={"page_content": f.content, "metadata": {"source": f.source,
                                                         "section": f.section}})
        for i, f in enumerate(facts)])
    client.close()
    return f"qdrant:{storage}?collection=manual", len(facts)


@pytest.fixture(scope="module")
def server(gateway_ckf: Path, collection: tuple[str, int],
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[KbServer]:
    tmp = tmp_path_factory.mktemp("gateway-store")
    docs = copy_ckf(gateway_ckf, tmp / "docs")
    env = {"CDR_SIGNING_SECRET": SECRET, "CDR_API_KEYS": f"admin:{hash_key(KEY)}",
           "CDR_SESSION_DB": str(tmp / "sessions.sqlite3")}
    with KbServer(env, ["--kb", f"docs={docs}", "--kb", f"manual={collection[0]}"],
                  tmp) as s:
        yield s


def test_the_openai_client_writes_from_the_collection(server: KbServer) -> None:
    client = OpenAI(base_url=server.openai_base_url, api_key=KEY, max_retries=0, timeout=120)
    out = client.chat.completions.create(
        model="cdr/manual", messages=[{"role": "user", "content": TASK}],
        extra_body={"crp": {"outline": OUTLINE, "words": 300, "window_tokens": 300,
                            "max_windows": 2}})
    assert out.choices[0].message.content and out.choices[0].message.content.strip()
    crp = out.model_extra["crp"]
    assert crp["windows"] >= 1 and crp["sources"]
    assert all(s["source"].endswith((".txt", ".md")) for s in crp["sources"])


def test_its_stats_are_the_collections(server: KbServer, collection: tuple[str, int]) -> None:
    with server.client(headers=AUTH) as c:
        r = c.get("/v1/kbs/manual/stats")
        assert r.status_code == 200, r.text
        assert r.json()["active_facts"] == collection[1]


def test_uploads_and_deletes_are_refused_and_change_nothing(
        server: KbServer, collection: tuple[str, int]) -> None:
    with server.client(headers=AUTH) as c:
        r = c.post("/v1/kbs/manual/documents",
                   files={"file": ("a.md", b"# A\n\nSome text that would be a fact here.\n")})
        assert r.status_code == 409, r.text
        assert r.json()["error"]["code"] == "read_only_kb"
        storage = collection[0].removeprefix("qdrant:").split("?")[0]
        assert storage not in r.text  # no server path in a response
        d = c.delete("/v1/kbs/manual/documents/anything")
        assert d.status_code == 409 and d.json()["error"]["code"] == "read_only_kb"
        assert c.get("/v1/kbs/manual/stats").json()["active_facts"] == collection[1]
        # the CKF beside it still takes uploads
        ok = c.post("/v1/kbs/docs/documents",
                    files={"file": ("b.md", b"# B\n\nAnother text long enough to be a fact.\n")})
        assert ok.status_code == 202, ok.text


def test_a_bad_collection_stops_serve_with_one_line(tmp_path: Path) -> None:
    import subprocess
    import sys

    from tests.gateway_server import child_env, free_port

    proc = subprocess.run(
        [sys.executable, "-m", "cdr.cli", "serve", "--port", str(free_port()), "--kb",
         f"manual=qdrant:{tmp_path / 'absent'}?collection=manual"],
        env=child_env({"CDR_SIGNING_SECRET": SECRET, "CDR_API_KEYS": f"admin:{hash_key(KEY)}",
                       "CDR_SESSION_DB": str(tmp_path / "s.sqlite3")}),
        cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "knowledge base 'manual'" in lines[0], proc.stderr
