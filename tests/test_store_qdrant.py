"""A Qdrant collection as the knowledge base (`cdr.stores`), on a real collection of Qdrant's
local mode written with the official client: the collection's own vectors ranked exactly as a
CKF of the same facts ranks them, the §2.5 identity checked on the collection itself, and
every refusal naming its problem."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from cdr.ckf import CKF
from cdr.errors import InvalidInputError, NotFoundError
from cdr.knowledge_base import check_index_address, open_fact_index
from cdr.stores.array_index import ArrayFactIndex
from cdr.stores.qdrant import MAX_TEXT_CHARS, open_qdrant, parse_address
from cdr.window.loop import GenerationConfig, Generator
from cdr.writers import get_writer
from tests.conftest import BUILTIN_TYPES_OUTLINE, BUILTIN_TYPES_TASK, build_topics_ckf, built_once

qdrant_client = pytest.importorskip("qdrant_client")
models = qdrant_client.models
TOPICS = ("types", "typesseq", "typesmapping", "truth", "lambda")


@pytest.fixture(scope="module")
def plain_ckf(tmp_path_factory: pytest.TempPathFactory) -> CKF:
    """Facts embedded alone (the `plain` recipe): what a LangChain or LlamaIndex store holds,
    one vector per text."""
    path = built_once(tmp_path_factory, "qdrant-plain-ckf",
                      lambda root: build_topics_ckf(root, TOPICS, recipe="plain"))
    return CKF.open(path)


def _write_collection(path: Path, name: str, texts: list[str], vectors: np.ndarray,
                      payloads: list[dict[str, Any]]) -> None:
    client = qdrant_client.QdrantClient(path=str(path))
    try:
        client.create_collection(name, vectors_config=models.VectorParams(
            size=int(vectors.shape[1]), distance=models.Distance.COSINE))
        # ids a user's store would have (random UUIDs): the scroll order is the store's own
        client.upsert(name, points=[
            models.PointStruct(id=str(uuid.UUID(int=(i * 2654435761) % 2**128)),
                               vector=v.tolist(), payload=p)
            for i, (v, p) in enumerate(zip(vectors, payloads, strict=True))])
    finally:
        client.close()


def _langchain_payloads(ckf: CKF) -> tuple[list[str], np.ndarray, list[dict[str, Any]]]:
    facts = ckf.facts(np.arange(ckf.n_rows))
    texts = [f.content for f in facts]
    payloads = [{"page_content": f.content,
                 "metadata": {"source": f.source, "section": f.section}} for f in facts]
    return texts, np.asarray(ckf.embeddings, np.float32), payloads


@pytest.fixture(scope="module")
def store(plain_ckf: CKF, tmp_path_factory: pytest.TempPathFactory) -> str:
    root = tmp_path_factory.mktemp("qdrant")
    texts, vectors, payloads = _langchain_payloads(plain_ckf)
    order = np.random.default_rng(7).permutation(len(texts))  # a store's own order
    _write_collection(root / "storage", "docs", [texts[i] for i in order], vectors[order],
                      [payloads[i] for i in order])
    return f"qdrant:{root / 'storage'}?collection=docs"


def _envelopes(index: Any, profile: str) -> list[list[str]]:
    gen = Generator(index, get_writer("extractive"),
                    GenerationConfig(max_windows=3, words=900, profile=profile))  # type: ignore[arg-type]
    session = gen.start(BUILTIN_TYPES_TASK, BUILTIN_TYPES_OUTLINE)
    return [list(e.prepared.envelope.fact_ids) for e in gen.run(BUILTIN_TYPES_TASK,
                                                                 session=session)]


def test_the_collection_is_read_with_its_own_vectors_and_payloads(plain_ckf: CKF,
                                                                  store: str) -> None:
    index = open_fact_index(store)
    assert isinstance(index, ArrayFactIndex) and index.n_rows == plain_ckf.n_rows
    assert index.model_id == plain_ckf.model_id and index.skipped == {}
    by_id = {f.id: f for f in plain_ckf.facts(np.arange(plain_ckf.n_rows))}
    for f, v in zip(index.facts(np.arange(index.n_rows)), index.vectors(np.arange(index.n_rows)),
                    strict=True):
        want = by_id[f.id]  # the CKF's fact id for the same text
        assert (f.content, f.source, f.section, f.tokens) == (
            want.content, want.source, want.section, want.tokens)
        np.testing.assert_allclose(v, plain_ckf.vectors([want.row])[0], atol=1e-6)


@pytest.mark.parametrize("profile", ["spec", "focused"])
def test_ranking_on_the_store_equals_ranking_on_a_ckf_of_the_same_facts(
        plain_ckf: CKF, store: str, profile: str) -> None:
    """The same facts, in another row order (the store's scroll order): the same envelopes,
    fact for fact, under the spec's loop and under the default profile (BM25 fusion, document
    support, the section pool and navigation all read the store's index)."""
    index = open_fact_index(store)
    order = [index.fact_ids([r])[0] for r in range(index.n_rows)]
    assert order != plain_ckf.fact_ids(np.arange(plain_ckf.n_rows))  # another order indeed
    on_ckf, on_store = _envelopes(plain_ckf, profile), _envelopes(index, profile)
    assert on_ckf and on_ckf == on_store


def test_vectors_another_model_made_are_refused(plain_ckf: CKF, tmp_path: Path) -> None:
    texts, vectors, payloads = _langchain_payloads(plain_ckf)
    rng = np.random.default_rng(0)
    other = rng.normal(size=vectors.shape).astype(np.float32)  # 384-d, not MiniLM's
    _write_collection(tmp_path / "s", "other", texts[:20], other[:20], payloads[:20])
    with pytest.raises(InvalidInputError, match=r"were not made by .* from the points' text"):
        open_qdrant(f"qdrant:{tmp_path / 's'}?collection=other")


def test_vectors_of_another_width_are_refused(plain_ckf: CKF, tmp_path: Path) -> None:
    texts, vectors, payloads = _langchain_payloads(plain_ckf)
    _write_collection(tmp_path / "s", "narrow", texts[:5], vectors[:5, :128], payloads[:5])
    with pytest.raises(InvalidInputError, match=r"vector of width 128; the model .* 384-d"):
        open_qdrant(f"qdrant:{tmp_path / 's'}?collection=narrow")


def test_points_without_text_or_with_a_huge_one_are_skipped_and_counted(
        plain_ckf: CKF, tmp_path: Path) -> None:
    texts, vectors, payloads = _langchain_payloads(plain_ckf)
    bad = [{"metadata": {"source": "x"}},  # no text at all
           {"page_content": "   "},  # blank
           {"page_content": "word " * 2_000_000}]  # a 10 MB payload: bounded, not read
    _write_collection(tmp_path / "s", "mixed", [*texts[:6], "", "", ""],
                      np.vstack([vectors[:6], vectors[:3]]), payloads[:6] + bad)
    index = open_qdrant(f"qdrant:{tmp_path / 's'}?collection=mixed")
    assert index.n_rows == 6
    assert index.skipped == {"no text": 2, f"text over {MAX_TEXT_CHARS:,} characters": 1}


def test_a_text_key_and_plain_payloads_are_read(plain_ckf: CKF, tmp_path: Path) -> None:
    texts, vectors, _ = _langchain_payloads(plain_ckf)
    flat = [{"body": t, "title": "T", "url": "https://example.org/p"} for t in texts[:4]]
    _write_collection(tmp_path / "s", "flat", texts[:4], vectors[:4], flat)
    with pytest.raises(InvalidInputError, match="none of its 4 points holds a text under"):
        open_qdrant(f"qdrant:{tmp_path / 's'}?collection=flat")
    index = open_qdrant(f"qdrant:{tmp_path / 's'}?collection=flat&text=body")
    (f,) = index.facts([0])
    assert (f.source, f.section) == ("https://example.org/p", "T")


@pytest.mark.parametrize(("address", "error", "message"), [
    ("qdrant:/nowhere/at/all?collection=docs", NotFoundError, "no Qdrant storage folder"),
    ("qdrant:/tmp?collection=", InvalidInputError, "needs \\?collection=NAME"),
    ("qdrant:?collection=docs", InvalidInputError, "needs the storage folder"),
    ("qdrant:/tmp?collection=docs&colour=red", InvalidInputError, "unknown Qdrant address"),
    ("qdrant+http://10.1.2.3:6333?collection=docs", InvalidInputError, "not loopback"),
    ("qdrant+http://db.example.com?collection=docs", InvalidInputError, "CDR_STORE_REMOTE=1"),
    ("qdrant+http://?collection=docs", InvalidInputError, "needs a host"),
])
def test_a_bad_address_is_refused_before_anything_opens(address: str, error: type,
                                                        message: str) -> None:
    with pytest.raises(error, match=message):
        check_index_address(address) if error is InvalidInputError else None
        open_fact_index(address)


def test_loopback_servers_are_allowed_and_remote_ones_only_when_configured(
        monkeypatch: pytest.MonkeyPatch) -> None:
    assert parse_address("qdrant+http://127.0.0.1:6333?collection=d").url == "http://127.0.0.1:6333"
    assert parse_address("qdrant+http://[::1]:6333?collection=d").url == "http://::1:6333"
    monkeypatch.setenv("CDR_STORE_REMOTE", "1")
    addr = parse_address("qdrant+https://user:secret@db.example.com:6334?collection=d")
    assert addr.url == "https://db.example.com:6334" and "secret" not in addr.shown


def test_a_missing_collection_is_refused(store: str) -> None:
    with pytest.raises(NotFoundError, match="no such collection"):
        open_fact_index(store.replace("collection=docs", "collection=absent"))


def test_cdr_generate_runs_on_a_qdrant_collection(store: str, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from cdr.cli import app

    trace = tmp_path / "trace.json"
    outline = tmp_path / "outline.txt"
    outline.write_text(BUILTIN_TYPES_OUTLINE)
    result = CliRunner().invoke(app, [
        "generate", BUILTIN_TYPES_TASK, "--outline", str(outline), "--ckf", store,
        "--windows", "2", "--words", "600", "--trace", str(trace), "--out",
        str(tmp_path / "doc.md")])
    assert result.exit_code in (0, 3), result.output
    data = json.loads(trace.read_text())
    assert data["windows"] and all(w["envelope"] for w in data["windows"][:1])
    assert (tmp_path / "doc.md").read_text().strip()


@pytest.mark.parametrize(("address", "status", "words"), [
    ("qdrant+http://10.1.2.3:6333?collection=docs", 2, "not loopback"),
    ("qdrant:/tmp?collection=docs&colour=red", 2, "unknown Qdrant address parameters"),
    ("qdrant:/nowhere/at/all?collection=docs", 1, "no Qdrant storage folder"),  # as a CKF's
])
def test_the_cli_refuses_a_bad_store_in_one_line(tmp_path: Path, address: str, status: int,
                                                 words: str) -> None:
    """Through a real `cdr` process: a bad address is a usage error (exit 2), a missing store
    exits 1 as a missing CKF does; one line naming the problem, nothing written."""
    import subprocess
    import sys

    from tests.gateway_server import child_env

    out = tmp_path / "doc.md"
    proc = subprocess.run(
        [sys.executable, "-m", "cdr.cli", "generate", "A guide to X", "--ckf", address,
         "--out", str(out)], env=child_env({}), cwd=tmp_path, capture_output=True, text=True,
        timeout=120)
    assert proc.returncode == status, (proc.returncode, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0], proc.stderr
    assert not out.exists() and list(tmp_path.iterdir()) == []
