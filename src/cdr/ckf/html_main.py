"""Main-content detection for HTML pages: which of the streaming parser's blocks are the page's
content, and which are its site chrome (menus, navigation bars, footers, sidebars).

The streaming parser (`cdr.ckf.html_blocks`) drops what the markup names as chrome (`<nav>`,
`role=navigation`, Sphinx sidebars...), but a site whose menu is a plain `<div>` of links
becomes facts such as "Home Menu About Documentation Download License Support Purchase".
`trafilatura`, a maintained extractor tuned on real web pages, tells content from boilerplate
by text density, link density and position. Its own output is not used as the document:
it flattens code blocks (newlines lost) and turns inline `<code>` into `<pre>`, so the
streaming parser's blocks, sections and code stay the document and trafilatura's text only
decides which blocks to keep: a block stays when most of its word trigrams occur in the
extracted text (a block of one or two words: when it is a whole line of it, or a name the
text mentions), or when it is
code or a sentence of at least `PROSE_WORDS` words (content the extractor is known to leave
out; chrome is short or not a sentence); a page's "last modified" stamp never stays.

The extractor is skipped, and every block kept, when it is not installed, when
`CDR_HTML_EXTRACTOR=off`, when the page is larger than `MAX_CHARS` or nested deeper than
`MAX_DEPTH` (lxml builds a tree: the streaming parser's linear-cost guarantees on hostile
pages must hold), when it raises, or when it finds no content at all (it refuses pages it
cannot classify, such as short or mostly-tabular ones).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass

from cdr import settings
from cdr.text.blocks import Block
from cdr.text.sentences import ends_sentence

log = logging.getLogger("cdr.ckf")

ENV = "CDR_HTML_EXTRACTOR"
MAX_CHARS = 2_000_000
MAX_DEPTH = 200
# A block is content when at least this share of its word trigrams is in the extracted text.
KEEP_SHARE = 0.5
# Kept whatever the extractor says: code (site menus are never `<pre>`), and prose of at least
# PROSE_WORDS words that ends like a sentence (`cdr.text.sentences`) or a clause (CLAUSE_ENDS:
# a definition's lead-in ends in ':', a list item in ';' or a bracket). Measured on
# python3.11-doc, trafilatura leaves out parts of Sphinx definition lists (62 facts of 20
# pages: method and fixer descriptions); menus, tables of contents and footers are short or
# do not end like a sentence.
PROSE_WORDS = 8
CLAUSE_ENDS = (":", ";", ")", "]")
# A page's modification stamp ("This page last modified on 2022-04-12 00:22:10 UTC", "Last
# updated on Dec 02, 2026"): metadata about the page, not content, though extractors keep it
# when it sits inside the content's element. Dropped when the block is no longer than
# STAMP_WORDS words.
_STAMP = re.compile(r"^\W*(?:this\s+)?(?:page|document|file|site)?\s*(?:was\s+|has\s+been\s+)?"
                    r"(?:last\s+)(?:modified|updated|edited|changed|revised|generated)\b", re.I)
STAMP_WORDS = 16
# Links dropped from a page without sections that make it a menu.
MENU_ITEMS = 3
# A link with plain text: its words (bounded, so the scan stays linear).
_LINK = re.compile(r"<a\b[^<>]{0,2000}>([^<>]{1,200})</a>", re.I)
# What marks a short block as a name rather than plain words: an underscore, a digit, a dot or
# parenthesis inside a token, or an inner capital (camelCase).
_NAMING = re.compile(r"\w_|_\w|\d|\w[.(]\w|[a-z][A-Z]")

_WORD = re.compile(r"\w+")
_TAG = re.compile(r"<(/?)([A-Za-z][A-Za-z0-9:-]*)[^>]*?(/?)>")
_VOID = frozenset({"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta",
                   "param", "source", "track", "wbr", "p", "li", "dt", "dd", "tr", "td", "th",
                   "option"})  # void, or closed implicitly often enough not to count as depth


def extractor_enabled() -> bool:
    """False when `CDR_HTML_EXTRACTOR` is off/0/false/no, or trafilatura is not installed."""
    if settings.env(ENV, "on").strip().lower() in ("off", "0", "false", "no"):
        return False
    import importlib.util

    return importlib.util.find_spec("trafilatura") is not None


def extractor_id() -> str:
    """What decides the blocks, for the ingest's content hash: a change re-chunks the page."""
    if not extractor_enabled():
        return "stream"
    from importlib.metadata import version

    return (f"trafilatura {version('trafilatura')} share {KEEP_SHARE} prose {PROSE_WORDS} "
            "short-as-line-or-name stamp lead-words header-links")


def nesting_depth(text: str, stop_at: int = MAX_DEPTH) -> int:
    """The deepest element nesting in `text` by a linear scan of its tags (stops counting at
    `stop_at`). Elements that are void or usually left unclosed are not counted."""
    depth = deepest = 0
    for m in _TAG.finditer(text):
        closing, name, selfclosing = m.group(1), m.group(2).lower(), m.group(3)
        if name in _VOID or selfclosing:
            continue
        if closing:
            depth = max(depth - 1, 0)
        else:
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest >= stop_at:
                    break
    return deepest


@dataclass(frozen=True, slots=True)
class MainContent:
    """Why the blocks are what they are: `used` is False when the extractor was skipped."""

    used: bool
    reason: str
    dropped: int = 0


