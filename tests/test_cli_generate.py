"""`cdr generate` from the command line: the document, the trace, the table, the errors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import jsonschema
from typer.testing import CliRunner

from cdr.cli import app
from cdr.trace import TRACE_SCHEMA
from tests.conftest import BUILTIN_TYPES_OUTLINE, BUILTIN_TYPES_TASK

runner = CliRunner()


def test_generate_writes_document_and_trace(types_ckf_path: Path, tmp_path: Path):
    outline = tmp_path / "outline.md"
    outline.write_text("# " + BUILTIN_TYPES_OUTLINE.replace("\n", "\n- "), encoding="utf-8")
    out, trace = tmp_path / "guide.md", tmp_path / "trace.json"
    res = runner.invoke(app, ["generate", BUILTIN_TYPES_TASK, "--ckf", str(types_ckf_path),
                              "--outline", str(outline), "--windows", "3", "--words", "3000",
                              "--trace", str(trace), "--out", str(out)])
    assert res.exit_code == 0, res.output
    doc = out.read_text(encoding="utf-8")
    assert doc.startswith(f"# {BUILTIN_TYPES_TASK}\n") and "## " in doc
    data = json.loads(trace.read_text(encoding="utf-8"))
    jsonschema.validate(data, TRACE_SCHEMA)
    assert [w["number"] for w in data["windows"]] == [1, 2, 3]
    assert [s["text"] for s in data["sub_queries"]][:2] == ["Truth value testing",
                                                            "Numeric types"]
    assert data["ranking"] == "cdr" and data["status"] == "limit-reached"
    assert "status: limit-reached" in res.output
    assert "CWR6" in res.output
    # the table says how each window's writer ended (a loop stopped, a token-limit cut)
    assert "repetition: stopped where the model began" in " ".join(res.output.split())


def test_generate_to_stdout_with_relevance(types_ckf_path: Path, tmp_path: Path):
    outline = tmp_path / "o.txt"
    outline.write_text("Numeric types\nSequence types\n", encoding="utf-8")
    res = runner.invoke(app, ["generate", BUILTIN_TYPES_TASK, "--ckf", str(types_ckf_path),
                              "--outline", str(outline), "--windows", "1",
                              "--ranking", "relevance"])
    assert res.exit_code == 0, res.output
    assert f"# {BUILTIN_TYPES_TASK}" in res.stdout


def test_generate_errors(types_ckf_path: Path, tmp_path: Path):
    def run(*args: str):
        return runner.invoke(app, ["generate", *args])

    r = run("task", "--ckf", str(tmp_path / "missing"))
    assert r.exit_code == 1 and "missing" in r.output
    r = run("  ", "--ckf", str(types_ckf_path))
    assert r.exit_code == 2 and "task is empty" in r.output
    r = run("task", "--ckf", str(types_ckf_path), "--windows", "0")
    assert r.exit_code == 2 and "--windows" in r.output
    r = run("task", "--ckf", str(types_ckf_path), "--ranking", "bm25")
    assert r.exit_code == 2 and "--ranking" in r.output
    # A copy of its own: the run's shared CKF may be open in another test's object, whose
    # WAL files would come and go with that object's garbage collection.
    own = tmp_path / "own-ckf"
    shutil.copytree(types_ckf_path, own)
    stored = {p: p.read_bytes() for p in own.rglob("*") if p.is_file()}
    assert stored  # the CKF's files, compared after the refusal
    r = run("task", "--ckf", str(own), "--resume", "always")
    assert r.exit_code == 2 and "unknown resume option 'always'" in r.output
    assert "--resume" in r.output
    assert {p: p.read_bytes() for p in own.rglob("*") if p.is_file()} == stored
    empty = tmp_path / "empty.txt"
    empty.write_text("\n- \n", encoding="utf-8")
    r = run("task", "--ckf", str(types_ckf_path), "--outline", str(empty))
    assert r.exit_code == 1 and "no lines" in r.output
    r = run("task", "--ckf", str(types_ckf_path), "--outline", str(tmp_path / "nope.txt"))
    assert r.exit_code == 2 and "cannot read outline" in r.output
    r = run("task", "--ckf", str(types_ckf_path), "--writer", "openai")
    assert r.exit_code == 1 and "needs a model" in r.output


def test_generate_on_empty_ckf_says_safety_only(tmp_path: Path):
    from cdr.ckf import CKF

    CKF.create(tmp_path / "empty").close()
    r = runner.invoke(app, ["generate", "Write about anything", "--ckf",
                            str(tmp_path / "empty")])
    assert r.exit_code == 1
    assert "CRP-Context-Mode: safety-only" in r.output
    assert "ingest" in r.output


def test_generate_closes_the_knowledge_base_however_it_ends(types_ckf_path: Path,
                                                             tmp_path: Path):
    """An in-process caller (a notebook, a test, an embedding application) gets the CKF back
    closed: SQLite's WAL files gone, nothing left for a garbage collection to close at some
    later moment, after a finished run and after a refused one alike."""
    ckf = tmp_path / "ckf"  # without the WAL files of another test's open handle on it
    shutil.copytree(types_ckf_path, ckf, ignore=shutil.ignore_patterns("*-wal", "*-shm"))
    files = sorted(p.name for p in ckf.iterdir())
    assert not [f for f in files if f.endswith(("-wal", "-shm"))]
    finished = runner.invoke(app, ["generate", BUILTIN_TYPES_TASK, "--ckf", str(ckf),
                                   "--windows", "1", "--out", str(tmp_path / "o.md")])
    assert finished.exit_code == 0, finished.output
    assert sorted(p.name for p in ckf.iterdir()) == files
    refused = runner.invoke(app, ["generate", "task", "--ckf", str(ckf), "--writer", "openai"])
    assert refused.exit_code == 1 and "needs a model" in refused.output
    assert sorted(p.name for p in ckf.iterdir()) == files
