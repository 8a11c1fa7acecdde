"""The n-gram guard's hashing, index and incremental counts against a plain set-based version."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from cdr.ngrams import (
    NgramBlacklist,
    NgramIndex,
    ngram_hashes,
    ngram_tuples,
    tokenize,
)

words = st.sampled_from(["a", "b", "c", "d", "e", "pod", "node", "über", "x1"])
texts = st.lists(words, max_size=30).map(" ".join)


def test_tokenizer_reading():
    assert tokenize("Hello, World! it's 3.11") == ["hello", "world", "it", "s", "3", "11"]


def test_hashes_are_stable_and_positional():
    a = ngram_hashes("one two three four five six")
    assert a.tolist() == ngram_hashes("ONE two, three four five six!").tolist()
    assert a.tolist() != ngram_hashes("two one three four five six").tolist()
    assert len(a) == 1 and int(a[0]) in ngram_hashes("one two three four five six seven")
    assert len(ngram_hashes("too short")) == 0


@settings(max_examples=100, deadline=None)
@given(st.lists(texts, min_size=1, max_size=12), st.lists(texts, max_size=4))
def test_incremental_counts_equal_set_counts(fact_texts, windows):
    idx = NgramIndex.from_texts(fact_texts)
    bl = NgramBlacklist(idx)
    seen: set[tuple[str, ...]] = set()
    for w in windows:
        bl.add_text(w)
        seen |= ngram_tuples(w)
        want = [len(ngram_tuples(t) & seen) for t in fact_texts]
        assert bl.counts.tolist() == want
        assert idx.count_in(bl.as_array()).tolist() == want
        assert [sum(int(h) in bl for h in ngram_hashes(t)) for t in fact_texts] == want
    assert len(bl) == len(seen)


def test_index_validation():
    import pytest

    with pytest.raises(ValueError):
        NgramIndex(np.array([1, 2]), np.zeros(2, np.uint64))
    with pytest.raises(ValueError):
        NgramIndex(np.array([0, 3]), np.zeros(2, np.uint64))
    empty = NgramIndex.from_texts([])
    assert empty.n_facts == 0
    assert NgramBlacklist(empty).add_text("a b c d e f g") == 2
