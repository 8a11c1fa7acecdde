"""HTML → blocks in one streaming pass of the standard library's `html.parser`.

Paragraphs, `<pre>` as code, tables as rows of " | "-joined cells; headings set the section
path; navigation, scripts, forms and page chrome are dropped, and if the page has a `<main>`
only it is read. No tree is built and nothing recurses, so the cost is linear in the page's
size whatever its nesting (a tree walk blew the recursion limit on deep pages and took
seconds per MB building objects).
"""

from __future__ import annotations

import re
import textwrap
from html.parser import HTMLParser

from cdr.ckf.html_main import keep_main_blocks
from cdr.ckf.records import ParsedDocument
from cdr.ckf.sections import Sections
from cdr.text.blocks import Block

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
        self.sections = Sections()
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
    # Site chrome the markup does not name (a menu in plain divs): kept out by a main-content
    # extractor where one is installed and the page is safe to give it (cdr.ckf.html_main).
    blocks, _ = keep_main_blocks(text, parser.blocks)
    return ParsedDocument("html", blocks, parser.title_text or None, parser.meta)
