"""Files that would hang, kill or leak an ingest, sent through the real `cdr ingest` in a child
process (a hang there is a timeout here, not a stuck suite): a named pipe, a link to
`/dev/zero`, a sparse file past the size limit and a link out of the folder are each skipped
and listed with why, the good file beside them is ingested, and what the knowledge base held
before is still there. Also: the size limit and the link rule in the library, a parser that
raises something unexpected, and a batch stopped half-way keeping every group it committed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import cdr
from cdr.ckf import CKF, DocumentInput, ingest, ingest_documents
from cdr.ckf.sources import DEFAULT_MAX_FILE_BYTES, SkipDocument, read_file
from cdr.errors import InvalidInputError

GOOD = "# Tides\n\nThe harbour drains twice a day and the boats rest on the mud flats.\n"
SECRET = "aws_secret_access_key = AKIA-not-a-real-key-but-a-secret-all-the-same\n"
EXIT_SOME_SKIPPED = 3


def _cdr(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(Path(cdr.__file__).parents[1]))
    return subprocess.run([sys.executable, "-m", "cdr", *args], capture_output=True,
                          text=True, timeout=timeout, env=env)


@pytest.fixture
def hostile(tmp_path: Path) -> Path:
    d = tmp_path / "docs"
    d.mkdir()
    (d / "good.md").write_text(GOOD, encoding="utf-8")
    os.mkfifo(d / "pipe.md")
    (d / "zero.md").symlink_to("/dev/zero")
    with open(d / "dump.txt", "wb") as f:  # sparse: 6 GB on paper, nothing on disk
        f.truncate(6 * 2**30)
    secrets = tmp_path / "home" / ".aws"
    secrets.mkdir(parents=True)
    (secrets / "credentials").write_text(SECRET, encoding="utf-8")
    (d / "notes.md").symlink_to(secrets / "credentials")
    (d / "inside.md").symlink_to(d / "good.md")  # a link within the folder is fine
    return d


def test_the_real_cli_skips_each_and_ingests_the_rest(hostile: Path, tmp_path: Path) -> None:
    kb = tmp_path / "kb.ckf"
    before = tmp_path / "before.md"
    before.write_text("# Mill\n\nThe water mill grinds wheat and barley for the valley.\n",
                      encoding="utf-8")
    first = _cdr("ingest", str(before), "--ckf", str(kb), "--json")
    assert first.returncode == 0, first.stderr
    r = _cdr("ingest", str(hostile), "--ckf", str(kb), "--json")
    assert r.returncode == EXIT_SOME_SKIPPED, r.stderr
    report = json.loads(r.stdout)
    why = {Path(s["path"]).name: s["reason"] for s in report["skipped"]}
    assert why["pipe.md"] == "not a regular file: a named pipe (FIFO)"
    assert why["zero.md"].startswith("a symbolic link to a file outside the folder")
    assert why["notes.md"].startswith("a symbolic link to a file outside the folder")
    assert "--follow-symlinks" in why["notes.md"]
    assert why["dump.txt"].startswith("larger than the 256.0 MiB limit (6,144.0 MiB)")
    assert set(why) == {"pipe.md", "zero.md", "notes.md", "dump.txt"}
    assert report["documents_new"] == 2  # good.md and the link to it inside the folder
    with CKF.open(kb) as ckf:
        sources = {Path(d["source"]).name for d in ckf.documents()}
        text = " ".join(f.content for f in ckf.facts(range(ckf.n_rows)))
    assert sources == {"before.md", "good.md", "inside.md"}  # the earlier document stays
    assert "aws_secret_access_key" not in text


def test_a_named_pipe_given_by_name_is_skipped_not_waited_on(hostile: Path,
                                                             tmp_path: Path) -> None:
    r = _cdr("ingest", str(hostile / "pipe.md"), str(hostile / "good.md"), "--ckf",
             str(tmp_path / "kb.ckf"), "--json")
    assert r.returncode == EXIT_SOME_SKIPPED, r.stderr
    report = json.loads(r.stdout)
    assert [Path(s["path"]).name for s in report["skipped"]] == ["pipe.md"]
    assert report["documents_new"] == 1


def test_follow_symlinks_and_the_size_flag(hostile: Path, tmp_path: Path) -> None:
    r = _cdr("ingest", str(hostile), "--ckf", str(tmp_path / "kb.ckf"), "--json",
             "--follow-symlinks", "--max-file-mb", "0.001")
    assert r.returncode == EXIT_SOME_SKIPPED, r.stderr
    why = {Path(s["path"]).name: s["reason"] for s in json.loads(r.stdout)["skipped"]}
    assert "notes.md" not in why  # followed on request
    assert why["zero.md"] == "not a regular file: a character device"  # followed, refused
    assert why["dump.txt"].startswith("larger than the 1,049 bytes limit")
    bad = _cdr("ingest", str(hostile), "--ckf", str(tmp_path / "kb2.ckf"), "--max-file-mb",
               "0")
    assert bad.returncode == 2 and "--max-file-mb" in bad.stderr
    assert not (tmp_path / "kb2.ckf").exists()


def test_read_file_bounds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    p = tmp_path / "a.txt"
    p.write_bytes(b"x" * 100)
    assert read_file(p, 100) == b"x" * 100
    with pytest.raises(SkipDocument, match="larger than the 99 bytes limit"):
        read_file(p, 99)
    with pytest.raises(SkipDocument, match="a directory"):
        read_file(tmp_path)
    monkeypatch.setenv("CDR_INGEST_MAX_BYTES", "50")
    with pytest.raises(SkipDocument, match="larger than the 50 bytes limit"):
        read_file(p)
    monkeypatch.setenv("CDR_INGEST_MAX_BYTES", "lots")
    with pytest.raises(InvalidInputError, match="CDR_INGEST_MAX_BYTES"):
        read_file(p)
    monkeypatch.delenv("CDR_INGEST_MAX_BYTES")
    assert DEFAULT_MAX_FILE_BYTES == 256 * 2**20
    with CKF.create(tmp_path / "kb.ckf") as ckf, pytest.raises(InvalidInputError,
                                                                match="max_file_bytes"):
        ingest(ckf, [str(p)], max_file_bytes=0)


def test_a_parser_that_raises_skips_its_file_only(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib

    ingest_mod = importlib.import_module("cdr.ckf.ingest")

    real = ingest_mod.parse_bytes

    def parse(data: bytes, kind: str) -> object:
        if b"poison" in data:
            raise RecursionError("maximum recursion depth exceeded")
        return real(data, kind)

    monkeypatch.setattr(ingest_mod, "parse_bytes", parse)
    with CKF.create(tmp_path / "kb.ckf") as ckf:
        rep = ingest_documents(ckf, [DocumentInput("bad.md", "# Bad\n\npoison " * 20),
                                     DocumentInput("good.md", GOOD)])
        assert rep.skipped == [("bad.md", "could not be read: RecursionError: maximum "
                                          "recursion depth exceeded")]
        assert [d["source"] for d in ckf.documents()] == ["good.md"]


def test_a_batch_stopped_half_way_keeps_what_it_committed(tmp_path: Path) -> None:
    """Documents are committed a group at a time as they are read: when the source of
    documents fails after the fifth (a kill, a vanished disk), the groups before it are in the
    store, and a re-run embeds only the rest."""
    docs = [DocumentInput(f"d{i}.md", f"# Topic {i}\n\nParagraph {i} about subject "
                          f"number {i}, with words enough to be a fact of its own.\n")
            for i in range(8)]

    def failing() -> object:
        yield from docs[:5]
        raise OSError("the disk went away")

    with CKF.create(tmp_path / "kb.ckf") as ckf:
        with pytest.raises(OSError, match="disk went away"):
            ingest_documents(ckf, failing(), commit_every=2)  # type: ignore[arg-type]
        kept = {d["source"] for d in ckf.documents()}
        assert {"d0.md", "d1.md", "d2.md", "d3.md"} <= kept <= {f"d{i}.md" for i in range(5)}
        rep = ingest_documents(ckf, docs, commit_every=2)
        assert rep.documents_unchanged == len(kept)
        assert rep.embedded == 8 - len(kept)
        assert len(ckf.documents()) == 8 and ckf.check() == []
