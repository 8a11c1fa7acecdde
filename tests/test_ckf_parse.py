"""Parsing documents into blocks: headings → section paths, code kept whole, chrome dropped."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from cdr.ckf import parse_html, parse_markdown, parse_text
from cdr.ckf.sources import SkipDocument, parse_bytes

DATA = Path(__file__).parent / "data" / "ckf"


def _sections(doc):
    return [" > ".join(b.section) for b in doc.blocks]


def test_markdown_fixture_sections_code_and_front_matter():
    doc = parse_markdown((DATA / "indexes.md").read_text())
    assert doc.title == "Indexes"
    assert doc.meta == {"title": "Indexes", "source_type": "official"}
    assert _sections(doc) == [
        "Indexes",
        "Indexes > Introduction",
        "Indexes > Introduction",
        "Indexes > Introduction",
        "Indexes > Partial Indexes",
        "Indexes > Partial Indexes",
        "Indexes > Partial Indexes",
        "Indexes > Partial Indexes > Example",
        "Indexes > Setext Heading For Unique Indexes",
    ]
    code = [b for b in doc.blocks if b.is_code]
    assert [c.text.splitlines()[0] for c in code] == [
        "CREATE TABLE test1 (",
        "CREATE INDEX access_log_client_ip_ix ON access_log (client_ip)",
    ]
    # fenced code is kept verbatim, indentation and all
    assert "    id integer,\n    content varchar\n);" in code[0].text
    assert code[0].location == "line 18"
    # soft-wrapped prose becomes one line; list items keep their lines
    assert doc.blocks[0].text.startswith("Indexes are a common way to enhance database "
                                         "performance. An index allows the database server")
    assert doc.blocks[6].text.splitlines() == [
        "- It reduces the size of the index.",
        "- It speeds up queries that do use the index.",
        "- It speeds up many table update operations.",
    ]


def test_markdown_heading_levels_replace_deeper_ones():
    doc = parse_markdown("# A\n\npara a\n\n## B\n\npara b\n\n### C\n\npara c\n\n## D\n\npara d\n"
                         "\n# E\n\npara e\n")
    assert _sections(doc) == ["A", "A > B", "A > B > C", "A > D", "E"]


def test_markdown_unterminated_fence_runs_to_end_and_hr_is_not_front_matter():
    doc = parse_markdown("---\n\nIntro text here.\n\n```python\nx = 1\n\ny = 2\n")
    assert doc.meta == {}
    assert [(b.text, b.is_code) for b in doc.blocks] == [
        ("Intro text here.", False), ("x = 1\n\ny = 2", True)]


def test_html_drops_navigation_scripts_and_keeps_structure():
    doc = parse_html((DATA / "page.html").read_text())
    text = "\n".join(b.text for b in doc.blocks)
    for marker in ("SCRIPT", "NAV_", "HEADER_", "FOOTER_", "SIDEBAR_", "COMMENT_",
                   "secret-style-rule", "¶"):
        assert marker not in text
    assert doc.title == "Connection Pooling — Ops Handbook"
    assert doc.meta == {"source_type": "internal"}
    assert _sections(doc) == [
        "Connection Pooling",
        "Connection Pooling > Sizing the pool",
        "Connection Pooling > Sizing the pool",
        "Connection Pooling > Sizing the pool > Example configuration",
        "Connection Pooling > Sizing the pool > Example configuration",
        "Connection Pooling > Failure handling",
        "Connection Pooling > Failure handling",
    ]
    code = [b for b in doc.blocks if b.is_code]
    assert len(code) == 1
    assert code[0].text == ("[pool]\npool_size = 16\nmax_overflow = 4\ntimeout_seconds = 30\n"
                            "recycle_seconds = 1800")
    # inline markup is flattened into the paragraph, whitespace collapsed
    assert doc.blocks[2].text == ("Start with pool_size = 2 * cores and measure the latency "
                                  "percentiles under realistic load before changing it.")
    assert doc.blocks[4].text.splitlines()[1] == (
        "pool_size | connections kept open permanently by the pool")
    assert all(b.location.startswith("line ") for b in doc.blocks)


def test_html_inline_text_around_nested_blocks_is_kept_in_order():
    doc = parse_html("<div>lead text <b>bold</b><p>inner para</p>tail text</div>")
    assert [b.text for b in doc.blocks] == ["lead text bold", "inner para", "tail text"]


def test_text_rst_headings_and_indented_code():
    doc = parse_text((DATA / "notes.txt").read_text())
    assert doc.title == "Release Process"
    assert _sections(doc) == [
        "Release Process",
        "Release Process > Versioning",
        "Release Process > Versioning",
        "Release Process > Versioning",
        "Release Process > Hotfixes",
    ]
    code = [b for b in doc.blocks if b.is_code]
    assert [c.text for c in code] == [
        'git tag -s v2.4.0 -m "Release 2.4.0"\ngit push origin v2.4.0']


def test_text_indented_prose_is_not_code():
    doc = parse_text("object.__lt__(self, other)\n\n   These are the so-called rich comparison "
                     "methods, and they are called for comparison operators.\n")
    assert [b.is_code for b in doc.blocks] == [False, False]


def test_pydoc_topic_round_trip_keeps_every_word():
    from pydoc_data.topics import topics

    raw = topics["assert"]
    doc = parse_text(raw)
    words = [w for b in doc.blocks for w in b.text.split()]
    title_words = doc.title.split() if doc.title else []
    expected = [w for w in raw.split() if set(w) != {"*"}]
    assert title_words + words == expected


def _pdf(pages: list[list[str]], outline: list[tuple[str, int]]) -> bytes:
    """A real PDF: one Helvetica text stream per page, plus bookmarks via pypdf."""
    pypdf = pytest.importorskip("pypdf")
    objs: list[bytes] = []
    n_pages = len(pages)
    kids = " ".join(f"{4 + 2 * i} 0 R" for i in range(n_pages))
    objs.append(b"<< /Type /Catalog /Pages 2 0 R >>")
    objs.append(f"<< /Type /Pages /Kids [{kids}] /Count {n_pages} >>".encode())
    objs.append(b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>")
    for i, lines in enumerate(pages):
        ops = ["BT /F1 11 Tf 72 720 Td 14 TL"]
        ops += [f"({ln}) Tj T*" for ln in lines]
        ops.append("ET")
        stream = "\n".join(ops).encode()
        objs.append(f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources "
                    f"<< /Font << /F1 3 0 R >> >> /Contents {5 + 2 * i} 0 R >>".encode())
        objs.append(b"<< /Length %d >>\nstream\n" % len(stream) + stream + b"\nendstream")
    body = io.BytesIO()
    body.write(b"%PDF-1.4\n")
    offsets = []
    for k, o in enumerate(objs, start=1):
        offsets.append(body.tell())
        body.write(b"%d 0 obj\n" % k + o + b"\nendobj\n")
    xref = body.tell()
    body.write(b"xref\n0 %d\n0000000000 65535 f \n" % (len(objs) + 1))
    for off in offsets:
        body.write(b"%010d 00000 n \n" % off)
    body.write(b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n"
               % (len(objs) + 1, xref))
    writer = pypdf.PdfWriter(clone_from=pypdf.PdfReader(io.BytesIO(body.getvalue())))
    for title, page in outline:
        writer.add_outline_item(title=title, page_number=page)
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


def test_pdf_pages_and_outline_sections():
    data = _pdf(
        [["Vacuum reclaims storage occupied by dead tuples in a table.",
          "It should be run regularly on busy tables."],
         ["Autovacuum automates the execution of vacuum and analyze commands."]],
        [("Routine Vacuuming", 0), ("The Autovacuum Daemon", 1)],
    )
    doc = parse_bytes(data, "pdf")
    assert [b.location for b in doc.blocks] == ["page 1", "page 2"]
    assert [b.section for b in doc.blocks] == [("Routine Vacuuming",), ("The Autovacuum Daemon",)]
    assert doc.blocks[0].text == ("Vacuum reclaims storage occupied by dead tuples in a table. "
                                  "It should be run regularly on busy tables.")


def test_pdf_that_is_not_a_pdf_is_skipped_with_reason():
    with pytest.raises(SkipDocument, match="not a PDF"):
        parse_bytes(b"hello, I am text", "pdf")
    pytest.importorskip("pypdf")
    with pytest.raises(SkipDocument, match="unreadable PDF"):
        parse_bytes(b"%PDF-1.4\n garbage that is not a pdf body", "pdf")


def test_html_article_header_keeps_its_title_page_header_is_dropped(monkeypatch):
    monkeypatch.setenv("CDR_HTML_EXTRACTOR", "off")  # the streaming parser's own rules
    doc = parse_html("<body><header><h1>Site name</h1><p>Site tagline</p></header>"
                     "<article><header><h1>Vacuum</h1></header><p>Vacuum reclaims space."
                     "</p><footer><p>Posted in maintenance</p></footer></article>"
                     "<footer><p>Copyright</p></footer></body>")
    assert [(b.section, b.text) for b in doc.blocks] == [
        (("Vacuum",), "Vacuum reclaims space."), (("Vacuum",), "Posted in maintenance")]


# ----------------------------------------------------------------------------- CommonMark

COMMONMARK = """Title
=====

