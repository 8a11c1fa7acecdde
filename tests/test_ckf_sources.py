"""Finding files (globs, hidden, types) and refusing bad bytes with a reason."""

from __future__ import annotations

from pathlib import Path

import pytest

from cdr.ckf.sources import SkipDocument, decode, discover, glob_match, parse_bytes
from cdr.errors import NotFoundError


@pytest.mark.parametrize(
    ("path", "patterns", "expected"),
    [
        ("a/b/page.html", ["*.html"], True),  # no slash: matches the name at any depth
        ("a/b/page.html", ["*.md"], False),
        ("library/os.html", ["library/*.html"], True),  # slash: anchored to the root
        ("x/library/os.html", ["library/*.html"], False),
        ("library/sub/os.html", ["library/*.html"], False),  # * stays within a segment
        ("library/sub/os.html", ["library/**"], True),
        ("library/sub/os.html", ["**/os.html"], True),
        ("os.html", ["**/os.html"], True),
        ("_static/x.js", ["_static"], True),
        ("notes/v1.txt", ["notes/v[0-9].txt"], True),
        ("notes/va.txt", ["notes/v[!a].txt"], False),
        ("a.md", ["*.html", "*.md"], True),
    ],
)
def test_glob_match(path, patterns, expected):
    assert glob_match(path, patterns) is expected


def _tree(root: Path) -> None:
    for rel, text in {
        "guide.md": "# Guide\n\nSome words here for a fact of reasonable size.\n",
        "library/os.html": "<p>os module</p>",
        "library/sys.html": "<p>sys module</p>",
        "library/sub/deep.txt": "deep text",
        "_static/style.css": "body {}",
        "_static/logo.png": "PNG",
        ".git/config.md": "# hidden",
        ".hidden.md": "# hidden",
        "README": "no extension",
    }.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)


def _rel(cands, root):
    return sorted(c.path.relative_to(root).as_posix() for c in cands)


def test_discover_types_hidden_and_globs(tmp_path):
    _tree(tmp_path)
    files, roots = discover([tmp_path])
    assert roots == [tmp_path.resolve()]
    assert _rel(files, tmp_path.resolve()) == [
        "guide.md", "library/os.html", "library/sub/deep.txt", "library/sys.html"]
    files, _ = discover([tmp_path], include=["*.html"])
    assert _rel(files, tmp_path.resolve()) == ["library/os.html", "library/sys.html"]
    files, _ = discover([tmp_path], exclude=["library/sub", "sys.html"])
    assert _rel(files, tmp_path.resolve()) == ["guide.md", "library/os.html"]
    files, _ = discover([tmp_path], include="library/**", exclude="*.txt")
    assert _rel(files, tmp_path.resolve()) == ["library/os.html", "library/sys.html"]


def test_discover_explicit_file_is_always_tried_and_missing_path_is_an_error(tmp_path):
    _tree(tmp_path)
    files, roots = discover([tmp_path / "README", tmp_path / "guide.md", tmp_path / "guide.md"])
    assert [c.path.name for c in files] == ["README", "guide.md"]
    assert roots == []
    with pytest.raises(NotFoundError, match=r"no such file or directory: .*nope"):
        discover([tmp_path / "nope"])


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"", "empty file"),
        (b"  \n\t\n", r"empty file \(whitespace only\)"),
        (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", r"binary file \(contains NUL bytes\)"),
        (b"caf\xe9 au lait", r"not valid UTF-8 text \(byte 0xe9 at offset 3\)"),
        (b"\x01\x02\x03\x04\x05\x06 abc \x07\x08", "binary file"),
    ],
)
def test_decode_refuses_with_reason(data, reason):
    with pytest.raises(SkipDocument, match=reason):
        decode(data, "txt")


def test_decode_boms_and_declared_html_charset():
    assert decode("\ufeffhello".encode(), "txt") == "hello"
    assert decode("hello wörld".encode("utf-16"), "txt") == "hello wörld"
    html = '<meta charset="iso-8859-1"><p>caf\xe9</p>'.encode("latin-1")
    assert "café" in decode(html, "html")


def test_parse_bytes_no_text_content():
    with pytest.raises(SkipDocument, match="no text content"):
        parse_bytes(b"<html><script>var x = 1;</script><nav>menu</nav></html>", "html")
