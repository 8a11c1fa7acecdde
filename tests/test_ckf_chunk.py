"""Blocks → facts: token bounds, sentence splits, merging of fragments, code kept whole."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cdr.ckf import (
    Block,
    ChunkConfig,
    chunk_blocks,
    fact_id,
    parse_markdown,
    split_sentences,
)
from cdr.errors import InvalidInputError
from cdr.text.tokens import count_tokens

WORDS = ["index", "table", "query", "planner", "vacuum", "tuple", "page", "lock", "row",
         "the", "a", "of", "scan", "heap", "btree", "cost", "commit", "snapshot", "value"]


def _sentence(words: list[str]) -> str:
    return " ".join([words[0].capitalize(), *words[1:]]) + "."


sentences = st.lists(st.sampled_from(WORDS), min_size=3, max_size=30).map(_sentence)
paragraphs = st.lists(sentences, min_size=1, max_size=40).map(" ".join)


def test_split_sentences_respects_abbreviations_and_quotes():
    text = ('Use e.g. a B-tree for this. It works, i.e. mostly. Dr. Smith said "Stop." Then '
            "3 rows remain! Why? Because.")
    assert split_sentences(text) == [
        "Use e.g. a B-tree for this.", "It works, i.e. mostly.", 'Dr. Smith said "Stop."',
        "Then 3 rows remain!", "Why?", "Because."]


def _numbered(paras: list[list[str]]) -> list[str]:
    """Paragraphs whose sentences are all distinct (a serial number in each), so no fact can
    be dropped as a duplicate and every word must survive chunking."""
    out, k = [], 0
    for sents in paras:
        numbered = []
        for sent in sents:
            numbered.append(sent[:-1] + f" n{k}.")
            k += 1
        out.append(" ".join(numbered))
    return out


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(sentences, min_size=1, max_size=40), min_size=1, max_size=6))
def test_prose_facts_are_bounded_and_lose_no_words(sentence_lists):
    cfg = ChunkConfig()
    paras = _numbered(sentence_lists)
    blocks = [Block(p, ("Sec",), f"line {k}") for k, p in enumerate(paras)]
    facts = chunk_blocks(blocks, cfg)
    for f in facts:
        # SPEC-009 bounds; prose may pass the soft target only by a sub-floor remnant
        assert cfg.min_tokens <= f.tokens <= cfg.target_tokens + cfg.min_tokens
        assert f.tokens == count_tokens(f.content)
        assert (f.section, f.is_code) == ("Sec", False)
    if sum(count_tokens(p) for p in paras) < cfg.min_tokens:
        assert facts == []  # below the floor even as a whole: nothing worth a fact
    else:
        assert " ".join(f.content for f in facts).split() == " ".join(paras).split()


@settings(max_examples=40, deadline=None)
@given(paragraphs)
def test_long_paragraph_splits_on_sentence_boundaries(para):
    cfg = ChunkConfig(target_tokens=60)
    facts = chunk_blocks([Block(para)], cfg)
    all_sentences = split_sentences(para)
    for f in facts:
        assert f.content.endswith(".")  # every part ends where a sentence ends
        # sentences are never cut in the middle (each here is well under the target)
        assert set(split_sentences(f.content)) <= set(all_sentences)


def test_exact_prose_split_is_balanced():
    sents = [f"The planner estimates the cost of candidate plan {i} before it chooses."
             for i in range(30)]
    facts = chunk_blocks([Block(" ".join(sents))], ChunkConfig(target_tokens=100))
    sizes = [f.tokens for f in facts]
    assert len(facts) == 5  # 30 × 14 tokens = 420 → the fewest parts under 100 tokens
    assert all(s <= 100 for s in sizes)
    assert max(sizes) - min(sizes) <= max(count_tokens(s) for s in sents)
    assert facts[0].content.split(". ")[0] + "." == sents[0]


def test_code_block_stays_whole_and_flagged():
    code = "\n".join(f"def f{i}(x):\n    return x * {i} + {i * 7}" for i in range(60))
    doc = parse_markdown(f"# Code\n\nSome intro prose about the functions below, in detail.\n\n"
                         f"```python\n{code}\n```\n")
    facts = chunk_blocks(doc.blocks)
    code_facts = [f for f in facts if f.is_code]
    assert count_tokens(code) > 200  # longer than the prose target, still one fact
    assert [f.content for f in code_facts] == [code]


def test_code_over_hard_bound_splits_at_line_boundaries():
    lines = [f"value_{i} = compute_something(argument_{i}, other_{i})" for i in range(600)]
    code = "\n".join(lines)
    facts = chunk_blocks([Block(code, is_code=True)])
    assert len(facts) > 1
    assert all(f.is_code and 10 <= f.tokens <= 2048 for f in facts)
    assert "\n".join(f.content for f in facts) == code


def test_tiny_fragments_merge_forward_and_backward():
    blocks = [
        Block("abs(x)", ("Builtins",)),
        Block("Return the absolute value of a number. The argument may be an integer or a "
              "floating point number.", ("Builtins",)),
        Block("New in version 3.10.", ("Builtins",)),
    ]
    facts = chunk_blocks(blocks)
    assert [f.content for f in facts] == [
        "abs(x)\nReturn the absolute value of a number. The argument may be an integer or a "
        "floating point number.\nNew in version 3.10."]


def test_fragments_do_not_merge_across_sections_and_sub_floor_text_is_dropped():
    blocks = [Block("Tiny.", ("A",)),
              Block("A paragraph in another section with plenty of words to stand alone.",
                    ("B",))]
    facts = chunk_blocks(blocks)
    assert [(f.section, f.content) for f in facts] == [
        ("B", "A paragraph in another section with plenty of words to stand alone.")]


def test_fact_id_is_whitespace_insensitive_and_content_sensitive():
    assert fact_id("a  b\nc") == fact_id("a b c")
    assert fact_id("a b c") != fact_id("a b d")
    assert len(fact_id("x")) == 32


def test_duplicate_paragraphs_in_one_document_kept_once():
    p = "Vacuum reclaims storage occupied by dead tuples and should run regularly."
    facts = chunk_blocks([Block(p), Block("Something different enough to be its own fact."),
                          Block(p)], ChunkConfig(merge_below=10))
    assert [f.content for f in facts].count(p) == 1


def test_chunk_config_validation():
    with pytest.raises(InvalidInputError, match="chunk sizes"):
        ChunkConfig(min_tokens=50, merge_below=10)


# ----------------------------------------------------------------------------- hostile sizes


def test_million_character_paragraph_without_sentence_breaks_loses_no_word():
    # Distinct words so no fact is a duplicate of another; over the token counter's 1M limit.
    words = [f"w{i}" for i in range(200_000)]
    text = " ".join(words)
    assert len(text) > 1_000_000
    facts = chunk_blocks([Block(text, ("Big",), "line 1")])
    assert all(f.tokens <= 200 for f in facts) and len(facts) > 100
    assert " ".join(f.content for f in facts).split() == words


def test_a_million_character_word_is_cut_by_characters_within_bounds():
    import random
    import string

    word = "".join(random.Random(7).choices(string.ascii_lowercase, k=1_000_001))
    facts = chunk_blocks([Block(word, (), "line 1")])
    assert facts and all(10 <= f.tokens <= 2048 for f in facts)
    assert all(count_tokens(f.content) == f.tokens for f in facts)
    assert "".join(f.content.replace("\n", "") for f in facts) == word


def test_long_code_line_without_spaces_is_split_within_the_hard_bound():
    line = "x=" + "ab" * 20_000
    facts = chunk_blocks([Block(f"def f():\n    {line}\n", (), "line 1", is_code=True)])
    assert facts and all(f.is_code and f.tokens <= 2048 for f in facts)
