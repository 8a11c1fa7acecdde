"""The structure of Markdown a language model wrote: headings with levels, paragraphs, lists,
code blocks — read with markdown-it-py (CommonMark), not with regular expressions.

Small instruction models add headings, lists and fenced code unasked and stop mid-sentence
when the token limit hits. Stage 8 needs to know which words are prose under which heading,
which are code (not prose: they earn no depth) and where the last complete block ends, and a
CommonMark parser gets the edge cases (fences containing '#', setext headings, lazy list
continuation) right where line regexes do not.
"""

from __future__ import annotations

import re

from markdown_it import MarkdownIt
from markdown_it.token import Token

from cdr.text.blocks import Block
from cdr.text.sentences import finished_end

_PARSER = MarkdownIt("commonmark")
# A line that is only a bold or title-cased label ("**Introduction**", "Introduction") is a
# heading the model forgot to mark: Stage 8 must not take it for prose.
_BOLD_LINE = re.compile(r"^\s*(?:\*\*|__)(?P<t>[^*_\n]{1,80})(?:\*\*|__)\s*:?\s*$")


# The line endings CommonMark knows (markdown-it-py normalises each to "\n" before it counts
# lines). `str.splitlines` also ends a line at U+2028, form feeds, "\x1c" and more, so its line
# numbers drift from the parser's token maps on text a model wrote.
_LINE_END = re.compile(r"\r\n|\r|\n")


def line_starts(text: str) -> list[int]:
    """Where each line of `text` starts, as CommonMark counts lines, then the text's length:
    line k of a token map runs from `starts[k]` to `starts[k + 1]`."""
    return [0, *(m.end() for m in _LINE_END.finditer(text)), len(text)]


def source_lines(text: str) -> list[str]:
    """`text`'s lines as CommonMark counts them, each without its line ending."""
    return _LINE_END.split(text)


def _inline_text(tokens: list[Token], i: int) -> str:
    tok = tokens[i]
    return tok.content if tok.type == "inline" else ""


def parse_blocks(text: str) -> list[Block]:
    """Top-level blocks of `text` in order, each with its heading path."""
    tokens = _PARSER.parse(text)
    lines = source_lines(text)
    blocks: list[Block] = []
    path: list[tuple[int, str]] = []
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if tok.level != 0 or tok.map is None:
            i += 1
            continue
        start, end = tok.map
        kind: str | None = None
        content = ""
        level = 0
        if tok.type == "heading_open":
            level = int(tok.tag[1])
            content = _strip_inline(_inline_text(tokens, i + 1))
            kind = "heading"
        elif tok.type == "paragraph_open":
            content = _inline_text(tokens, i + 1)
            bold = _BOLD_LINE.match(content)
            if bold and "\n" not in content.strip():
                kind, level, content = "heading", 7, bold["t"].strip()
            elif _is_label(content) and _has_next_block(tokens, i):
                kind, level, content = "heading", 7, content.strip()
            else:
                kind = "paragraph"
        elif tok.type in ("bullet_list_open", "ordered_list_open"):
            kind = "list"
            content = "\n".join(line.strip() for line in lines[start:end] if line.strip())
        elif tok.type in ("fence", "code_block"):
            kind, content = "code", tok.content
        elif tok.type == "blockquote_open":
            kind = "quote"
            content = "\n".join(line.lstrip("> ").strip() for line in lines[start:end])
        elif tok.type == "hr":
            kind = "rule"
        elif tok.type == "html_block":
            kind, content = "paragraph", tok.content
        if kind == "heading":
            # Level 7: a bold label line, nested below any real heading.
            while path and path[-1][0] >= level:
                path.pop()
            path.append((level, content))
            blocks.append(Block(content, tuple(t for _, t in path[:-1]), f"line {start + 1}",
                                kind="heading", start=start, end=end, level=level))
        elif kind is not None:
            blocks.append(Block(content.strip(), tuple(t for _, t in path), f"line {start + 1}",
                                kind=kind, start=start, end=end))
        i += 1
    return blocks


def _is_label(content: str) -> bool:
    """A short one-line paragraph without closing punctuation ("Introduction") is a heading
    the model did not mark up."""
    line = content.strip()
    return ("\n" not in line and 0 < len(line.split()) <= 8 and line[-1:].isalnum()
            and line[:1].isupper())


def _has_next_block(tokens: list[Token], i: int) -> bool:
    return any(t.level == 0 and t.map is not None for t in tokens[i + 3:])


def _strip_inline(text: str) -> str:
    return re.sub(r"[*_`]+", "", text).strip().rstrip(":").strip()


def keep_complete(text: str) -> tuple[str, str]:
    """Split text cut off by a token limit into (complete part, unfinished tail).

    The last top-level block is unfinished (the limit hit inside it) unless the text ends
    with a blank line; it goes to the tail (of a list, only its last item), and so do headings
    left with nothing under them.
    When that would keep nothing, the cut falls after the last finished sentence instead
    (`cdr.text.sentences`), so a window that is one long paragraph still keeps what it
    finished.
    """
    if not text.strip():
        return "", text
    if text.endswith("\n\n") and not _open_fence(text):
        return text, ""
    cut = complete_blocks_end(text)
    if cut:
        kept = text[:cut].rstrip() + "\n"
        return kept, text[cut:].lstrip("\n")
    cut = finished_end(text)
    if not cut:
        return "", text
    return text[:cut].rstrip() + "\n", text[cut:]


def complete_blocks_end(text: str) -> int:
    """Where the complete top-level blocks of `text` end (0: none is complete yet).

    A block is complete once another block has begun after it; a heading with nothing under
    it yet is not. The last block, when it is a list, is complete up to its last item that
    another item follows: a small model's long list cut by the token limit keeps the items it
    finished (on the reference model, a window that opened with a sentence and a list used to
    keep the sentence alone, and the next window wrote both again). More text appended later
    cannot undo any of that, which is what lets a stream release a block (or a list item) as
    soon as the next one starts (`cdr.text.kept_stream`)."""
    blocks = parse_blocks(text)
    starts = line_starts(text)
    if blocks and blocks[-1].kind == "list":
        done = _finished_items_end(text, blocks[-1].start)
        if done:
            return starts[min(done, len(starts) - 1)]
    keep = blocks[:-1] if blocks else []
    while keep and keep[-1].kind == "heading":
        keep.pop()
    if not keep:
        return 0
    return starts[min(keep[-1].end, len(starts) - 1)]


def _finished_items_end(text: str, list_start: int) -> int:
    """The line where the finished items of the top-level list starting at `list_start` end:
    every item but the last (0 when the list has fewer than two items)."""
    items = [tok.map for tok in _PARSER.parse(text)
             if tok.type == "list_item_open" and tok.level == 1 and tok.map
             and tok.map[0] >= list_start]
    return items[-2][1] if len(items) >= 2 else 0


def _open_fence(text: str) -> bool:
    return sum(1 for line in source_lines(text) if line.lstrip().startswith("```")) % 2 == 1
