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
from html.parser import HTMLParser
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
# markdown-it drops everything after a block nested deeper than its `maxNesting` (its guard
# against recursion). Before that depth, `_too_deep` takes over: the deeper lines become one
# plain-text block, in place, with a warning; so a list nested 2,000 deep costs one pass and
# no recursion, and nothing after it is lost. 40 token levels are ~20 nested lists or quotes.
MAX_MD_NESTING = 40
_FLATTEN_AT = MAX_MD_NESTING - 4
_LIST_INDENT_CAP = 8  # deeper list levels are rendered at this indentation (no O(depth²) text)


def _too_deep(state: Any, start: int, end: int, silent: bool) -> bool:
    """Block rule tried first: at nesting level ≥ `_FLATTEN_AT`, take the lines this block
    would own (down to the first line indented less than the current block) as plain text."""
    if state.level < _FLATTEN_AT or silent:
        return False
    nxt = start + 1
    while nxt < end and (state.isEmpty(nxt) or state.sCount[nxt] >= state.blkIndent):
        nxt += 1
    token = state.push("cdr_too_deep", "", 0)
    token.content = state.getLines(start, nxt, state.blkIndent, False)
    token.map = [start, nxt]
    state.env.setdefault("cdr_too_deep", start)
    state.line = nxt
    return True


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

    md = MarkdownIt("commonmark", {"maxNesting": MAX_MD_NESTING}).enable("table")
    md.block.ruler.before("table", "cdr_too_deep", _too_deep)
    return md


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
    env: dict[str, Any] = {}
    tokens = _markdown_it().parse(body, env)
    blocks = doc.blocks
    lists: list[list[str]] = []  # open lists: [marker, indent, marker-used flag]
    list_lines: list[str] = []
    list_line = 0
    table_rows: list[str] = []
    row: list[str] = []
    table_line = 0
    heading: int | None = None

    def loc(tok: Any) -> str:
        return f"line {(tok.map[0] if tok.map else 0) + offset + 1}"

    def flush_list() -> None:
        nonlocal list_lines
        if list_lines:
            blocks.append(Block("\n".join(list_lines), sections.path, f"line {list_line}"))
        list_lines = []

    for tok in tokens:
        t = tok.type
        if t in ("bullet_list_open", "ordered_list_open"):
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
                lead = " " * len(marker) if used else marker
                if not list_lines:
                    list_line = (tok.map[0] if tok.map else 0) + offset + 1
                list_lines.append(f"{indent}{lead} {text}")
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
        elif t == "cdr_too_deep":
            lines_ = [" ".join(ln.split()) for ln in tok.content.splitlines()]
            plain = "\n".join(ln for ln in lines_ if ln)
            if plain and lists:
                if not list_lines:
                    list_line = (tok.map[0] if tok.map else 0) + offset + 1
                list_lines.append(plain)
            elif plain:
                blocks.append(Block(plain, sections.path, loc(tok)))
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
    if "cdr_too_deep" in env:
        doc.warnings.append(
            f"Markdown nested deeper than {_FLATTEN_AT // 2} levels at line "
            f"{env['cdr_too_deep'] + offset + 1}: the deeper part is read as plain text"
        )


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


_VOID = frozenset({"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta",
                   "param", "source", "track", "wbr"})
# An open element of these kinds is closed by the start of another of the same group.
_AUTO_CLOSE = {"p": {"p"}, "li": {"li"}, "dt": {"dt", "dd"}, "dd": {"dt", "dd"},
               "tr": {"tr", "td", "th"}, "td": {"td", "th"}, "th": {"td", "th"},
               "option": {"option"}}
_MAIN_HINT = re.compile(r"""<main[\s>]|role\s*=\s*["']?main\b""", re.I)


class _Open:
    """One element on the open-element stack and what it switches on while open."""

    __slots__ = ("drop", "main", "root", "tag")

    def __init__(self, tag: str, drop: bool, root: bool, main: bool) -> None:
        self.tag, self.drop, self.root, self.main = tag, drop, root, main


