"""Documents → paragraph-level blocks, each with its heading path and location.

One parser per format, all producing the same `ParsedDocument`. The parsers keep structure
(headings, code, lists) and drop chrome (HTML navigation, scripts); sizing facts is the
chunker's job, not theirs.
"""

from __future__ import annotations

import html as html_lib
import io
import re
import textwrap
from collections.abc import Callable
from functools import lru_cache
from typing import Any

from cdr.ckf.model import Block, ParsedDocument
from cdr.errors import InvalidInputError

KIND_BY_SUFFIX = {
    ".md": "md", ".markdown": "md", ".mdown": "md", ".mkd": "md",
    ".txt": "txt", ".text": "txt", ".rst": "txt",
    ".html": "html", ".htm": "html", ".xhtml": "html",
    ".pdf": "pdf",
}
KINDS = ("md", "txt", "html", "pdf")
# Bumped when parsing or chunking changes what facts a document yields, so that re-ingesting
# an unchanged file re-chunks it (and embeds only texts that are actually new).
PARSER_VERSION = 2  # 2: Markdown by markdown-it-py (CommonMark)


class _Sections:
    """The current heading path; a heading of level n replaces everything at level ≥ n."""

    def __init__(self) -> None:
        self._stack: list[tuple[int, str]] = []

    def enter(self, level: int, title: str) -> None:
        title = " ".join(title.split())
        while self._stack and self._stack[-1][0] >= level:
            self._stack.pop()
        if title:
            self._stack.append((level, title))

    @property
    def path(self) -> tuple[str, ...]:
        return tuple(t for _, t in self._stack)


# ----------------------------------------------------------------------------- Markdown

_FRONT_KEY = re.compile(r"^([A-Za-z_][\w-]*)\s*:\s*(.*?)\s*$")
_TAG = re.compile(r"<[^>]*>")
# Nesting markdown-it follows before it stops; beyond it the rest of the document would be
# dropped, so parse_markdown notices and reads the remainder as plain text instead. 40 levels
# is deeper than any real document and keeps markdown-it's recursion far from Python's limit.
MAX_MD_NESTING = 40
_LIST_INDENT_CAP = 8  # deeper list levels are rendered at this indentation (no O(depth²) text)


def _front_matter(lines: list[str]) -> tuple[dict[str, str], int]:
    """`---` key: value `---` at the top (YAML subset: flat scalars only)."""
    if not lines or lines[0].strip() != "---":
        return {}, 0
    meta: dict[str, str] = {}
    for i in range(1, min(len(lines), 200)):
        if lines[i].strip() in ("---", "..."):
            return meta, i + 1
        m = _FRONT_KEY.match(lines[i])
        if m:
            meta[m.group(1).lower().replace("-", "_")] = m.group(2).strip("'\"")
    return {}, 0  # no closing fence: it was a horizontal rule, not front matter


@lru_cache(maxsize=1)
def _markdown_it() -> Any:
    """CommonMark plus GFM tables; the parser object is reusable and thread-safe to call."""
    from markdown_it import MarkdownIt

    return MarkdownIt("commonmark", {"maxNesting": MAX_MD_NESTING}).enable("table")


def _inline_text(token: Any) -> str:
    """An inline token's plain text: markup dropped, link and image text kept, breaks →
    spaces (a soft-wrapped paragraph is one line)."""
    out: list[str] = []
    for child in token.children or ():
        t = child.type
        if t in ("text", "code_inline"):
            out.append(child.content)
        elif t in ("softbreak", "hardbreak"):
            out.append(" ")
        elif t == "image":
            out.append(child.content)
    return " ".join("".join(out).split())


def parse_markdown(text: str) -> ParsedDocument:
    """CommonMark (markdown-it-py) → blocks: a paragraph, a whole list (one item per line,
    nesting shown by indentation), a table (cells joined by " | ", one row per line) or a code
    block each; headings (ATX and setext) set the section path; HTML blocks keep their text;
    link reference definitions and HTML comments yield nothing. Front matter as before."""
    lines = text.splitlines()
    meta, skip = _front_matter(lines)
    body = "\n".join(lines[skip:])
    doc = ParsedDocument("md", [], meta.get("title"), meta)
    sections = _Sections()
    _md_blocks(body, skip, sections, doc)
    return doc


