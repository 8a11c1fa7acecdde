"""Token counts (`cdr.text.tokens`) from bpe-openai's Rust extension loaded alone equal the
counts of the package's public API, refusals included, and the package still imports after."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cdr.text import tokens
from cdr.text.tokens import count_tokens, count_tokens_batch

TEXTS = ["", " ", "\t\n\r", "hello world", "héllo wörld 😀 \u2028", "a\u0000b",
         "<|endoftext|> is counted as text", "x" * 5000, "lone \ud800 surrogate",
         "def f(x):\n    return x ** 2  # 二乘\n", "Ünïcödé " * 300]


@pytest.fixture(scope="module")
def public():
    import bpe_openai

    return bpe_openai.get_encoding(tokens.TOKENIZER_NAME)


def test_the_extension_is_loaded_alone():
    assert not isinstance(tokens._tokenizer(), tokens._PublicEncoding)


def test_counts_are_the_public_api_s(public):
    from pydoc_data.topics import topics

    texts = TEXTS + [v[:2000] for v in list(topics.values())[:40]]
    expected = [len(public.encode_ordinary(t)) for t in texts]
    assert [count_tokens(t) for t in texts] == expected
    assert count_tokens_batch(texts).tolist() == expected
    assert count_tokens_batch([]).tolist() == []
    assert isinstance(tokens._PublicEncoding(), tokens._PublicEncoding)
    assert [len(tokens._PublicEncoding().encode(t)) for t in texts[:5]] == expected[:5]


@given(text=st.text(max_size=300))
def test_any_text_counts_as_the_public_api_says(public, text: str):
    assert count_tokens(text) == len(public.encode_ordinary(text))


def test_what_the_public_api_refuses_is_refused(public):
    with pytest.raises(ValueError, match="too long"):
        public.encode_ordinary("a" * tokens.MAX_TEXT_CHARS)
    with pytest.raises(ValueError, match="too long"):
        count_tokens("a" * tokens.MAX_TEXT_CHARS)
    many = "😀" * 210_000  # more tokens than the chunk limit, fewer characters than a million
    with pytest.raises(Exception) as theirs:
        public.encode_ordinary(many)
    with pytest.raises(type(theirs.value)):
        count_tokens(many)
