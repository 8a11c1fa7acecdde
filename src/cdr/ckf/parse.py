"""Documents → paragraph-level blocks, each with its heading path and location.

One parser per format, all producing the same `ParsedDocument`; which parser reads which
file is the registry's business (`cdr.ckf.kinds`). The parsers keep structure
(headings, code, lists) and drop chrome (HTML navigation, scripts); sizing facts is the
chunker's job, not theirs.
"""

from __future__ import annotations

import io
import re
import textwrap
from typing import Any

from cdr.ckf.html_blocks import parse_html
from cdr.ckf.markdown_blocks import front_matter, parse_markdown
from cdr.ckf.records import ParsedDocument
from cdr.ckf.sections import Sections
from cdr.errors import InvalidInputError
from cdr.text.blocks import Block
from cdr.text.sentences import ends_sentence

__all__ = [
    "PARSER_VERSION",
    "front_matter",
    "parse_html",
    "parse_markdown",
    "parse_pdf",
    "parse_text",
]

# Bumped when parsing or chunking changes what facts a document yields, so that re-ingesting
# an unchanged file re-chunks it (and embeds only texts that are actually new).
PARSER_VERSION = 2  # 2: Markdown by markdown-it-py (CommonMark)


# ----------------------------------------------------------------------------- plain text

_UNDERLINE = re.compile(r"^([=\-~*^#+\"'`:.])\1{2,}\s*$")


def _looks_like_prose(lines: list[str]) -> bool:
    """Indented text blocks are code unless they read as sentences (RST-style indented prose
    such as definition bodies ends in punctuation and has enough words)."""
    first = lines[0].lstrip()
    if first.startswith((">>>", "$ ", "% ", "#!")):
        return False
    joined = " ".join(ln.strip() for ln in lines)
    return ends_sentence(joined) and len(joined.split()) >= 8


def parse_text(text: str) -> ParsedDocument:
    """Plain text and reStructuredText-like files: blank lines separate paragraphs; a line
    underlined (and optionally overlined) with punctuation is a heading, its level set by the
    order in which underline styles first appear (the RST rule)."""
    lines = text.splitlines()
    sections = Sections()
    styles: list[str] = []
    blocks: list[Block] = []
    title: str | None = None
    para: list[str] = []
    para_line = 0

    def flush() -> None:
        nonlocal para
        if para:
            indented = all(ln.startswith((" ", "\t")) for ln in para if ln.strip())
            if indented and not _looks_like_prose(para):
                code = textwrap.dedent("\n".join(para)).strip("\n")
                blocks.append(Block(code, sections.path, f"line {para_line}", is_code=True))
            else:
                body = " ".join(ln.strip() for ln in para).strip()
                if body:
                    blocks.append(Block(body, sections.path, f"line {para_line}"))
        para = []

    i, n = 0, len(lines)
    while i < n:
        line = lines[i]
        nxt = lines[i + 1] if i + 1 < n else ""
        stripped = line.strip()
        over = _UNDERLINE.match(stripped) if stripped else None
        if over and i + 2 < n and lines[i + 1].strip() and lines[i + 2].strip() == stripped:
            # overline / title / underline
            flush()
            style = "over" + stripped[0]
            if style not in styles:
                styles.append(style)
            heading = lines[i + 1].strip()
            sections.enter(styles.index(style) + 1, heading)
            title = title or heading
            i += 3
            continue
        under = _UNDERLINE.match(nxt.strip()) if nxt.strip() else None
        if (stripped and under and not line.startswith((" ", "\t"))
                and len(nxt.strip()) >= max(3, int(len(stripped) * 0.6))):
            flush()
            style = nxt.strip()[0]
            if style not in styles:
                styles.append(style)
            sections.enter(styles.index(style) + 1, stripped)
            title = title or stripped
            i += 2
            continue
        if not stripped:
            flush()
            i += 1
            continue
        if para:
            was_indented = para[0].startswith((" ", "\t"))
            if was_indented != line.startswith((" ", "\t")):
                flush()  # a change of indentation starts a new block (prose ↔ example)
        if not para:
            para_line = i + 1
        para.append(line)
        i += 1
    flush()
    return ParsedDocument("txt", blocks, title, {})


# ----------------------------------------------------------------------------- PDF


def _pdf_outline(reader: object) -> list[tuple[int, tuple[str, ...]]]:
    """(first page index, heading path) for each outline entry, in page order."""
    out: list[tuple[int, tuple[str, ...]]] = []

    def visit(items: list[Any], path: tuple[str, ...]) -> None:
        last: tuple[str, ...] = path
        for item in items:
            if isinstance(item, list):
                visit(item, last)
                continue
            try:
                page = reader.get_destination_page_number(item)  # type: ignore[attr-defined]
            except Exception:
                continue
            title = " ".join(str(getattr(item, "title", "")).split())
            last = (*path, title) if title else path
            if page is not None and page >= 0:
                out.append((page, last))

    try:
        visit(reader.outline, ())  # type: ignore[attr-defined]
    except Exception:
        return []
    out.sort(key=lambda e: e[0])
    return out


def parse_pdf(data: bytes) -> ParsedDocument:
    """Text per page (pypdf); paragraphs split on blank lines, hyphenated line breaks joined;
    sections from the PDF outline (bookmarks) when it has one."""
    try:
        import pypdf
    except ImportError:
        raise InvalidInputError(
            "PDF support needs pypdf: pip install 'cdr-retrieval[pdf]'") from None
    reader = pypdf.PdfReader(io.BytesIO(data))
    if reader.is_encrypted:
        try:
            reader.decrypt("")
        except Exception as exc:
            raise InvalidInputError(f"encrypted PDF ({exc})") from None
    outline = _pdf_outline(reader)
    title = None
    if reader.metadata is not None and reader.metadata.title:
        title = str(reader.metadata.title).strip() or None
    blocks: list[Block] = []
    for p, page in enumerate(reader.pages):
        section: tuple[str, ...] = ()
        for first, path in outline:
            if first <= p:
                section = path
        raw = page.extract_text() or ""
        raw = re.sub(r"(\w)-\n(\w)", r"\1\2", raw)
        for para in re.split(r"\n\s*\n", raw):
            body = " ".join(para.split())
            if body:
                blocks.append(Block(body, section, f"page {p + 1}"))
    return ParsedDocument("pdf", blocks, title, {})