def _md_blocks(body: str, offset: int, sections: _Sections, doc: ParsedDocument) -> None:
    tokens = _markdown_it().parse(body)
    blocks = doc.blocks
    lists: list[list[str]] = []  # open lists: [marker, indent, marker-used flag]
    list_lines: list[str] = []
    list_line = 0
    table_rows: list[str] = []
    row: list[str] = []
    table_line = 0
    heading: int | None = None
    last_line = 0

    def loc(tok: Any) -> str:
        return f"line {(tok.map[0] if tok.map else 0) + offset + 1}"

    def flush_list() -> None:
        nonlocal list_lines
        if list_lines:
            blocks.append(Block("\n".join(list_lines), sections.path, f"line {list_line}"))
        list_lines = []

    for tok in tokens:
        if tok.map:
            last_line = max(last_line, tok.map[1])
        t = tok.type
        if t in ("bullet_list_open", "ordered_list_open"):
            if not lists:
                list_line = (tok.map[0] if tok.map else 0) + offset + 1
            lists.append(["-", "", ""])
        elif t in ("bullet_list_close", "ordered_list_close"):
            lists.pop()
            if not lists:
                flush_list()
        elif t == "list_item_open":
            marker = f"{tok.info}{tok.markup}" if tok.info else (tok.markup or "-")
            indent = "  " * min(len(lists) - 1, _LIST_INDENT_CAP)
            lists[-1] = [marker, indent, ""]
        elif t == "heading_open":
            flush_list()
            heading = int(tok.tag[1])
        elif t == "heading_close":
            heading = None
        elif t == "inline":
            text = _inline_text(tok)
            if heading is not None:
                sections.enter(heading, text)
                if doc.title is None and heading == 1 and sections.path:
                    doc.title = sections.path[-1]
            elif table_line:
                row.append(text)
            elif not text:
                continue
            elif lists:
                marker, indent, used = lists[-1]
                list_lines.append(f"{indent}{'  ' if used else marker} {text}".rstrip())
                lists[-1][2] = "y"
            else:
                blocks.append(Block(text, sections.path, loc(tok)))
        elif t in ("fence", "code_block"):
            code = tok.content.strip("\n")
            if t == "code_block" or lists:
                code = textwrap.dedent(code)
            if code.strip():
                flush_list()  # a code block inside a list item stays code, in reading order
                blocks.append(Block(code, sections.path, loc(tok), is_code=True))
        elif t == "table_open":
            flush_list()
            table_line = (tok.map[0] if tok.map else 0) + offset + 1
        elif t == "tr_close":
            if any(row):
                table_rows.append(" | ".join(row))
            row = []
        elif t == "table_close":
            if table_rows:
                blocks.append(Block("\n".join(table_rows), sections.path, f"line {table_line}"))
            table_rows, table_line = [], 0
        elif t == "html_block":
            content = tok.content.strip()
            if content.startswith("<!--"):
                continue
            plain = html_lib.unescape(" ".join(_TAG.sub(" ", content).split()))
            if plain:
                if lists:
                    list_lines.append(f"{lists[-1][1]}  {plain}")
                else:
                    blocks.append(Block(plain, sections.path, loc(tok)))
    flush_list()
    # markdown-it stops at MAX_MD_NESTING and drops the rest: read that rest as plain text.
    rest_lines = body.splitlines()[last_line:]
    if any(ln.strip() for ln in rest_lines):
        doc.warnings.append(
            f"Markdown nested deeper than {MAX_MD_NESTING} levels from line "
            f"{last_line + offset + 1}: the rest is read as plain text"
        )
        rest = parse_text("\n".join(ln.strip() for ln in rest_lines))
        blocks.extend(Block(b.text, sections.path, _shift(b.location, last_line + offset),
                            b.is_code) for b in rest.blocks)


def _shift(location: str, by: int) -> str:
    kind, _, n = location.partition(" ")
    return f"{kind} {int(n) + by}" if n.isdigit() else location


# ----------------------------------------------------------------------------- plain text

_UNDERLINE = re.compile(r"^([=\-~*^#+\"'`:.])\1{2,}\s*$")
_SENTENCE_END = re.compile(r"[.!?][\"')\]]*$")


def _looks_like_prose(lines: list[str]) -> bool:
    """Indented text blocks are code unless they read as sentences (RST-style indented prose
    such as definition bodies ends in punctuation and has enough words)."""
    first = lines[0].lstrip()
    if first.startswith((">>>", "$ ", "% ", "#!")):
        return False
    joined = " ".join(ln.strip() for ln in lines)
    return bool(_SENTENCE_END.search(joined)) and len(joined.split()) >= 8


def parse_text(text: str) -> ParsedDocument:
    """Plain text and reStructuredText-like files: blank lines separate paragraphs; a line
    underlined (and optionally overlined) with punctuation is a heading, its level set by the
    order in which underline styles first appear (the RST rule)."""
    lines = text.splitlines()
    sections = _Sections()
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


# ----------------------------------------------------------------------------- HTML

