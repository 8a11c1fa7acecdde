"""A window asks only for what its envelope can ground (the length contract with a model
writer, `cdr.window.length.grounded_words`): the asked words never exceed the envelope's cap,
an envelope too thin for a minimal section is not written (the run ends `ckf-exhausted`), a
full envelope keeps its planned budget, and the contract's arithmetic is unchanged.
Structure only: no exact text."""

from __future__ import annotations

import math
import re

import jsonschema
import pytest
from hypothesis import given
from hypothesis import strategies as st

from cdr.ckf import CKF
from cdr.errors import InvalidInputError
from cdr.report import build_run, explain_exit
from cdr.session import CKF_EXHAUSTED
from cdr.text.prompt_format import PlanSection
from cdr.text.tokens import LLM_WORDS_PER_TOKEN
from cdr.trace import TRACE_SCHEMA, build_trace
from cdr.window.fit import MIN_SECTION_WORDS
from cdr.window.length import (
    GROUNDED_WORDS_PER_FACT_WORD,
    envelope_words,
    grounded_budget,
    grounded_words,
    section_shares,
    too_thin,
    window_budget,
)
from cdr.window.loop import GenerationConfig, Generator, PreparedWindow
from cdr.window.prompt import fit_plan
from cdr.writers import get_writer
from tests.conftest import BUILTIN_TYPES_OUTLINE, BUILTIN_TYPES_TASK
from tests.prose_writer import ProseWriter

GEN_TOKENS = 320  # the LLM benchmark's window: ⌊320 · 0.577⌋ = 184 words
_ASKED = re.compile(r"About (\d+) words in all")


@pytest.fixture(scope="module")
def types_ckf(types_ckf_path) -> CKF:
    return CKF.open(types_ckf_path)


def _generator(ckf: CKF, writer=None, **cfg) -> Generator:
    opts = {"max_windows": 5, "words": 1200, "generation_tokens": GEN_TOKENS,
            "length": "contract", **cfg}
    return Generator(ckf, writer or ProseWriter(), GenerationConfig(**opts))


def _asked(prepared: PreparedWindow) -> int:
    return sum(p.target_words for p in prepared.plan)


# ------------------------------------------------------------------------ the arithmetic


def test_the_cap_follows_the_ratio_and_names_a_thin_envelope():
    assert GROUNDED_WORDS_PER_FACT_WORD == 0.4  # bench/results/thin_envelope.md
    # listxattr's Window 2: one fact of 93 words cannot ground a 40-word section
    assert grounded_words(93) == math.floor(0.4 * 93) == 37 and too_thin(37)
    assert not too_thin(MIN_SECTION_WORDS) and too_thin(MIN_SECTION_WORDS - 1)
    assert grounded_words(0) == 0 and grounded_words(1000) == 400
    assert envelope_words(["two words", "  three more words "]) == 5
    assert grounded_budget(184, 37) == 37 and grounded_budget(184, 400) == 184
    assert grounded_budget(184, 0) == 1  # as window_budget: never planned for nothing
    with pytest.raises(InvalidInputError):
        grounded_words(-1)
    with pytest.raises(InvalidInputError):
        grounded_words(10, 0.0)
    with pytest.raises(InvalidInputError):
        grounded_words(10, math.nan)


@given(st.integers(0, 20000), st.integers(0, 20000), st.integers(1, 4096),
       st.integers(0, 5000),
       st.lists(st.integers(MIN_SECTION_WORDS, 2000), min_size=1, max_size=8))
def test_the_asked_words_never_exceed_the_cap_and_the_shares_still_add_up(
        asked: int, delivered: int, tokens: int, fact_words: int, targets: list[int]):
    budget = window_budget(max(asked, 1), delivered, tokens, LLM_WORDS_PER_TOKEN)
    grounds = grounded_words(fact_words)
    capped = grounded_budget(budget, grounds)
    assert capped <= budget and capped <= max(grounds, 1)
    plan = [PlanSection(f"S{i}", t, ("F1",)) for i, t in enumerate(targets)]
    kept = fit_plan(plan, capped)
    assert sum(p.target_words for p in kept) <= capped
    if grounds >= budget:  # a full envelope: the planned budget, unchanged
        assert kept == fit_plan(plan, budget)
    # the cap changes what one window is asked, not the contract's split of the owed words
    owed = max(0, max(asked, 1) - delivered)
    assert sum(section_shares(targets, owed)) == owed


