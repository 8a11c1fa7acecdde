"""`cdr ingest` and `cdr ckf stats|search|rm|docs|check|compact` through Typer's runner."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cdr.cli.ckf import app

DATA = Path(__file__).parent / "data" / "ckf"
runner = CliRunner()


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    docs = root / "docs"
    docs.mkdir()
    for name in ("indexes.md", "page.html", "notes.txt"):
        shutil.copy(DATA / name, docs / name)
    (docs / "broken.txt").write_bytes(b"\x00\x01binary")
    ckf = root / "kb.ckf"
    result = runner.invoke(app, ["ingest", str(docs), "--ckf", str(ckf), "--source-type",
                                 "official", "--exclude", "notes.txt"])
    return docs, ckf, result


def _json(result):
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_ingest_prints_summary_and_skipped_files(built):
    _, _, result = built
    assert result.exit_code == 3, result.output  # finished, some files skipped
    out = result.stdout
    assert "documents" in out and "2 (2 new, 0 changed, 0 unchanged)" in out
    assert "Skipped files" in out and "broken.txt" in out
    assert "binary file (contains NUL bytes)" in out


def test_reingest_json_report_shows_nothing_embedded(built):
    docs, ckf, _ = built
    rep = _json(runner.invoke(app, ["ingest", str(docs / "indexes.md"), str(docs / "page.html"),
                                    "--ckf", str(ckf), "--json"]))
    assert rep["embedded"] == 0 and rep["documents_unchanged"] == 2
    assert rep["facts_added"] == 0 and rep["skipped"] == []


def test_stats_and_docs(built):
    _, ckf, _ = built
    st = _json(runner.invoke(app, ["ckf", "stats", "--ckf", str(ckf), "--json"]))
    assert st["documents"] == 2
    assert st["model_id"] == "sentence-transformers/all-MiniLM-L6-v2#title-section-short"
    assert st["recipe"] == "title-section-short"
    assert st["active_facts"] == st["rows"] > 0
    assert st["documents_by_source_type"] == {"internal": 1, "official": 1}
    table = runner.invoke(app, ["ckf", "stats", "--ckf", str(ckf)])
    assert table.exit_code == 0 and "all-MiniLM-L6-v2" in table.stdout
    docs = _json(runner.invoke(app, ["ckf", "docs", "--ckf", str(ckf), "--json"]))
    assert sorted(Path(d["source"]).name for d in docs) == ["indexes.md", "page.html"]


def test_search_returns_ranked_facts_with_sections(built, monkeypatch):
    _, ckf, _ = built
    monkeypatch.setenv("CDR_CKF", str(ckf))  # --ckf from the environment
    hits = _json(runner.invoke(app, ["ckf", "search", "how big should the connection pool be",
                                     "-n", "3", "--json"]))
    assert len(hits) == 3
    rels = [h["relevance"] for h in hits]
    assert rels == sorted(rels, reverse=True)
    assert hits[0]["section"].startswith("Connection Pooling")
    table = runner.invoke(app, ["ckf", "search", "partial index predicate"])
    assert table.exit_code == 0 and "Partial Indexes" in table.stdout


def test_rm_then_errors(built, tmp_path):
    _, ckf, _ = built
    copy = tmp_path / "c.ckf"
    shutil.copytree(ckf, copy)
    docs = _json(runner.invoke(app, ["ckf", "docs", "--ckf", str(copy), "--json"]))
    page = next(d for d in docs if d["source"].endswith("page.html"))
    res = runner.invoke(app, ["ckf", "rm", page["doc_id"], "--ckf", str(copy)])
    assert res.exit_code == 0 and "facts no longer selectable" in res.stdout
    again = runner.invoke(app, ["ckf", "rm", page["doc_id"], "--ckf", str(copy)])
    assert again.exit_code == 1 and "no document" in again.stderr
    assert runner.invoke(app, ["ckf", "check", "--ckf", str(copy)]).stdout.strip() == "ok"
    res = runner.invoke(app, ["ckf", "compact", "--ckf", str(copy)])
    assert res.exit_code == 0 and "rows:" in res.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["ckf", "stats", "--ckf", "{tmp}/missing.ckf"], "no CKF at"),
        (["ingest", "{tmp}/nope.md", "--ckf", "{tmp}/new.ckf"], "no such file or directory"),
        (["ingest", str(DATA / "notes.txt"), "--ckf", "{tmp}/new.ckf", "-t", "blog"],
         "unknown source type 'blog'"),
        (["ingest", str(DATA / "notes.txt"), "--ckf", "{tmp}/new.ckf", "--embedder", "bogus"],
         "unknown embedder 'bogus'"),
    ],
)
def test_errors_are_one_line_and_exit_nonzero(tmp_path, args, message):
    res = runner.invoke(app, [a.replace("{tmp}", str(tmp_path)) for a in args])
    assert res.exit_code == 1
    assert res.stderr.startswith("error: ") and message in res.stderr
