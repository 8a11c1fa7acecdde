"""Stage 8 on real outputs of the reference model (tests/data/llm_outputs/).

Each `<name>.md` is what Qwen2.5-Coder-1.5B-Instruct wrote for one window (temperature 0,
seed 42), before any truncation cut; `<name>.json` holds the exact prompt that produced it, the
window's plan, the task's sub-queries and the finish reason (regenerate with
`bench/llm_prompts.py --save tests/data/llm_outputs`). The model is not needed here: only the
embedder, which reads the text back exactly as the loop does.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from cdr.coverage import SubQuery
from cdr.text.markdown import keep_complete, parse_blocks
from cdr.window.dpe import is_chatter, normalise_heading, split_paragraphs, verify_text, word_count

DATA = Path(__file__).parent / "data" / "llm_outputs"
FIXTURES = sorted(DATA.glob("*.md"))


def load(path: Path) -> tuple[str, dict]:
    return path.read_text(encoding="utf-8"), json.loads(path.with_suffix(".json").read_text())


@pytest.fixture(scope="module")
def embedder():
    from cdr.retrieval.embed import default_embedder

    return default_embedder()


def stage8(text: str, meta: dict, embedder):
    sqs = [SubQuery(s["id"], s["text"], s["expected_words"]) for s in meta["sub_queries"]]
    emb = embedder.encode([s.text for s in sqs])
    return sqs, verify_text(text, sqs, emb, embedder.encode)


def test_fixtures_exist_with_their_prompts():
    assert len(FIXTURES) >= 3
    for path in FIXTURES:
        text, meta = load(path)
        assert text.strip() and meta["messages"][-1]["role"] == "user"
        assert meta["finish_reason"] in ("stop", "length")


@pytest.mark.parametrize("path", FIXTURES, ids=[p.stem for p in FIXTURES])
def test_stage8_contracts_on_real_output(path, embedder):
    text, meta = load(path)
    kept = keep_complete(text)[0] if meta["finish_reason"] == "length" else text
    sqs, report = stage8(kept, meta, embedder)
    paragraphs = split_paragraphs(kept, [s.text for s in sqs])
    prose_words = sum(word_count(p) for _, p in paragraphs)
    # Every prose word is accounted for exactly once; code blocks are not prose.
    assert sum(report.words.values()) + report.unattributed_words == prose_words
    code_words = sum(word_count(b.text) for b in parse_blocks(kept) if b.kind == "code")
    assert prose_words + code_words <= word_count(kept)
    # Chatter earns nothing.
    for (_, body), owner in zip(paragraphs, report.attribution, strict=True):
        if is_chatter(body):
            assert owner is None
    # A paragraph under a heading that is exactly a planned title belongs to that sub-query.
    by_title = {normalise_heading(s.text): s.id for s in sqs}
    for (heading, body), owner in zip(paragraphs, report.attribution, strict=True):
        if heading and normalise_heading(heading) in by_title and not is_chatter(body):
            assert owner == by_title[normalise_heading(heading)]
    assert all(0 < d <= 0.9 for d in report.addressed.values())


@pytest.mark.parametrize("path", [p for p in FIXTURES if load(p)[1]["finish_reason"] == "length"],
                         ids=lambda p: p.stem)
def test_truncated_output_credits_only_what_is_kept(path, embedder):
    text, meta = load(path)
    kept, tail = keep_complete(text)
    assert tail.strip() and kept.strip()
    assert text.startswith(kept.rstrip())
    _, whole = stage8(text, meta, embedder)
    _, part = stage8(kept, meta, embedder)
    for sq_id, words in part.words.items():
        assert words <= whole.words.get(sq_id, 0)
    assert sum(part.words.values()) < sum(whole.words.values()) + 1


def test_guided_prompt_writes_the_planned_headings():
    """The prompt the CLI sends gets the planned headings from the model, in order."""
    guided = [p for p in FIXTURES if "-guided-w" in p.name]
    assert guided
    hits = 0
    for path in guided:
        text, meta = load(path)
        planned = [normalise_heading(s["title"]) for s in meta["plan"]]
        heads = [normalise_heading(b.text) for b in parse_blocks(text) if b.kind == "heading"]
        hits += sum(1 for h in planned if h in heads)
    assert hits >= len(guided)  # at least one planned heading per window on average


def test_real_window_with_subheadings_and_code(embedder):
    """types-guided-w1: the model wrote "## Numeric types" as asked, then invented "###
    Integers" / "### Floating Point Numbers" / "### Complex Numbers" subsections with code
    examples, and hit the token limit inside the last one."""
    text, meta = load(DATA / "types-guided-w1.md")
    assert meta["finish_reason"] == "length"
    kept, tail = keep_complete(text)
    assert "### Complex Numbers" in tail and "### Complex Numbers" not in kept
    assert kept.rstrip().endswith("```")  # the last complete block is a code example
    sqs, report = stage8(kept, meta, embedder)
    numeric = next(s.id for s in sqs if s.text == "Numeric types")
    # Every prose paragraph sits under the planned heading (its subsections included).
    assert set(report.attribution) == {numeric}
    code = sum(word_count(b.text) for b in parse_blocks(kept) if b.kind == "code")
    assert code > 0 and report.words[numeric] == sum(
        word_count(p) for _, p in split_paragraphs(kept))
    assert 0 < report.addressed[numeric] < 0.9  # a partial pass: the section stays open


def test_depth_from_real_window_is_spread_over_the_planned_sections(embedder):
    path = next(p for p in FIXTURES if "-guided-w1" in p.name)
    text, meta = load(path)
    kept = keep_complete(text)[0] if meta["finish_reason"] == "length" else text
    sqs, report = stage8(kept, meta, embedder)
    planned = {s.id for s in sqs if normalise_heading(s.text) in
               {normalise_heading(p["title"]) for p in meta["plan"]}}
    assert planned & set(report.addressed)
    assert np.isclose(sum(report.words.values()) + report.unattributed_words,
                      sum(word_count(p) for _, p in split_paragraphs(kept, [s.text for s in sqs])))


@pytest.mark.parametrize(("text", "chatter"), [
    ("Sure! Here is the next part of the guide.", True),
    ("Certainly. Below is the continuation.", True),
    ("Here is the requested section on sequences:", True),
    ("I hope this helps you understand dictionaries.", True),
    ("Here's an example of a sequence pattern:", False),
    ("Here are the key methods of str: split and join.", False),
    ("Surely the most used type is the list.", False),
    ("In this section we compare lists and tuples.", False),
])
def test_chatter(text, chatter):
    assert is_chatter(text) is chatter


def test_real_window_lead_in_to_an_example_is_content(embedder):
    """exceptions-guided-w1: "Here is a simple example of how to use the `try` statement:" is
    the text introducing a code example, not chatter; it stays with its section."""
    text, meta = load(DATA / "exceptions-guided-w1.md")
    kept, _ = keep_complete(text)
    sqs, report = stage8(kept, meta, embedder)
    try_id = next(s.id for s in sqs if s.text == "The try statement")
    paragraphs = split_paragraphs(kept, [s.text for s in sqs])
    lead = [i for i, (_, p) in enumerate(paragraphs) if p.startswith("Here is a simple example")]
    assert lead and not is_chatter(paragraphs[lead[0]][1])
    assert report.attribution == [try_id] * len(paragraphs)
    assert report.unattributed_words == 0
