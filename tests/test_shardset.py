"""Shard sets without Ray: placement by a stable hash, `cdr ingest --shards`, re-ingest and
delete touching only the owning shard, one model per set, index addresses, the 503 error."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from cdr.ckf.committer import create_ckf
from cdr.ckf.snapshot import CKFSnapshot
from cdr.cli import app as main_app
from cdr.cli.ckf import app
from cdr.cluster.ray_index import ShardUnavailableError, parse_address
from cdr.cluster.shardset import (
    MANIFEST,
    create_shard_set,
    list_documents,
    merge_documents,
    open_shard_set,
    read_manifest,
    shard_dir,
    shard_of,
)
from cdr.errors import EmbeddingModelMismatchError, InvalidInputError, NotFoundError
from cdr.gateway.errors import from_cdr_error
from cdr.knowledge_base import open_fact_index
from tests.conftest import write_docs

DATA = Path(__file__).parent / "data" / "ckf"
runner = CliRunner()

TOPICS = {
    "asyncio.md": "# Tasks\n\nAn asyncio task wraps a coroutine and schedules it on the event "
                  "loop; awaiting the task returns the coroutine's result or raises its "
                  "exception. Cancelling a task raises CancelledError inside the coroutine.",
    "sqlite.md": "# Transactions\n\nSQLite runs each statement in a transaction; BEGIN "
                 "IMMEDIATE takes the write lock at once, so a writer never fails half way "
                 "with SQLITE_BUSY after it has read. WAL mode lets readers continue.",
    "numpy.md": "# Broadcasting\n\nNumPy broadcasting stretches arrays of size one along "
                "missing dimensions, so a (3, 1) array plus a (4,) array gives (3, 4) without "
                "copying data. Shapes are compared from the trailing dimension.",
    "ray.md": "# Actors\n\nA Ray actor is a stateful worker process; method calls on it run "
              "one at a time in submission order. With max_restarts set, Ray restarts an "
              "actor whose process died and runs its constructor again.",
    "git.md": "# Merging\n\nA three-way merge compares both branch tips with their merge "
              "base; a hunk changed on one side only is taken from that side, and a hunk "
              "changed differently on both sides is a conflict for a person to resolve.",
}


def test_shard_of_is_a_stable_hash_of_the_source() -> None:
    # Fixed values: placement must never change between versions, processes or machines.
    assert [shard_of(s, 4) for s in ("a", "docs/a.md", "https://x.org/p")] == [
        shard_of("a", 4), shard_of("docs/a.md", 4), shard_of("https://x.org/p", 4)]
    assert shard_of("a", 4) == 0xCA978112CA1BBDCA % 4  # first 8 bytes of sha256("a")
    assert shard_of("a", 1) == 0


@given(st.text(max_size=40), st.integers(1, 64))
def test_shard_of_is_in_range_and_deterministic(source: str, n: int) -> None:
    assert 0 <= shard_of(source, n) < n and shard_of(source, n) == shard_of(source, n)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("shards")
    docs = write_docs(root / "docs", TOPICS)
    shutil.copy(DATA / "indexes.md", docs / "indexes.md")
    kb = root / "kb.shards"
    result = runner.invoke(app, ["ingest", str(docs), "--ckf", str(kb), "--shards", "3",
                                 "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["documents_new"] == len(TOPICS) + 1 and not report["skipped"]
    return docs, kb


def _gens(kb: Path) -> list[int]:
    out = []
    for p in read_manifest(kb).paths:
        with CKFSnapshot.open(p) as s:
            out.append(s.generation)
    return out


def test_ingest_places_each_document_in_the_shard_its_source_hashes_to(built) -> None:
    docs, kb = built
    ss = open_shard_set(kb)
    assert ss.n_shards == 3 and json.loads((kb / MANIFEST).read_text())["shards"] == 3
    seen: dict[str, int] = {}
    for i, p in enumerate(ss.paths):
        with CKFSnapshot.open(p) as s:
            assert s.model_id == ss.model_id and s.dim == ss.dim
            for d in s.documents():
                seen[d["source"]] = i
    assert seen == {str(f): shard_of(str(f), 3) for f in docs.iterdir()}


def test_listing_a_shard_set_gives_every_document_once_with_its_shard(built) -> None:
    docs, kb = built
    listed = list_documents(kb)
    assert [d["source"] for d in listed] == sorted(str(f) for f in docs.iterdir())
    assert all(d["shard"] == shard_of(d["source"], 3) for d in listed)
    ids = {d["doc_id"] for d in listed}
    assert len(ids) == len(listed) and all(d["n_facts"] > 0 for d in listed)
    result = runner.invoke(app, ["ckf", "docs", "--ckf", str(kb), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == listed
    table = runner.invoke(app, ["ckf", "docs", "--ckf", str(kb)])
    assert table.exit_code == 0 and f"{len(listed)} documents" in table.stdout
    assert "shard" in table.stdout


def test_merged_listing_orders_by_source_and_keeps_each_shards_rows() -> None:
    per = [[{"source": "b", "doc_id": "2"}], [], [{"source": "a", "doc_id": "1"},
                                                   {"source": "c", "doc_id": "3"}]]
    assert merge_documents(per) == [{"source": "a", "doc_id": "1", "shard": 2},
                                    {"source": "b", "doc_id": "2", "shard": 0},
                                    {"source": "c", "doc_id": "3", "shard": 2}]
    assert merge_documents([[], []]) == []


def test_reingest_and_delete_touch_only_the_owning_shard(built, tmp_path: Path) -> None:
    docs, kb_built = built
    kb = tmp_path / "kb.shards"
    shutil.copytree(kb_built, kb)
    changed = docs / "numpy.md"
    owner = shard_of(str(changed), 3)
    before = _gens(kb)
    original = changed.read_text(encoding="utf-8")
    try:
        changed.write_text(original + " Broadcasting never copies the smaller array.",
                           encoding="utf-8")
        result = runner.invoke(app, ["ingest", str(changed), "--ckf", str(kb), "--json"])
        assert result.exit_code == 0, result.output
        assert json.loads(result.stdout)["documents_changed"] == 1
    finally:
        changed.write_text(original, encoding="utf-8")
    after = _gens(kb)
    assert [i for i in range(3) if after[i] != before[i]] == [owner]

    gone = docs / "git.md"
    result = runner.invoke(app, ["ckf", "rm", str(gone), "--ckf", str(kb)])
    assert result.exit_code == 0, result.output
    assert f"from shard-{shard_of(str(gone), 3)}" in result.stdout
    final = _gens(kb)
    assert [i for i in range(3) if final[i] != after[i]] == [shard_of(str(gone), 3)]
    result = runner.invoke(app, ["ckf", "rm", str(gone) + ".nope", "--ckf", str(kb)])
    assert result.exit_code == 1 and "no document" in result.output


def test_shard_count_cannot_change_in_place(built) -> None:
    docs, kb = built
    result = runner.invoke(app, ["ingest", str(docs), "--ckf", str(kb), "--shards", "2"])
    assert result.exit_code == 1
    assert "shard set of 3 shards, not 2" in " ".join(result.output.split())
    result = runner.invoke(app, ["ingest", str(docs), "--ckf", str(kb), "--shards", "0"])
    assert result.exit_code == 1 and "--shards must be an integer" in result.output


def test_a_set_mixing_two_models_is_refused_naming_both(tmp_path: Path) -> None:
    ss = create_shard_set(tmp_path / "mix", 2, "model/a", 8)
    shutil.rmtree(shard_dir(ss.root, 1))
    create_ckf(shard_dir(ss.root, 1), "model/b", 8)
    with pytest.raises(EmbeddingModelMismatchError) as e:
        open_shard_set(ss.root)
    assert "model/a" in str(e.value) and "model/b" in str(e.value)
    assert "shard-1" in str(e.value)
    with pytest.raises(EmbeddingModelMismatchError):
        create_shard_set(tmp_path / "mix2", 2, "model/a", 8) and \
            create_shard_set(tmp_path / "mix2", 2, "model/c", 8)


def test_manifest_errors_name_the_problem(tmp_path: Path) -> None:
    with pytest.raises(NotFoundError, match="no shard set"):
        read_manifest(tmp_path)
    (tmp_path / MANIFEST).write_text('{"format": "other"}')
    with pytest.raises(InvalidInputError, match="not a cdr-shard-set manifest"):
        read_manifest(tmp_path)
    (tmp_path / MANIFEST).write_text('{"format": "cdr-shard-set", "version": 1}')
    with pytest.raises(InvalidInputError, match="lacks 'shards'"):
        read_manifest(tmp_path)
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "f").write_text("")
    with pytest.raises(InvalidInputError, match="not a shard set"):
        create_shard_set(tmp_path / "x", 2, "m", 4)


@pytest.mark.parametrize(("address", "want"), [
    ("ray://127.0.0.1:6379/srv/kb.shards", ("127.0.0.1", 6379, "/srv/kb.shards")),
    ("ray://head:10001//abs/path", ("head", 10001, "/abs/path")),
])
def test_ray_addresses_parse(address: str, want: tuple) -> None:
    a = parse_address(address)
    assert (a.host, a.port, str(a.path)) == want
    assert a.gcs == f"{want[0]}:{want[1]}"


@pytest.mark.parametrize("address", [
    "ray://127.0.0.1/kb", "ray://127.0.0.1:99999/kb", "ray://:6379/kb", "ray://1.2.3.4:6379",
    "ray://1.2.3.4:6379/", "http://127.0.0.1:6379/kb"])
def test_bad_ray_addresses_are_refused(address: str) -> None:
    with pytest.raises(InvalidInputError, match="address"):
        parse_address(address)


def test_a_shard_set_directory_must_be_opened_through_ray(built) -> None:
    _, kb = built
    with pytest.raises(InvalidInputError, match=r"ray://HOST:PORT"):
        open_fact_index(kb)
    result = runner.invoke(main_app, ["generate", "a task", "--ckf", str(kb)])
    # The console wraps the line at its width, and a worker's temp path is longer: read the
    # message with its line breaks folded.
    assert result.exit_code == 1 and "is a shard set" in " ".join(result.output.split())


def test_an_unavailable_shard_is_a_503_naming_the_shard() -> None:
    err = ShardUnavailableError(2, "ray://127.0.0.1:6379/kb", "no answer within 5 s")
    api = from_cdr_error(err)
    assert api.status == 503
    body = api.body()
    assert "shard-2 of ray://127.0.0.1:6379/kb is unavailable" in json.dumps(body)
    assert "shard_unavailable" in json.dumps(body)


def test_commands_taking_an_index_by_address_check_it() -> None:
    result = runner.invoke(main_app, ["generate", "a task", "--ckf", "ray://127.0.0.1/kb"])
    assert result.exit_code == 2 and "bad Ray index address" in result.output
    result = runner.invoke(main_app, ["serve", "--ckf", "ray://127.0.0.1/srv/kb"])
    assert result.exit_code == 2 and "bad Ray index address" in result.output
