"""Blocks → facts: paragraph-sized, within SPEC-009's 10–2048 token bounds.

Prose is split on sentence boundaries above `target_tokens`: the default model reads only the
first 256 word pieces of a text, so a longer fact would be ranked by its opening alone. Tiny
fragments (a "For example:" line, a one-line list item, a signature line) are merged with
their neighbours in the same section, because on their own they embed to noise. Code blocks stay
whole (split at line boundaries only beyond the hard 2048-token bound) and are flagged.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from cdr.ckf.records import MAX_FACT_TOKENS, MIN_FACT_TOKENS, FactDraft
from cdr.errors import InvalidInputError
from cdr.text.blocks import Block
from cdr.text.sentences import ends_sentence, split_sentences
from cdr.text.tokens import count_tokens, count_tokens_batch

SECTION_SEPARATOR = " > "


@dataclass(frozen=True, slots=True)
class ChunkConfig:
    min_tokens: int = MIN_FACT_TOKENS
    max_tokens: int = MAX_FACT_TOKENS
    target_tokens: int = 200
    merge_below: int = 24

    def __post_init__(self) -> None:
        if not (1 <= self.min_tokens <= self.merge_below <= self.target_tokens <= self.max_tokens):
            raise InvalidInputError(
                "chunk sizes must satisfy 1 ≤ min_tokens ≤ merge_below ≤ target_tokens ≤ "
                f"max_tokens, got {self}"
            )


DEFAULT_CHUNKING = ChunkConfig()


def fact_id(content: str) -> str:
    """Stable id: a hash of the content with whitespace runs collapsed, so re-wrapping a
    paragraph does not make it a new fact."""
    norm = " ".join(content.split())
    return hashlib.sha256(norm.encode("utf-8")).hexdigest()[:32]


@dataclass(slots=True)
class _Piece:
    text: str
    tokens: int
    is_code: bool
    location: str


# The token counter refuses texts of ≥ 1M characters, and no fact is near this size: longer
# blocks are cut (at a line, sentence or word end when there is one) before anything counts
# them, so a one-paragraph 1 MB file costs a pass over its text like any other.
MAX_COUNT_CHARS = 100_000


def _cut_long(text: str, limit: int = MAX_COUNT_CHARS) -> list[str]:
    """`text` in pieces of at most `limit` characters, each ending at the last newline,
    sentence end or space of its window where there is one in its second half."""
    parts: list[str] = []
    start, n = 0, len(text)
    while n - start > limit:
        window = text[start : start + limit]
        cut = -1
        for sep in ("\n", ". ", " "):
            k = window.rfind(sep)
            if k >= limit // 2:
                cut = k + len(sep)
                break
        if cut <= 0:
            cut = limit
        parts.append(text[start : start + cut])
        start += cut
    parts.append(text[start:])
    return [p for p in parts if p.strip()]


def _char_split(word: str, limit: int) -> list[str]:
    """A run without spaces (a base64 blob, a 1 MB 'word') in pieces of ≤ `limit` tokens:
    `limit` characters first (most are fewer tokens), halving any piece still over."""
    todo = [word[i : i + limit] for i in range(0, len(word), limit)]
    out: list[str] = []
    while todo:
        counts = count_tokens_batch(todo).tolist()
        over = []
        for piece, t in zip(todo, counts, strict=True):
            if t <= limit or len(piece) <= 1:
                out.append(piece)
            else:
                half = len(piece) // 2
                over += [piece[:half], piece[half:]]
        todo = over
    return out  # pieces of one word, order kept except across halvings (rare, tokens > chars)


def _hard_split(text: str, limit: int) -> list[str]:
    """Word windows of at most `limit` tokens, for text with no usable sentence breaks.

    Windows are first cut by characters (about 4 per token, as in English prose), then
    counted in one batch; a window over the limit is halved by words until it fits, and a
    single word over it is cut by `_char_split`. So a 1 MB paragraph costs a few thousand
    counts, not one per word.
    """
    words = text.split(" ")
    budget = 4 * limit
    windows: list[list[str]] = []
    cur: list[str] = []
    size = 0
    for w in words:
        if cur and size + len(w) + 1 > budget:
            windows.append(cur)
            cur, size = [], 0
        cur.append(w)
        size += len(w) + 1
    if cur:
        windows.append(cur)
    # (text, done) in reading order; each round counts the undone ones in one batch.
    items: list[tuple[str, bool]] = [(" ".join(win), False) for win in windows]
    while not all(done for _, done in items):
        todo = [text for text, done in items if not done]
        counts = iter(count_tokens_batch(todo).tolist())
        nxt: list[tuple[str, bool]] = []
        for text, done in items:
            if done:
                nxt.append((text, True))
                continue
            t = next(counts)
            win = text.split(" ")
            if t <= limit:
                nxt.append((text, True))
            elif len(win) > 1:
                half = len(win) // 2
                nxt += [(" ".join(win[:half]), False), (" ".join(win[half:]), False)]
            else:
                nxt += [(piece, True) for piece in _char_split(text, limit)]
        items = nxt
    return [text for text, _ in items if text.strip()]


def _pack(units: Sequence[str], counts: Sequence[int], limit: int, joiner: str) -> list[str]:
    """Consecutive units into parts ≤ `limit`, balanced: the fewest parts whose greedy fill
    (breaking at the unit boundary nearest to total/n) fits, so no part is a tiny tail."""
    total = sum(counts)
    n = max(1, math.ceil(total / limit))
    while True:
        target = total / n
        parts: list[str] = []
        cur: list[str] = []
        cur_t = 0
        for u, t in zip(units, counts, strict=True):
            if cur and (cur_t + t > limit or cur_t + t / 2 > target):
                parts.append(joiner.join(cur))
                cur, cur_t = [], 0
            cur.append(u)
            cur_t += t
        if cur:
            parts.append(joiner.join(cur))
        if len(parts) <= n or n >= len(units):
            return parts
        n += 1


def _split_prose(text: str, limit: int) -> list[str]:
    sentences = split_sentences(text)
    units: list[str] = []
    for s in sentences:
        if count_tokens(s) > limit:
            units.extend(_hard_split(s, limit))
        else:
            units.append(s)
    counts = count_tokens_batch(units).tolist()
    return _pack(units, counts, limit, " ")


def _split_code(text: str, limit: int) -> list[str]:
    lines = text.split("\n")
    units: list[str] = []
    for ln in lines:
        units.extend(_hard_split(ln, limit) if count_tokens(ln) > limit else [ln])
    counts = count_tokens_batch([u + "\n" for u in units]).tolist()
    return [p for p in _pack(units, counts, limit, "\n") if p.strip()]


def _join(a: _Piece, b: _Piece) -> _Piece:
    return _Piece(a.text + "\n" + b.text, a.tokens + b.tokens + 1, a.is_code and b.is_code,
                  a.location)


def _fits(a: _Piece, b: _Piece, limit: int) -> bool:
    return a.tokens + b.tokens + 1 <= limit and (a.is_code == b.is_code or
                                                   min(a.tokens, b.tokens) < MIN_FACT_TOKENS)


def _leads_forward(p: _Piece) -> bool:
    """A tiny piece that introduces what follows (a signature line, a label) rather than
    closing what precedes ("New in version 3.10.")."""
    text = p.text.rstrip()
    return not p.is_code and (text.endswith(":") or not ends_sentence(text))


def _merge_small(pieces: list[_Piece], cfg: ChunkConfig) -> list[_Piece]:
    out: list[_Piece] = []
    carry: _Piece | None = None
    for p in pieces:
        if carry is not None:
            if not p.is_code and _fits(carry, p, cfg.target_tokens):
                p = _join(carry, p)
            elif out and _fits(out[-1], carry, cfg.target_tokens):
                out[-1] = _join(out[-1], carry)
            else:
                out.append(carry)
            carry = None
        small = p.tokens < (cfg.min_tokens if p.is_code else cfg.merge_below)
        if small and _leads_forward(p):
            carry = p
        elif small and out and _fits(out[-1], p, cfg.target_tokens):
            out[-1] = _join(out[-1], p)
        else:
            out.append(p)
    if carry is not None:
        if out and _fits(out[-1], carry, cfg.target_tokens):
            out[-1] = _join(out[-1], carry)
        else:
            out.append(carry)
    # What is still under the floor joins a neighbour up to the hard bound, or is dropped.
    final: list[_Piece] = []
    for p in out:
        tiny = final and min(p.tokens, final[-1].tokens) < cfg.min_tokens
        if tiny and _fits(final[-1], p, cfg.max_tokens):
            final[-1] = _join(final[-1], p)
        else:
            final.append(p)
    return final


def _section_pieces(blocks: Sequence[Block], counts: Sequence[int],
                    cfg: ChunkConfig) -> list[_Piece]:
    pieces: list[_Piece] = []
    for b, t in zip(blocks, counts, strict=True):
        if b.is_code:
            texts = [b.text] if t <= cfg.max_tokens else _split_code(b.text, cfg.max_tokens)
        else:
            texts = ([b.text] if t <= cfg.target_tokens
                     else _split_prose(b.text, cfg.target_tokens))
        if len(texts) == 1:
            pieces.append(_Piece(texts[0], t, b.is_code, b.location))
        else:
            sub = count_tokens_batch(texts).tolist()
            pieces.extend(_Piece(x, n, b.is_code, b.location)
                          for x, n in zip(texts, sub, strict=True))
    return _merge_small(pieces, cfg)


def chunk_blocks(blocks: Sequence[Block],
                 config: ChunkConfig = DEFAULT_CHUNKING) -> list[FactDraft]:
    """Facts of one document in reading order; duplicates within the document kept once.
    Every fact is within `config.max_tokens`, however long a paragraph, line or word is."""
    blocks = [
        replace(b, text=part) if len(b.text) > MAX_COUNT_CHARS else b
        for b in blocks if b.text.strip()
        for part in (_cut_long(b.text) if len(b.text) > MAX_COUNT_CHARS else [b.text])
    ]
    if not blocks:
        return []
    counts = count_tokens_batch([b.text for b in blocks]).tolist()
    facts: list[FactDraft] = []
    seen: set[str] = set()
    start = 0
    while start < len(blocks):
        end = start
        while end < len(blocks) and blocks[end].section == blocks[start].section:
            end += 1
        section = SECTION_SEPARATOR.join(blocks[start].section)
        pieces = _section_pieces(blocks[start:end], counts[start:end], config)
        exact = count_tokens_batch([p.text for p in pieces]).tolist()
        for p, n in zip(pieces, exact, strict=True):
            if n < config.min_tokens:
                continue
            texts = [p.text] if n <= config.max_tokens else _hard_split(p.text, config.max_tokens)
            for text in texts:
                tokens = n if len(texts) == 1 else count_tokens(text)
                fid = fact_id(text)
                if fid in seen or tokens < config.min_tokens:
                    continue
                seen.add(fid)
                facts.append(FactDraft(fid, text, section, p.location, p.is_code, tokens))
        start = end
    return facts
