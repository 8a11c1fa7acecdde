"""Documents → paragraph-level blocks, each with its heading path and location.

One parser per format, all producing the same `ParsedDocument`. The parsers keep structure
(headings, code, lists) and drop chrome (HTML navigation, scripts); sizing facts is the
chunker's job, not theirs.
"""

from __future__ import annotations

import io
import re
import textwrap
from collections.abc import Callable

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
PARSER_VERSION = 1


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

_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})(.*)$")
_ATX = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$")
_SETEXT = re.compile(r"^ {0,3}(=+|-+)[ \t]*$")
_HR = re.compile(r"^ {0,3}([-*_])(?:[ \t]*\1){2,}[ \t]*$")
_LIST_ITEM = re.compile(r"^\s{0,3}(?:[-*+]|\d{1,9}[.)])\s+")
_FRONT_KEY = re.compile(r"^([A-Za-z_][\w-]*)\s*:\s*(.*?)\s*$")
_MD_LINK = re.compile(r"!?\[([^\]]*)\]\([^)]*\)")


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


def _join_prose(lines: list[str]) -> str:
    """Soft-wrapped lines become one line; lists and tables keep their line structure."""
    if any(_LIST_ITEM.match(ln) or ln.lstrip().startswith("|") for ln in lines):
        return "\n".join(ln.rstrip() for ln in lines).strip("\n")
    return " ".join(ln.strip() for ln in lines).strip()


def _heading_text(raw: str) -> str:
    return _MD_LINK.sub(r"\1", raw).strip().strip("#").strip()


def parse_markdown(text: str) -> ParsedDocument:
    lines = text.splitlines()
    meta, i = _front_matter(lines)
    sections = _Sections()
    blocks: list[Block] = []
    para: list[str] = []
    para_line = 0
    last_was_list = False
    title: str | None = meta.get("title")

    def flush() -> None:
        nonlocal para, last_was_list
        if para:
            body = _join_prose(para)
            if body:
                blocks.append(Block(body, sections.path, f"line {para_line}"))
            last_was_list = bool(_LIST_ITEM.match(para[0]))
        para = []

    n = len(lines)
    while i < n:
        line = lines[i]
        lineno = i + 1
        fence = _FENCE.match(line)
        if fence and not (fence.group(1)[0] == "`" and "`" in fence.group(2)):
            flush()
            mark = fence.group(1)
            close = re.compile(r"^ {0,3}" + re.escape(mark[0]) + "{" + str(len(mark)) + r",}\s*$")
            body: list[str] = []
            i += 1
            while i < n and not close.match(lines[i]):
                body.append(lines[i])
                i += 1
            code = textwrap.dedent("\n".join(body)).strip("\n")
            if code.strip():
                blocks.append(Block(code, sections.path, f"line {lineno}", is_code=True))
            last_was_list = False
            i += 1
            continue
        atx = _ATX.match(line)
        if atx:
            flush()
            last_was_list = False
            heading = _heading_text(atx.group(2) or "")
            sections.enter(len(atx.group(1)), heading)
            if title is None and len(atx.group(1)) == 1 and heading:
                title = heading
            i += 1
            continue
        if para and _SETEXT.match(line) and not _LIST_ITEM.match(para[0]):
            heading = _heading_text(" ".join(p.strip() for p in para))
            para = []
            level = 1 if line.strip()[0] == "=" else 2
            last_was_list = False
            sections.enter(level, heading)
            if title is None and level == 1 and heading:
                title = heading
            i += 1
            continue
        if not line.strip():
            flush()
            i += 1
            continue
        if not para and _HR.match(line):
            i += 1
            continue
        if not para and line.lstrip().startswith("<!--"):
            while i < n and "-->" not in lines[i]:
                i += 1
            i += 1
            continue
        indented = line.startswith(("    ", "\t"))
        if not para and indented and not last_was_list:
            body = []
            start = lineno
            while i < n and (lines[i].startswith(("    ", "\t")) or not lines[i].strip()):
                body.append(lines[i])
                i += 1
            code = textwrap.dedent("\n".join(body)).strip("\n")
            if code.strip():
                blocks.append(Block(code, sections.path, f"line {start}", is_code=True))
            continue
        if not para:
            para_line = lineno
        para.append(line)
        i += 1
    flush()
    return ParsedDocument("md", blocks, title, meta)


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