def _trigrams(words: Sequence[str]) -> set[tuple[str, ...]]:
    if len(words) < 3:
        return {tuple(words)} if words else set()
    return {tuple(words[i:i + 3]) for i in range(len(words) - 2)}


def _is_prose(text: str) -> bool:
    """A sentence of at least PROSE_WORDS words."""
    return len(_WORD.findall(text)) >= PROSE_WORDS and (ends_sentence(text) or
                                                     text.rstrip().endswith(CLAUSE_ENDS))


def _lead_length(blocks: Sequence[Block]) -> int:
    """How many blocks come before the first one in a section (a heading's scope): 0 when
    no block is in a section or the lead holds more than half the page's words (then it is
    the page's content, not its header). Words, not blocks: a page whose content is one big
    table is one block after a dozen menu items."""
    first = next((i for i, b in enumerate(blocks) if b.section), None)
    if first is None:
        return 0
    lead = sum(len(_WORD.findall(b.text)) for b in blocks[:first])
    rest = sum(len(_WORD.findall(b.text)) for b in blocks[first:])
    return first if lead <= rest else 0


def _link_texts(html: str) -> set[tuple[str, ...]]:
    """The words of every link whose text is plain (`<a …>Download</a>`), lower-cased. The
    pattern's bounded repeats keep the scan linear on a hostile page."""
    return {tuple(w.lower() for w in _WORD.findall(m.group(1)))
            for m in _LINK.finditer(html)}


def extracted_text(html: str) -> str | None:
    """trafilatura's main text of the page, or None when it finds none or fails."""
    import trafilatura

    try:
        text = trafilatura.extract(html, output_format="txt", include_tables=True,
                                   include_comments=False, include_links=False,
                                   include_formatting=False, favor_recall=True)
    except Exception as exc:  # a third-party parser on a hostile page: fall back, say why
        log.debug("trafilatura failed: %s: %s", type(exc).__name__, exc)
        return None
    return text if text and text.strip() else None


def keep_main_blocks(html: str, blocks: list[Block]) -> tuple[list[Block], MainContent]:
    """The blocks that are main content, and a note of what was done. Never raises."""
    if not blocks:
        return blocks, MainContent(False, "no blocks")
    if not extractor_enabled():
        return blocks, MainContent(False, "extractor off or not installed")
    if len(html) > MAX_CHARS:
        return blocks, MainContent(False, f"page over {MAX_CHARS:,} characters")
    if nesting_depth(html) >= MAX_DEPTH:
        return blocks, MainContent(False, f"page nested {MAX_DEPTH} or more deep")
    main = extracted_text(html)
    if main is None:
        return blocks, MainContent(False, "extractor found no main content")
    words = [w.lower() for w in _WORD.findall(main)]
    grams = _trigrams(words)
    lines = {tuple(w.lower() for w in _WORD.findall(line)) for line in main.splitlines()}
    vocabulary = set(words)
    lead = _lead_length(blocks)
    # A page with no section at all: its header is what comes before its first sentence or
    # code, and there a block of one or two plain words that is the whole text of a link is
    # navigation (after it, such a block is a list item: "Partial indexes", linked).
    links = set() if any(b.section for b in blocks) else _link_texts(html)
    header = next((i for i, b in enumerate(blocks) if b.is_code or _is_prose(b.text)),
                  len(blocks)) if links else 0
    menu_items = 0
    kept: list[Block] = []
    for i, block in enumerate(blocks):
        bw = [w.lower() for w in _WORD.findall(block.text)]
        prose = _is_prose(block.text)
        if not block.is_code and len(bw) <= STAMP_WORDS and _STAMP.search(block.text):
            keep = False
        elif i < lead and not (block.is_code or prose):
            # Before the first section: the site's header (menu, tagline, breadcrumbs, the
            # table of contents). Dropped even when the extractor kept it: on a page with
            # little prose (a list of links, a page of diagrams) it falls back to the whole
            # page, menu included. The page's title survives as the document's title.
            keep = False
        elif block.is_code or prose:
            keep = True
        elif i < header and len(bw) < 3 and tuple(bw) in links \
                and not _NAMING.search(block.text):
            keep = False
            menu_items += 1
        elif len(bw) < 3:
            # Too short for trigrams: kept when it is a line of the extracted text (a
            # heading, a list item), or when it names something (an identifier such as
            # `sqlite3session_create` or `CREATE_NO_WINDOW`, a number) that the text
            # mentions. Not when plain words merely occur in it: a menu's "About" and
            # "Documentation" occur in most pages' prose.
            keep = bool(bw) and (tuple(bw) in lines or (
                _NAMING.search(block.text) is not None and all(w in vocabulary for w in bw)))
        else:
            own = _trigrams(bw)
            keep = len(own & grams) >= KEEP_SHARE * len(own)
        if keep:
            kept.append(block)
    if menu_items >= MENU_ITEMS and not any(b.is_code or _is_prose(b.text) for b in kept) \
            and sum(len(_WORD.findall(b.text)) for b in kept) < PROSE_WORDS:
        # A menu dropped and nothing left that reads as content (a tagline at most): the
        # page is its site's menu, its real content built by a script or absent.
        return [], MainContent(True, "only navigation links", len(blocks))
    if not kept:  # the extractor's text matched nothing we parsed: trust the parser
        return blocks, MainContent(False, "extracted text matched no block")
    return kept, MainContent(True, "trafilatura", len(blocks) - len(kept))
