"""Ingest over a folder of hostile files: the good ones are ingested, the bad ones skipped
with their reasons, the odd-but-readable ones ingested with warnings, and `cdr ingest` says
"some skipped" with exit status 3. No timing asserts: each case must finish and produce facts
within the token bounds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cdr.ckf import CKF, chunk_blocks, ingest
from cdr.ckf.records import MAX_FACT_TOKENS
from cdr.ckf.sources import kind_of, parse_bytes
from cdr.cli.ckf import EXIT_SOME_SKIPPED, app
from cdr.text.tokens import count_tokens

DATA = Path(__file__).parent / "data" / "ckf"
SENTENCE = "Vacuum reclaims the storage that dead tuples occupy in a busy table"


def _hostile_folder(root: Path) -> Path:
    docs = root / "docs"
    docs.mkdir()
    files: dict[str, bytes] = {
        # good
        "good.md": (DATA / "indexes.md").read_bytes(),
        "good.html": (DATA / "page.html").read_bytes(),
        # readable with a warning
        "charset-undefined.html": (f'<meta charset="undefined"><h1>Undefined</h1>'
                                   f"<p>{SENTENCE} — café.</p>").encode(),
        "charset-punycode.html": (f'<html><head><meta charset="punycode"></head><body>'
                                  f"<p>{SENTENCE} — crème.</p></body></html>").encode(),
        "latin1-declared-utf8.html": (f'<meta charset="utf-8"><p>{SENTENCE} caf\xe9.</p>'
                                      .encode("latin-1")),
        "deep-list.md": ("# Deep\n\n" + "\n".join(
            "  " * i + f"- {SENTENCE} item {i % 3}" for i in range(2000)) + "\n").encode(),
        # big but fine: cut into facts within bounds
        "huge-paragraph.md": ((SENTENCE + " and ") * 15_000 + "done.\n").encode(),
        "huge-table.html": ("<table>" + "<tr><td>setting</td><td>pool_size</td><td>16</td></tr>"
                            * 20_000 + "</table>").encode(),
        "nested.html": ("<div>" * 50_000 + f"<p>{SENTENCE} deep inside.</p>"
                        + "</div>" * 50_000).encode(),
        # bad: skipped with a reason
        "binary.txt": b"\x00\x01\x02 not text \x00",
        "empty.md": b"",
        "latin1.md": "# Caf\xe9\n\nCr\xe8me br\xfbl\xe9e".encode("latin-1"),
        "three-words.md": b"Just three words",
        "only-script.html": b"<html><script>var x = 1;</script><nav>menu</nav></html>",
    }
    for name, data in files.items():
        (docs / name).write_bytes(data)
    return docs


SKIPPED = {
    "binary.txt": "binary file (contains NUL bytes)",
    "latin1.md": "not valid UTF-8 text (byte 0xe9 at offset 5); convert it to UTF-8",
}
# Files that hold no fact: listed apart, not an error (`cdr ingest` exits 0 for them).
EMPTY = {
    "empty.md": "empty file",
    "three-words.md": "no facts: its text is under 10 tokens",
    "only-script.html": "no text content",
}
INGESTED = {"good.md", "good.html", "charset-undefined.html", "charset-punycode.html",
            "latin1-declared-utf8.html", "deep-list.md", "huge-paragraph.md", "huge-table.html",
            "nested.html"}


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile")
    docs = _hostile_folder(root)
    with CKF.create(root / "kb.ckf") as ckf:
        report = ingest(ckf, [docs])
        documents = {Path(d["source"]).name: d for d in ckf.documents()}
        assert ckf.check() == []
    return docs, root, report, documents


def test_good_files_are_ingested_and_bad_ones_skipped_with_reasons(hostile):
    _, _, report, documents = hostile
    assert {Path(p).name: r for p, r in report.skipped} == SKIPPED
    assert {Path(p).name: r for p, r in report.empty} == EMPTY
    assert set(documents) == INGESTED
    assert report.documents_new == len(INGESTED)
    assert all(d["n_facts"] > 0 for d in documents.values())


def test_odd_but_readable_files_carry_warnings(hostile):
    _, _, report, _ = hostile
    warned = {Path(p).name: w for p, w in report.warnings}
    assert warned == {
        "charset-undefined.html":
            "charset 'undefined' declared is not a text encoding; decoded as UTF-8",
        "charset-punycode.html":
            "charset 'punycode' declared is not a text encoding; decoded as UTF-8",
        "latin1-declared-utf8.html":
            "not valid UTF-8 (first bad byte at offset 96); bad bytes replaced with U+FFFD",
        "deep-list.md": "Markdown nested deeper than 18 levels at line 20: the deeper part is "
                        "read as plain text",
    }


@pytest.mark.parametrize("name", sorted(INGESTED))
def test_every_fact_of_a_hostile_file_is_within_the_token_bounds(hostile, name):
    docs, _, _, documents = hostile
    drafts = chunk_blocks(parse_bytes((docs / name).read_bytes(), kind_of(name)).blocks)
    assert drafts and len(drafts) == documents[name]["n_facts"]
    assert all(10 <= d.tokens <= MAX_FACT_TOKENS for d in drafts)
    assert all(count_tokens(d.content) == d.tokens for d in drafts)


def test_cdr_ingest_exits_3_when_some_files_were_skipped(tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "good.md").write_bytes((DATA / "indexes.md").read_bytes())
    (docs / "puny.html").write_bytes(f'<meta charset="punycode"><p>{SENTENCE}.</p>'.encode())
    (docs / "three-words.md").write_bytes(b"Just three words")
    (docs / "latin1.md").write_bytes("caf\u00e9 au lait".encode("latin-1"))
    result = CliRunner().invoke(app, ["ingest", str(docs), "--ckf", str(tmp_path / "kb.ckf"),
                                      "--json"])
    assert result.exit_code == EXIT_SOME_SKIPPED == 3, result.output
    rep = json.loads(result.stdout)
    assert rep["documents_new"] == 2
    assert [Path(s["path"]).name for s in rep["skipped"]] == ["latin1.md"]
    assert [(Path(s["path"]).name, s["reason"]) for s in rep["empty"]] == [
        ("three-words.md", "no facts: its text is under 10 tokens")]
    assert [Path(w["path"]).name for w in rep["warnings"]] == ["puny.html"]
    # Nothing that could not be read: exit 0, a file without a fact listed (not an error);
    # the table names the warning (a fresh CKF: an unchanged document is not parsed again).
    (docs / "latin1.md").unlink()
    again = CliRunner().invoke(app, ["ingest", str(docs), "--ckf", str(tmp_path / "kb2.ckf")])
    assert again.exit_code == 0, again.output
    assert "Warnings" in again.stdout and "punycode" in again.stdout
    assert "Files without a fact" in again.stdout and "three-words.md" in again.stdout