# ------------------------------------------------------------------------ the loop


def test_a_one_fact_envelope_is_not_written_and_ends_ckf_exhausted(types_ckf):
    writer = ProseWriter()
    gen = _generator(types_ckf, writer, max_envelope_facts=1)
    session = gen.start(BUILTIN_TYPES_TASK, BUILTIN_TYPES_OUTLINE)
    prepared = gen.prepare(session)
    assert len(prepared.envelope) == 1
    fact_words = envelope_words(f.content for f in prepared.facts)
    assert fact_words < 100  # the precondition: one fact of this CKF is a short one
    assert prepared.grounds_words == grounded_words(fact_words) < MIN_SECTION_WORDS
    assert prepared.too_thin and gen.ends_unwritten(session, prepared)
    event = gen.write_and_complete(session, prepared)
    assert event.output == "" and event.status == CKF_EXHAUSTED and writer.prompts == []
    trace = build_trace(session, [event])
    jsonschema.validate(trace, TRACE_SCHEMA)
    assert trace["windows"][0]["grounds_words"] == prepared.grounds_words
    assert trace["status"] == CKF_EXHAUSTED
    assert "could ground about" in explain_exit(build_run(trace, "run"))  # the run report
    # a stored envelope (the gateway's sidecar) keeps the cap
    back = PreparedWindow.from_dict(prepared.to_dict())
    assert back.grounds_words == prepared.grounds_words and back.too_thin


def test_a_thin_envelope_is_asked_for_no_more_than_it_grounds(types_ckf):
    budget = math.floor(GEN_TOKENS * LLM_WORDS_PER_TOKEN)
    seen = []
    for k in range(2, 12):
        writer = ProseWriter()
        gen = _generator(types_ckf, writer, max_envelope_facts=k)
        session = gen.start(BUILTIN_TYPES_TASK, BUILTIN_TYPES_OUTLINE)
        prepared = gen.prepare(session)
        grounds = prepared.grounds_words
        assert grounds == grounded_words(envelope_words(f.content for f in prepared.facts))
        if prepared.too_thin:
            continue
        assert _asked(prepared) <= min(grounds, budget)
        event = gen.write_and_complete(session, prepared)
        assert event.output and writer.prompts
        (said,) = _ASKED.findall(writer.prompts[0])
        assert int(said) <= grounds
        if grounds < budget:
            seen.append(k)
    assert seen, "no envelope size gave a written window below the budget"


def test_a_full_envelope_keeps_its_planned_budget(types_ckf, monkeypatch):
    gen = _generator(types_ckf)
    session = gen.start(BUILTIN_TYPES_TASK, BUILTIN_TYPES_OUTLINE)
    capped = gen.prepare(session)
    budget = math.floor(GEN_TOKENS * LLM_WORDS_PER_TOKEN)
    assert capped.grounds_words >= budget and not capped.too_thin
    # the same window with no cap at all plans exactly the same sections and words
    monkeypatch.setattr("cdr.window.loop.grounded_words",
                        lambda w: math.floor(1e9 * w))
    uncapped = _generator(types_ckf).prepare(session)
    assert [(p.title, p.target_words) for p in uncapped.plan] == [
        (p.title, p.target_words) for p in capped.plan]
    assert _asked(capped) <= budget


def test_no_cap_without_the_contract_or_for_a_writer_that_pastes_facts(types_ckf):
    spec = Generator(types_ckf, ProseWriter(),
                     GenerationConfig(max_windows=5, words=1200, max_envelope_facts=1))
    session = spec.start(BUILTIN_TYPES_TASK, BUILTIN_TYPES_OUTLINE)
    prepared = spec.prepare(session)
    assert prepared.grounds_words is None and not prepared.too_thin
    assert "grounds_words" not in prepared.to_dict()
    paster = _generator(types_ckf, get_writer("extractive"), max_envelope_facts=1)
    session = paster.start(BUILTIN_TYPES_TASK, BUILTIN_TYPES_OUTLINE)
    assert paster.prepare(session).grounds_words is None
