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


def test_html_article_header_keeps_its_title_page_header_is_dropped():
    doc = parse_html("<body><header><h1>Site name</h1><p>Site tagline</p></header>"
                     "<article><header><h1>Vacuum</h1></header><p>Vacuum reclaims space."
                     "</p><footer><p>Posted in maintenance</p></footer></article>"
                     "<footer><p>Copyright</p></footer></body>")
    assert [(b.section, b.text) for b in doc.blocks] == [
        (("Vacuum",), "Vacuum reclaims space."), (("Vacuum",), "Posted in maintenance")]
