"""Finding files (globs, hidden, types) and refusing bad bytes with a reason."""

from __future__ import annotations

from pathlib import Path

import pytest

from cdr.ckf.sources import (
    SkipDocument,
    decode,
    decode_text,
    discover,
    glob_match,
    parse_bytes,
)
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


@pytest.mark.parametrize(
    ("charset", "warning"),
    [
        ("undefined", "charset 'undefined' declared is not a text encoding; decoded as UTF-8"),
        ("no-such-charset", "unknown charset 'no-such-charset' declared; decoded as UTF-8"),
        ("punycode", "charset 'punycode' declared is not a text encoding; decoded as UTF-8"),
        ("idna", "charset 'idna' declared is not a text encoding; decoded as UTF-8"),
        ("utf-7", "charset 'utf-7' declared is not a text encoding; decoded as UTF-8"),
        ("rot13", "charset 'rot13' declared is not a text encoding; decoded as UTF-8"),
    ],
)
def test_bogus_html_charset_falls_back_to_utf8_with_a_warning(charset, warning):
    html = f'<meta charset="{charset}"><p>café au lait</p>'.encode()
    text, warnings = decode_text(html, "html")
    assert "café au lait" in text and warnings == [warning]
    doc = parse_bytes(html, "html")
    assert doc.warnings == [warning] and doc.blocks[0].text == "café au lait"


def test_html_charset_fallback_chain_declared_then_utf8_then_replacement():
    # Declared and right: no warning.
    assert decode_text('<meta charset="iso-8859-1"><p>caf\xe9</p>'.encode("latin-1"),
                       "html")[1] == []
    # Declared UTF-8 but the bytes are Latin-1: replaced, with the offset of the first bad byte.
    text, warnings = decode_text(b'<meta charset="utf-8"><p>caf\xe9 cr\xe8me</p>', "html")
    assert text == '<meta charset="utf-8"><p>caf\ufffd cr\ufffdme</p>'
    assert warnings == ["not valid UTF-8 (first bad byte at offset 28); bad bytes replaced "
                        "with U+FFFD"]
    # Declared ASCII, bytes are UTF-8: the declaration fails, the bytes sniff as UTF-8.
    text, warnings = decode_text('<meta charset="ascii"><p>café 日本</p>'.encode(), "html")
    assert "café 日本" in text
    assert warnings == ["bytes are not valid ascii as declared (UnicodeDecodeError); decoded "
                        "as UTF-8"]
    # Markdown and text have no charset declaration: not UTF-8 stays a skip with a reason.
    with pytest.raises(SkipDocument, match="not valid UTF-8"):
        decode_text("caf\xe9".encode("latin-1"), "md")


def test_a_parser_crash_on_one_file_is_a_skip_with_the_reason(monkeypatch):
    import cdr.ckf.sources as sources

    def boom(kind, text):
        raise IndexError("tuple index out of range")

    monkeypatch.setattr(sources, "parse", boom)
    with pytest.raises(SkipDocument, match=r"could not parse as md: IndexError: tuple index"):
        parse_bytes(b"# Fine\n\nText.\n", "md")