Intro paragraph with a [link][ref] and an ![diagram](x.png "t") image.

[ref]: https://example.com/secret-url "Ref Title"

Sub part
--------

- level one item
  - level two item
    1. ordered three
    2. ordered four
- back to one

  second paragraph of item

| Setting | Meaning |
| ------- | ------- |
| `pool_size` | connections kept **open** |
| timeout | seconds |

<div class="note">
<p>HTML block text &amp; more</p>
</div>

<!-- a comment -->

1. Install it:

   ```bash
   pip install cdr
   ```

2. Run it.

> quoted text
> continues here
"""


def test_commonmark_blocks_sections_and_locations():
    doc = parse_markdown(COMMONMARK)
    assert doc.title == "Title" and doc.warnings == []
    assert [(b.section, b.location, b.is_code, b.text) for b in doc.blocks] == [
        (("Title",), "line 4", False, "Intro paragraph with a link and an diagram image."),
        (("Title", "Sub part"), "line 11", False,
         "- level one item\n  - level two item\n    1. ordered three\n    2. ordered four\n"
         "- back to one\n  second paragraph of item"),
        (("Title", "Sub part"), "line 19", False,
         "Setting | Meaning\npool_size | connections kept open\ntimeout | seconds"),
        (("Title", "Sub part"), "line 24", False, "HTML block text & more"),
        (("Title", "Sub part"), "line 30", False, "1. Install it:"),
        (("Title", "Sub part"), "line 32", True, "pip install cdr"),
        (("Title", "Sub part"), "line 36", False, "2. Run it."),
        (("Title", "Sub part"), "line 38", False, "quoted text continues here"),
    ]


def test_link_reference_definitions_do_not_leak_into_facts():
    doc = parse_markdown("# Links\n\nSee [the docs][d] and [x].\n\n[d]: https://secret.example/a\n"
                         "[x]: <https://secret.example/b> 'Title text'\n")
    text = "\n".join(b.text for b in doc.blocks)
    assert text == "See the docs and x."
    assert "secret" not in text and "Title text" not in text


def test_setext_heading_levels_and_a_dash_line_under_a_list_is_not_a_heading():
    doc = parse_markdown("Top\n===\n\nbody one\n\nSecond\n------\n\nbody two\n\n- item\n---\n\n"
                         "after rule\n")
    assert [(b.section, b.text) for b in doc.blocks] == [
        (("Top",), "body one"), (("Top", "Second"), "body two"),
        (("Top", "Second"), "- item"), (("Top", "Second"), "after rule")]


def test_front_matter_line_numbers_count_from_the_file_top():
    doc = parse_markdown("---\ntitle: T\n---\n\n# H\n\nfirst para\n")
    assert doc.meta == {"title": "T"} and doc.title == "T"
    assert [b.location for b in doc.blocks] == ["line 7"]


def test_markdown_nested_2000_deep_is_flattened_with_a_warning_and_nothing_after_is_lost():
    deep = "\n".join("  " * i + f"- item {i} word" for i in range(2000))
    doc = parse_markdown(f"# Deep\n\n{deep}\n\n## After\n\nAfter the list paragraph.\n")
    assert len(doc.warnings) == 1 and "plain text" in doc.warnings[0]
    words = " ".join(b.text for b in doc.blocks).split()
    assert [w for w in words if w.isdigit()] == [str(i) for i in range(2000)]
    assert doc.blocks[-1].section == ("Deep", "After")
    assert doc.blocks[-1].text == "After the list paragraph."
    # No line of the rendering carries the full O(depth) indentation.
    assert max(len(ln) for b in doc.blocks for ln in b.text.splitlines()) < 100


@pytest.mark.parametrize("deep", ["> " * 2000 + "quoted\n", "- " * 2000 + "listed\n",
                                  "1. " * 2000 + "numbered\n"])
def test_markdown_deep_quotes_and_one_line_lists_keep_their_text(deep):
    doc = parse_markdown(deep + "\nafter\n")
    assert doc.warnings and doc.blocks[-1].text == "after"
    assert deep.split()[-1] in doc.blocks[-2].text


def test_html_nested_100k_deep_parses_without_recursion():
    doc = parse_html("<div>" * 100_000 + "<h2>Deep</h2><p>inner text</p>" + "</div>" * 100_000
                     + "<p>outer text</p>")
    assert [(b.section, b.text) for b in doc.blocks] == [
        (("Deep",), "inner text"), (("Deep",), "outer text")]


def test_html_unclosed_and_stray_tags_close_like_a_browser(monkeypatch):
    monkeypatch.setenv("CDR_HTML_EXTRACTOR", "off")  # the streaming parser's own rules
    doc = parse_html("<ul><li>one<li>two</ul></span><p>para one<p>para two<table><tr><td>a"
                     "<td>b<tr><td>c</table><h3>H</h3>tail")
    assert [(b.section, b.text) for b in doc.blocks] == [
        ((), "one"), ((), "two"), ((), "para one"), ((), "para two"), ((), "a | b\nc"),
        (("H",), "tail")]


def test_html_main_is_the_only_content_when_present():
    doc = parse_html("<p>outside main</p><div role='main'><p>inside</p></div><p>after</p>")
    assert [b.text for b in doc.blocks] == ["inside"]