_DROP_TAGS = frozenset({
    "script", "style", "noscript", "template", "nav", "svg", "form",
    "button", "input", "select", "textarea", "iframe", "object", "embed", "canvas", "head",
    "menu",
})
_DROP_ROLES = frozenset({"navigation", "banner", "contentinfo", "search", "menu", "menubar"})
_DROP_CLASSES = frozenset({
    "headerlink", "sphinxsidebar", "related", "footer", "breadcrumbs", "breadcrumb",
    "skip-link", "navbar", "mobile-nav", "menu-wrapper", "sidebar",
})
_PAGE_CHROME = frozenset({"header", "footer"})  # dropped unless inside an article/main/section
_CONTENT_ROOTS = frozenset({"article", "main", "section"})
_HEADINGS = {f"h{k}": k for k in range(1, 7)}
_BLOCK_TAGS = frozenset({
    "address", "article", "aside", "blockquote", "body", "caption", "dd", "details", "dialog",
    "div", "dl", "dt", "fieldset", "figcaption", "figure", "hr", "html", "li", "main", "ol",
    "p", "section", "summary", "ul", "tbody", "thead", "tfoot", "tr", "td", "th", "center",
})
_META_KEYS = {"cdr-source-type": "source_type", "cdr-importance": "importance"}


def _should_drop(el: object) -> bool:
    name = getattr(el, "name", None)
    if name is None:
        return False
    if name in _DROP_TAGS:
        return True
    if name in _PAGE_CHROME:
        # A page's banner and footer are chrome; an article's own <header> holds its title.
        return el.find_parent(_CONTENT_ROOTS) is None  # type: ignore[attr-defined]
    attrs = getattr(el, "attrs", None) or {}
    if str(attrs.get("role", "")).lower() in _DROP_ROLES:
        return True
    classes = attrs.get("class") or []
    if isinstance(classes, str):
        classes = classes.split()
    return any(c in _DROP_CLASSES for c in classes)


def _table_text(table: object) -> str:
    rows = []
    for tr in table.find_all("tr"):  # type: ignore[attr-defined]
        cells = [" ".join(c.get_text(" ").split()) for c in tr.find_all(["td", "th"])]
        if any(cells):
            rows.append(" | ".join(cells))
    return "\n".join(rows)


def parse_html(text: str) -> ParsedDocument:
    from bs4 import BeautifulSoup, Comment, Doctype, NavigableString, ProcessingInstruction

    soup = BeautifulSoup(text, "html.parser")
    title = " ".join(soup.title.get_text().split()) if soup.title else None
    meta: dict[str, str] = {}
    for tag in soup.find_all("meta"):
        key = _META_KEYS.get(str(tag.get("name", "")).lower())
        if key and tag.get("content"):
            meta[key] = str(tag["content"]).strip()
    for el in soup.find_all(_should_drop):
        if not el.decomposed:
            el.decompose()
    root = (soup.find("main") or soup.find(attrs={"role": "main"}) or soup.body or soup)

    sections = _Sections()
    blocks: list[Block] = []
    buf: list[str] = []
    buf_line = [0]
    skip = (Comment, Doctype, ProcessingInstruction)

    def flush() -> None:
        body = " ".join("".join(buf).split())
        if body:
            blocks.append(Block(body, sections.path, f"line {buf_line[0]}"))
        buf.clear()

    def walk(el: object, line: int) -> None:
        for child in el.children:  # type: ignore[attr-defined]
            if isinstance(child, NavigableString):
                if isinstance(child, skip):
                    continue
                if not buf:
                    buf_line[0] = line
                buf.append(str(child))
                continue
            name = child.name
            cline = child.sourceline or line
            if name in _HEADINGS:
                flush()
                sections.enter(_HEADINGS[name], child.get_text(" "))
            elif name == "pre":
                flush()
                code = child.get_text().strip("\n")
                if code.strip():
                    blocks.append(Block(textwrap.dedent(code), sections.path, f"line {cline}",
                                        is_code=True))
            elif name == "table":
                flush()
                body = _table_text(child)
                if body:
                    blocks.append(Block(body, sections.path, f"line {cline}"))
            elif name == "br":
                buf.append("\n")
            elif name in _BLOCK_TAGS:
                flush()
                walk(child, cline)
                flush()
            else:
                walk(child, cline)

    walk(root, getattr(root, "sourceline", None) or 1)
    flush()
    return ParsedDocument("html", blocks, title, meta)


# ----------------------------------------------------------------------------- PDF


def pdf_available() -> bool:
    try:
        import pypdf  # noqa: F401
    except ImportError:
        return False
    return True


def _pdf_outline(reader: object) -> list[tuple[int, tuple[str, ...]]]:
    """(first page index, heading path) for each outline entry, in page order."""
    out: list[tuple[int, tuple[str, ...]]] = []

    def visit(items: list, path: tuple[str, ...]) -> None:
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
        raise InvalidInputError("PDF support needs pypdf: pip install 'cdr[pdf]'") from None
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


PARSERS: dict[str, Callable[[str], ParsedDocument]] = {
    "md": parse_markdown,
    "txt": parse_text,
    "html": parse_html,
}


def parse(kind: str, text: str) -> ParsedDocument:
    """Parse decoded text of one of the text kinds ("md", "txt", "html")."""
    try:
        parser = PARSERS[kind]
    except KeyError:
        raise InvalidInputError(f"unknown document kind {kind!r}; expected one of "
                                f"{', '.join(PARSERS)}") from None
    return parser(text)
