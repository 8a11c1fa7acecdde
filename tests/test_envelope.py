"""Phase 3 packing, the Residual Task Anchor, the prompt round trip and the extractive writer."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cdr.coverage import SubQuery
from cdr.errors import InvalidInputError
from cdr.ranking import rank
from cdr.text.prompt_format import PlanSection, parse_prompt
from cdr.text.tokens import count_tokens
from cdr.window.envelope import (
    FACT_FRAMING_TOKENS,
    Budget,
    first_and_last_layout,
    greedy_pack,
    make_budget,
    pack,
    residual_anchor,
)
from cdr.window.prompt import build_user_prompt
from cdr.writers.extractive import ExtractiveWriter


def plain_greedy(costs, budget):
    chosen, left = [], budget
    for i, c in enumerate(costs):
        if c <= left:
            chosen.append(i)
            left -= c
    return chosen


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 300), max_size=60), st.integers(0, 2000))
def test_greedy_pack_equals_plain_greedy(costs, budget):
    got = greedy_pack(np.array(costs), budget).tolist()
    assert got == plain_greedy(costs, budget)
    assert sum(costs[i] for i in got) <= budget


def test_pack_skips_a_fact_that_does_not_fit_and_continues():
    assert greedy_pack(np.array([50, 80, 30, 40]), 100).tolist() == [0, 2]
    assert greedy_pack(np.array([50, 80, 30, 20]), 100).tolist() == [0, 2, 3]


def test_first_and_last_layout():
    assert first_and_last_layout(5).tolist() == [0, 2, 4, 3, 1]
    assert first_and_last_layout(4).tolist() == [0, 2, 3, 1]
    assert first_and_last_layout(0).tolist() == []


def test_budget_arithmetic_and_errors():
    b = make_budget(1000, "system prompt", "Task: x", 200)
    assert b.envelope == 1000 - count_tokens("system prompt") - count_tokens("Task: x") - 200
    with pytest.raises(InvalidInputError, match="no room"):
        make_budget(100, "s", "t", 99)
    with pytest.raises(InvalidInputError):
        make_budget(0, "s", "t", 10)


def test_anchor_is_forward_looking_and_constant_size():
    sqs = [SubQuery("a", "Creating tasks"), SubQuery("b", "Timeouts")]
    assert residual_anchor(sqs) == "Remaining sections to complete: Creating tasks, Timeouts"
    assert len(residual_anchor(sqs[1:])) < len(residual_anchor(sqs))
    assert "none" in residual_anchor([])


def test_pack_envelope_stats_and_etag():
    emb = np.eye(4, dtype=np.float32)
    r = rank(emb, np.array([0.9, 0.8, 0.7, 0.6], np.float32), min_relevance=0.0)
    ids = [f"f{i}" for i in r.indices]
    tokens = np.array([10, 10, 10, 500])
    env = pack(r, ids, tokens, Budget(200, 0, 0, 100), "anchor")
    assert sorted(env.fact_ids) == ["f0", "f1", "f2"]
    assert env.fact_ids[0] == "f0" and env.fact_ids[-1] == "f1"  # strongest at both ends
    assert env.skipped == 1
    assert env.used_tokens == 3 * (10 + FACT_FRAMING_TOKENS)
    assert env.saturation == pytest.approx(env.used_tokens / 100)
    same = pack(r, ids, tokens, Budget(200, 0, 0, 100), "other anchor")
    assert same.etag == env.etag
    assert env.min_novelty_ratio == 1.0 and env.mean_novelty_ratio == 1.0


def test_prompt_round_trip_and_extractive_writer():
    plan = [PlanSection("Creating tasks", 30, ("F2", "F1")), PlanSection("Timeouts", 500, ("F3",))]
    facts = [("F1", "Tasks > Create", "asyncio.create_task wraps a coroutine in a Task."),
             ("F2", "Tasks", "A Task schedules a coroutine on the event loop.\nSecond line."),
             ("F3", "Timeouts", "asyncio.timeout() cancels work that runs too long.")]
    text = build_user_prompt("Guide to asyncio", residual_anchor([]), plan, facts)
    parsed_plan, parsed_facts = parse_prompt(text)
    assert parsed_plan == plan
    assert parsed_facts == {ref: content for ref, _, content in facts}
    w = ExtractiveWriter(min_section_words=1)
    pieces: list[str] = []
    res = w.generate([{"role": "system", "content": "s"}, {"role": "user", "content": text}],
                     500, on_delta=pieces.append)
    assert "".join(pieces) == res.text
    assert res.text.startswith("## Creating tasks\n\nA Task schedules")
    # the 30-word target of section 1 is met by F2 (11 words)? no: 11 < 30, so F1 follows
    assert "asyncio.create_task" in res.text
    assert res.text.index("## Timeouts") > res.text.index("asyncio.create_task")
    assert res.finish_reason == "stop"
    tight = w.generate([{"role": "user", "content": text}], 20)
    assert count_tokens(tight.text) <= 20 and tight.finish_reason == "length"


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 300), st.integers(0, 60)), min_size=1, max_size=60),
       st.integers(0, 3000), st.one_of(st.none(), st.integers(1, 30)))
def test_pack_with_counted_costs_is_the_greedy_packing_of_those_costs(facts, budget, max_facts):
    """With `costs_of`, packing asks only for the costs of facts it takes, yet ends with the
    greedy packing of the whole costs (text + framing + label), within the budget — as long
    as a label costs at least the default framing."""
    text = np.array([t for t, _ in facts], dtype=np.int64)
    whole = text + FACT_FRAMING_TOKENS + np.array([extra for _, extra in facts], dtype=np.int64)
    emb = np.eye(len(facts), dtype=np.float32)
    rel = np.linspace(0.99, 0.6, len(facts)).astype(np.float32)
    r = rank(emb, rel, min_relevance=0.0, rows=np.arange(len(facts)) + 1000)
    asked: list[int] = []

    def costs_of(rows: np.ndarray) -> np.ndarray:
        asked.extend(int(x) for x in rows)
        return whole[rows - 1000]

    env = pack(r, [f"f{i}" for i in r.indices], text[r.indices - 1000], Budget(10_000, 0, 0,
               10_000 - budget), "a", max_facts, costs_of)
    expected = plain_greedy(whole[r.indices - 1000].tolist(), budget)[:max_facts]
    assert sorted(env.ranking.indices.tolist()) == sorted(r.indices[expected].tolist())
    assert env.used_tokens == int(whole[r.indices[expected] - 1000].sum()) <= budget
    assert set(env.ranking.indices.tolist()) <= set(asked)  # every packed fact was counted
    assert len(asked) == len(set(asked))  # …once


def test_a_fact_costs_its_label_and_its_plan_ref():
    """A fact's cost grows with its label: a 300-character title in a section path is paid
    for in the budget (the prompt lists the label in front of the fact)."""
    from cdr.window.prompt import fact_prompt_tokens

    content = "A Task schedules a coroutine on the event loop."
    short, long = fact_prompt_tokens([("Tasks", content), ("T " * 150 + "> Tasks", content)])
    block = build_user_prompt("t", "a", [PlanSection("S", 40, ("F1",))],
                              [("F1", "Tasks", content)])
    bare = build_user_prompt("t", "a", [PlanSection("S", 40, ())], [])
    assert short >= count_tokens(block) - count_tokens(bare) > count_tokens(content)
    assert long - short >= 100  # 150 more words of label


def test_budget_counts_the_chat_framing_and_a_reserve():
    from cdr.writers.base import estimate_prompt_tokens

    b = make_budget(1000, "system prompt", "Task: x", 200, messages=2, reserve=7)
    messages = [{"role": "system", "content": "system prompt"},
                {"role": "user", "content": "Task: x"}]
    assert b.system + b.task == estimate_prompt_tokens(messages) + 7
    assert b.envelope == 1000 - 200 - estimate_prompt_tokens(messages) - 7
