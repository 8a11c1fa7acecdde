"""The n-gram output guard of CRP-SPEC-024 §5, built so ranking never re-tokenises the CKF.

Each fact's distinct 6-grams are hashed to 64-bit integers once (at ingest). A session's
blacklist is a set of such hashes; an inverted index (hash -> facts holding it) lets each new
window update the per-fact blacklisted-6-gram counts in time proportional to the window's own
text, not to the size of the knowledge base.

Tokenizer (docs/design.md §3.1 "Tokenizer for n-grams"): ``re.findall(r"\\w+", text.lower())``.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Sequence
from functools import lru_cache

import numpy as np

NGRAM_SIZE = 6
NGRAM_PENALTY_STEP = 0.15
NGRAM_PENALTY_CAP = 0.80

_TOKEN_RE = re.compile(r"\w+")
# Odd 64-bit multiplier for the polynomial combination of token hashes (any odd constant with
# well-mixed bits works; this one is the 64-bit golden-ratio constant).
_MULT = np.uint64(0x9E3779B97F4A7C15)
_EMPTY = np.zeros(0, dtype=np.uint64)


def tokenize(text: str) -> list[str]:
    """Lower-cased word tokens, the spec's `tokenize` as read in docs/design.md §3.1 "Tokenizer for
    n-grams"."""
    return _TOKEN_RE.findall(text.lower())


@lru_cache(maxsize=1 << 18)
def _token_hash(token: str) -> int:
    # blake2b, not hash(): the value must be the same in every process (sessions are stored).
    return int.from_bytes(hashlib.blake2b(token.encode("utf-8"), digest_size=8).digest(), "little")


def token_hashes(tokens: Sequence[str]) -> np.ndarray:
    """64-bit hash per token, stable across processes."""
    return np.fromiter((_token_hash(t) for t in tokens), dtype=np.uint64, count=len(tokens))


