"""Markdown → blocks with markdown-it-py (CommonMark + GFM tables).

A paragraph, a whole list (one item per line, nesting shown by indentation), a table (cells
joined by " | ", one row per line) or a code block is one block; ATX and setext headings set the
section path; HTML blocks keep their text; link reference definitions and comments yield
nothing. The same library that renders Markdown decides what a heading is, instead of our own
regexes.
"""

from __future__ import annotations

import html as html_lib
import re
import textwrap
from functools import lru_cache
from typing import Any

from cdr.ckf.records import ParsedDocument
from cdr.ckf.sections import Sections
from cdr.text.blocks import Block

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


def front_matter(lines: list[str]) -> tuple[dict[str, str], int]:
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
    meta, skip = front_matter(lines)
    body = "\n".join(lines[skip:])
    doc = ParsedDocument("md", [], meta.get("title"), meta)
    sections = Sections()
    _md_blocks(body, skip, sections, doc)
    return doc


def _md_blocks(body: str, offset: int, sections: Sections, doc: ParsedDocument) -> None:
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
