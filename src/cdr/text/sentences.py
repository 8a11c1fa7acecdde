"""Where a sentence ends: the one rule every layer uses.

Facts are cut at sentence ends (`cdr.ckf.chunk`), a window cut off by the token limit keeps its
finished sentences (`cdr.text.markdown.keep_complete`), the repeat guard drops whole sentences
(`cdr.window.repeat_guard`), a continued section quotes from a sentence start
(`cdr.window.dpe.tail_words`) and the quality measures compare sentences
(`cdr.report.quality`). They all ask the same question, so they share one answer: the rule
the chunker has always used, since the facts of every stored CKF (and so every benchmark) were
cut by it — changing it would change fact ids (`cdr.ckf.parse.PARSER_VERSION`).

A sentence ends at `.`, `!` or `?` (closing quotes and brackets after it belong to it); between
two sentences there is white space and the next one starts with a capital, a digit or an
opening quote or bracket. A period after a common abbreviation ("e.g.", "Dr.") or a single
capital ("J. Smith") ends no sentence.

Chinese and Japanese end a sentence at `。`, `！` or `？` (full-width, closers such as `」` or
`）` after it belonging to it), with no space after it and whatever starts the next: "这是第一
句。这是第二句。" is two sentences; and a Latin sentence ends before one that starts with kana
or an ideograph. Text without CJK is cut exactly as before, so the facts (and fact ids) of
every CKF of other languages stay what they were; a document with CJK in it is cut anew on its
next ingest (`CJK_CUT` in the ingest's content hash).
"""

from __future__ import annotations

import re

TERMINALS = ".!?"
CLOSERS = "\"'”’)]"
# CJK text: kana and ideographs, which have no capitals (a Latin sentence before one ends).
CJK_LETTERS = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff"
_BREAK = re.compile(rf"([{TERMINALS}][{re.escape(CLOSERS)}]*)\s+"
                    rf"(?=[\"'“‘(\[]?[A-Z0-9{CJK_LETTERS}])")
CJK_TERMINALS = "。！？"
CJK_CUT = " cjk-cut 1"  # what a text with CJK in it adds to its ingest hash
# UTF-8 of U+3000-U+9FFF and the full-width forms: the bytes of a document with CJK in it.
CJK_BYTES = re.compile(rb"[\xe3-\xe9][\x80-\xbf][\x80-\xbf]|\xef[\xbc-\xbf][\x80-\xbf]")
CJK_CLOSERS = "」』）】〉》〕”’\"'"
_CJK_BREAK = re.compile(rf"([{CJK_TERMINALS}][{re.escape(CJK_CLOSERS)}]*)\s*(?=\S)")
_ENDS = re.compile(rf"(?:[{TERMINALS}][{re.escape(CLOSERS)}]*"
                   rf"|[{CJK_TERMINALS}][{re.escape(CJK_CLOSERS)}]*)$")
_ABBREV = re.compile(
    r"(?:\b(?:e\.g|i\.e|etc|vs|cf|al|approx|Mr|Mrs|Ms|Dr|Prof|St|No|Fig|Eq|Sec|Ch|Vol|pp)"
    r"|\b[A-Z])\.$"
)


def sentence_spans(text: str) -> list[tuple[int, int]]:
    """(start, end) offsets of `text`'s sentences in order, white space around them left out;
    the last span runs to the end of the text whether or not it ends like a sentence."""
    spans: list[tuple[int, int]] = []
    start = 0
    breaks = list(_BREAK.finditer(text))
    if any(c in text for c in CJK_TERMINALS):
        breaks = sorted([*breaks, *_CJK_BREAK.finditer(text)], key=lambda m: m.start())
    for m in breaks:
        end = m.end(1)
        if end <= start or (m.re is _BREAK and _ABBREV.search(text[start:end])):
            continue
        _add_span(spans, text, start, end)
        start = m.end()
    _add_span(spans, text, start, len(text))
    return spans


def _add_span(spans: list[tuple[int, int]], text: str, start: int, end: int) -> None:
    piece = text[start:end]
    if piece.strip():
        lead = len(piece) - len(piece.lstrip())
        spans.append((start + lead, start + len(piece.rstrip())))


def split_sentences(text: str) -> list[str]:
    """`text`'s sentences as written (inner markup and line breaks kept), stripped."""
    return [text[s:e] for s, e in sentence_spans(text)]


def ends_sentence(text: str) -> bool:
    """Whether `text` (trailing white space aside) ends where a sentence can end."""
    return _ENDS.search(text.rstrip()) is not None


def finished_end(text: str) -> int:
    """Where the finished sentences of `text` end (0: none is finished): text cut off
    mid-sentence keeps the sentences before the cut, and a last sentence counts once it ends
    like one."""
    spans = sentence_spans(text)
    if spans and not ends_sentence(text[spans[-1][0]:spans[-1][1]]):
        spans.pop()
    return spans[-1][1] if spans else 0