def ngram_hashes_of_tokens(tokens: Sequence[str], n: int = NGRAM_SIZE) -> np.ndarray:
    """Distinct n-gram hashes (sorted uint64) of a token sequence.

    The n-gram hash is a polynomial over the token hashes, computed for all positions at once
    with wrapping uint64 arithmetic; position matters, so "a b" and "b a" differ.
    """
    if len(tokens) < n:
        return _EMPTY
    th = token_hashes(tokens)
    m = len(th) - n + 1
    acc = np.zeros(m, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for k in range(n):
            acc = acc * _MULT + th[k : k + m]
    return np.unique(acc)


def ngram_hashes(text: str, n: int = NGRAM_SIZE) -> np.ndarray:
    """Distinct 6-gram hashes (sorted uint64) of a text."""
    return ngram_hashes_of_tokens(tokenize(text), n)


def ngram_sequence(tokens: Sequence[str], n: int = NGRAM_SIZE) -> list[tuple[str, ...]]:
    """Every n-gram of a token sequence as a token tuple, in order, repeats kept: the spec's
    own representation (§5.1), which the reference (`cdr.spec`) and the quality measures use."""
    return [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]


def ngram_tuples(text: str, n: int = NGRAM_SIZE) -> set[tuple[str, ...]]:
    """Distinct 6-grams of a text as token tuples."""
    return set(ngram_sequence(tokenize(text), n))


def ngram_penalty(counts: np.ndarray | int, dtype: type | np.dtype = np.float32) -> np.ndarray:
    """`min(0.80, 0.15 × count)` (§5.2), elementwise, in `dtype`."""
    c = np.asarray(counts, dtype=dtype)
    return np.minimum(NGRAM_PENALTY_CAP, c * NGRAM_PENALTY_STEP).astype(dtype, copy=False)


class NgramIndex:
    """Per-fact distinct 6-gram hashes in CSR form, plus the inverted index hash -> facts.

    `offsets[i]:offsets[i+1]` slices `hashes` for fact i. The inverted index is the same pairs
    sorted by hash, searched with `np.searchsorted`, so it costs two arrays and no Python dict.
    """

    def __init__(self, offsets: np.ndarray, hashes: np.ndarray) -> None:
        self.offsets = np.ascontiguousarray(offsets, dtype=np.int64)
        self.hashes = np.ascontiguousarray(hashes, dtype=np.uint64)
        if self.offsets.ndim != 1 or len(self.offsets) < 1 or self.offsets[0] != 0:
            raise ValueError("offsets must be a 1-D array starting at 0")
        if self.offsets[-1] != len(self.hashes):
            raise ValueError("offsets[-1] must equal the number of hashes")
        fact_of = np.repeat(
            np.arange(self.n_facts, dtype=np.int64), np.diff(self.offsets).astype(np.int64)
        )
        order = np.argsort(self.hashes, kind="stable")
        self._sorted_hashes = self.hashes[order]
        self._sorted_facts = fact_of[order]

    @property
    def n_facts(self) -> int:
        return len(self.offsets) - 1

    @classmethod
    def from_hash_lists(cls, per_fact: Iterable[np.ndarray]) -> NgramIndex:
        arrays = [np.asarray(h, dtype=np.uint64) for h in per_fact]
        lengths = np.fromiter((len(a) for a in arrays), dtype=np.int64, count=len(arrays))
        offsets = np.zeros(len(arrays) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        hashes = np.concatenate(arrays) if arrays else _EMPTY
        return cls(offsets, hashes)

    @classmethod
    def from_texts(cls, texts: Iterable[str]) -> NgramIndex:
        return cls.from_hash_lists(ngram_hashes(t) for t in texts)

    def facts_holding(self, hashes: np.ndarray) -> np.ndarray:
        """Fact indices (with repetition, one per (hash, fact) pair) holding any of `hashes`."""
        hashes = np.asarray(hashes, dtype=np.uint64)
        if len(hashes) == 0 or len(self._sorted_hashes) == 0:
            return np.zeros(0, dtype=np.int64)
        lo = np.searchsorted(self._sorted_hashes, hashes, side="left")
        hi = np.searchsorted(self._sorted_hashes, hashes, side="right")
        hit = hi > lo
        if not hit.any():
            return np.zeros(0, dtype=np.int64)
        lo, hi = lo[hit], hi[hit]
        # Expand the [lo, hi) ranges into positions without a Python loop.
        lengths = hi - lo
        starts = np.repeat(lo - np.cumsum(lengths) + lengths, lengths)
        positions = starts + np.arange(lengths.sum())
        out: np.ndarray = self._sorted_facts[positions]
        return out

    def count_in(self, blacklist: np.ndarray) -> np.ndarray:
        """Per-fact count of distinct 6-grams in `blacklist` (a full recount, O(B log M))."""
        counts = np.zeros(self.n_facts, dtype=np.int32)
        np.add.at(counts, self.facts_holding(np.unique(np.asarray(blacklist, np.uint64))), 1)
        return counts


class NgramBlacklist:
    """A session's blacklist of 6-gram hashes, with per-fact counts kept incrementally.

    `add_text` costs O(new 6-grams × log M): only 6-grams not already blacklisted touch the
    counts, so a fact's count stays "distinct blacklisted 6-grams it holds".
    """

    def __init__(self, index: NgramIndex | None = None, hashes: Iterable[int] = ()) -> None:
        self.index = index
        self._set: set[int] = set()
        self.counts = np.zeros(index.n_facts if index else 0, dtype=np.int32)
        initial = np.fromiter((int(h) for h in hashes), dtype=np.uint64)
        if len(initial):
            self.add_hashes(initial)

    def __len__(self) -> int:
        return len(self._set)

    def __contains__(self, h: int) -> bool:
        return int(h) in self._set

    def add_text(self, text: str) -> int:
        """Blacklist the 6-grams of a window's output; returns how many were new."""
        return self.add_hashes(ngram_hashes(text))

    def add_hashes(self, hashes: np.ndarray) -> int:
        fresh = [h for h in np.unique(np.asarray(hashes, dtype=np.uint64)).tolist()
                 if h not in self._set]
        if not fresh:
            return 0
        self._set.update(fresh)
        if self.index is not None:
            np.add.at(self.counts, self.index.facts_holding(np.array(fresh, np.uint64)), 1)
        return len(fresh)

    def as_array(self) -> np.ndarray:
        """Sorted hashes, for serialisation."""
        return np.array(sorted(self._set), dtype=np.uint64)

    def bind(self, index: NgramIndex) -> NgramBlacklist:
        """A copy of this blacklist with counts computed over `index` (e.g. after loading)."""
        bound = NgramBlacklist(index)
        bound._set = set(self._set)
        bound.counts = index.count_in(self.as_array())
        return bound

    def fresh_share(self, text: str) -> float:
        """Share of the distinct 6-grams of `text` not yet blacklisted (1.0 for short text)."""
        hashes = ngram_hashes(text).tolist()
        if not hashes:
            return 1.0
        return 1.0 - sum(1 for h in hashes if h in self._set) / len(hashes)