class _HtmlBlocks(HTMLParser):
    """A streaming pass over the HTML (stdlib `html.parser`, no tree, no recursion): cost is
    linear in the size of the page and nesting depth only grows a list. Unclosed elements are
    closed by their parent's end tag, as browsers do; a stray end tag is ignored."""

    def __init__(self, has_main: bool) -> None:
        super().__init__(convert_charrefs=True)
        self.has_main = has_main
        self.stack: list[_Open] = []
        self.open_count: dict[str, int] = {}
        self.dropped = 0  # dropped elements open (chrome, scripts, forms...)
        self.roots = 0  # article/main/section open
        self.mains = 0  # <main> / role=main open
        self.sections = _Sections()
        self.blocks: list[Block] = []
        self.buf: list[str] = []
        self.buf_line = 0
        self.title: list[str] | None = None
        self.title_text: str | None = None
        self.meta: dict[str, str] = {}
        self.heading: tuple[int, list[str]] | None = None
        self.pre: tuple[int, list[str]] | None = None
        self.pre_depth = 0
        self.table: tuple[int, list[list[str]]] | None = None
        self.table_depth = 0

    # -- state
    def _collecting(self) -> bool:
        return not self.dropped and (self.mains > 0 or not self.has_main)

    def flush(self) -> None:
        body = " ".join("".join(self.buf).split())
        if body:
            self.blocks.append(Block(body, self.sections.path, f"line {self.buf_line}"))
        self.buf.clear()

    def _push(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: (v or "") for k, v in attrs}
        classes = a.get("class", "").split()
        root = tag in _CONTENT_ROOTS
        drop = (tag in _DROP_TAGS
                or (tag in _PAGE_CHROME and self.roots == 0)
                or a.get("role", "").lower() in _DROP_ROLES
                or any(c in _DROP_CLASSES for c in classes))
        main = tag == "main" or a.get("role", "").lower() == "main"
        self.stack.append(_Open(tag, drop, root, main))
        self.open_count[tag] = self.open_count.get(tag, 0) + 1
        self.dropped += drop
        self.roots += root
        self.mains += main

    def _pop(self) -> _Open:
        el = self.stack.pop()
        self.open_count[el.tag] -= 1
        self.dropped -= el.drop
        self.roots -= el.root
        self.mains -= el.main
        self._closed(el.tag)
        return el

    # -- parser callbacks
    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "meta":
            key = _META_KEYS.get(str(dict(attrs).get("name") or "").lower())
            content = dict(attrs).get("content")
            if key and content:
                self.meta[key] = content.strip()
            return
        if tag == "title" and self.title_text is None:
            self.title = []
        if tag == "br":
            if self._collecting():
                self._data("\n")
            return
        if tag in _VOID:
            if tag == "hr" and self._collecting():
                self.flush()
            return
        closes = _AUTO_CLOSE.get(tag)
        if closes and self.stack and self.stack[-1].tag in closes:
            self._pop()
        was_collecting = self._collecting()
        self._push(tag, attrs)
        if not self._collecting():
            if was_collecting and self.heading is None and self.pre is None and not self.table:
                self.flush()
            return
        line = self.getpos()[0]
        if tag in _HEADINGS and self.pre is None and self.table is None:
            self.flush()
            self.heading = (_HEADINGS[tag], [])
        elif tag == "pre" and self.table is None:
            self.flush()
            self.pre_depth += 1
            if self.pre is None:
                self.pre = (line, [])
        elif tag == "table":
            self.table_depth += 1
            if self.table is None:
                self.flush()
                self.table = (line, [])
        elif self.table is not None and tag == "tr":
            self.table[1].append([])
        elif self.table is not None and tag in ("td", "th"):
            if not self.table[1]:
                self.table[1].append([])
            self.table[1][-1].append("")
        elif tag in _BLOCK_TAGS and self.heading is None and self.pre is None:
            self.flush()

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.handle_starttag(tag, attrs)
        if tag not in _VOID and self.stack and self.stack[-1].tag == tag:
            self._pop()

    def handle_endtag(self, tag: str) -> None:
        if tag == "title" and self.title is not None:
            self.title_text = " ".join("".join(self.title).split())
            self.title = None
        if not self.open_count.get(tag):
            return  # a stray end tag
        while self._pop().tag != tag:
            pass

    def _closed(self, tag: str) -> None:
        """An element ended (explicitly or implicitly): finish what it was building."""
        if self.heading is not None and tag in _HEADINGS:
            level, parts = self.heading
            self.heading = None
            self.sections.enter(level, "".join(parts))
        elif self.pre is not None and tag == "pre":
            self.pre_depth -= 1
            if self.pre_depth == 0:
                line, parts = self.pre
                self.pre = None
                code = "".join(parts).strip("\n")
                if code.strip():
                    self.blocks.append(Block(textwrap.dedent(code), self.sections.path,
                                             f"line {line}", is_code=True))
        elif self.table is not None and tag == "table":
            self.table_depth -= 1
            if self.table_depth == 0:
                line, rows = self.table
                self.table = None
                lines = [" | ".join(" ".join(c.split()) for c in r) for r in rows]
                body = "\n".join(ln for ln in lines if ln.replace("|", "").strip())
                if body:
                    self.blocks.append(Block(body, self.sections.path, f"line {line}"))
        elif tag in _BLOCK_TAGS and self.heading is None and self.pre is None \
                and self.table is None:
            self.flush()

    def _data(self, data: str) -> None:
        if self.heading is not None:
            self.heading[1].append(data)
        elif self.pre is not None:
            self.pre[1].append(data)
        elif self.table is not None:
            rows = self.table[1]
            if rows and rows[-1]:
                rows[-1][-1] += " " + data
        else:
            if not self.buf:
                self.buf_line = self.getpos()[0]
            self.buf.append(data)

    def handle_data(self, data: str) -> None:
        if self.title is not None:
            self.title.append(data)
            return
        if self._collecting():
            self._data(data)


def parse_html(text: str) -> ParsedDocument:
    """HTML → blocks: paragraphs, `<pre>` as code, tables as rows of " | "-joined cells;
    headings set the section path; navigation, scripts, forms and page chrome are dropped, and
    if the page has a `<main>` only it is read. One streaming pass, so a 200,000-row table or
    divs nested 100,000 deep cost time in proportion to their size."""
    parser = _HtmlBlocks(has_main=bool(_MAIN_HINT.search(text)))
    parser.feed(text)
    parser.close()
    while parser.stack:
        parser._pop()
    parser.flush()
    return ParsedDocument("html", parser.blocks, parser.title_text or None, parser.meta)


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
