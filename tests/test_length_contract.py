"""The length contract (`length: "contract"`, cdr.window.length): its arithmetic, the plan's
allocation of the owed words, which sections count as written whole, the stop on the band,
and the session state it keeps. Structure only: exact numbers from the formulas."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from cdr.coverage import SubQuery
from cdr.errors import InvalidInputError
from cdr.options import PROFILES, SessionOptions
from cdr.session import TASK_COMPLETE, Session
from cdr.text.prompt_format import PlanSection
from cdr.text.self_repeat import REPETITION
from cdr.text.tokens import LLM_WORDS_PER_TOKEN
from cdr.window.dpe import DpeReport
from cdr.window.fit import WORDS_PER_TOKEN
from cdr.window.length import (
    contract_met,
    section_shares,
    window_budget,
    words_owed,
    writer_words_per_token,
)
from cdr.window.loop import written_whole
from cdr.window.prompt import fit_plan
from cdr.writers import get_writer


def test_owed_and_window_budget_follow_the_formulas():
    assert words_owed(2000, 0) == 2000
    assert words_owed(2000, 1500) == 500
    assert words_owed(2000, 2600) == 0  # never negative
    # ⌊G · w⌋ when more is owed than the window carries
    assert window_budget(5000, 0, 1024, 0.577) == math.floor(1024 * 0.577) == 590
    assert window_budget(5000, 0, 1536, 0.70) == math.floor(1536 * 0.70)
    # the owed words when fewer are owed
    assert window_budget(5000, 4700, 1024, 0.577) == 300
    # nothing owed still plans one word, never zero
    assert window_budget(2000, 2100, 1024, 0.577) == 1
    with pytest.raises(InvalidInputError):
        window_budget(2000, 0, 0, 0.577)
    with pytest.raises(InvalidInputError):
        window_budget(2000, 0, 1024, 0.0)


def test_contract_stops_at_the_lower_edge_of_the_band():
    assert not contract_met(2000, 1699)
    assert contract_met(2000, 1700)  # ⌈0.85 · 2000⌉, exactly, not 1700.0000001
    assert contract_met(2000, 2000)
    assert contract_met(2000, 9000)  # a window that ran long cannot be un-written
    assert not contract_met(5000, 4249) and contract_met(5000, 4250)
    assert contract_met(3, math.ceil(Fraction(3) * Fraction(85, 100)))
    with pytest.raises(InvalidInputError):
        contract_met(0, 0)


def test_section_shares_exact_cases():
    assert section_shares([300, 300, 300], 900) == [300, 300, 300]
    # an earlier section came out short: the owed words spread in proportion
    assert section_shares([300, 300], 900) == [450, 450]
    assert section_shares([100, 300], 1000) == [250, 750]
    # largest remainders: 1000 / 3 = 333.3 each, the first gets the extra word
    assert section_shares([1, 1, 1], 1000) == [334, 333, 333]
    assert section_shares([0, 0], 10) == [5, 5]
    assert section_shares([], 10) == []
    with pytest.raises(InvalidInputError):
        section_shares([10, -1], 10)
    with pytest.raises(InvalidInputError):
        section_shares([10], -1)


@given(st.lists(st.integers(0, 5000), min_size=1, max_size=20), st.integers(0, 20000))
def test_section_shares_sum_to_the_owed_words_in_proportion(remaining: list[int], owed: int):
    shares = section_shares(remaining, owed)
    assert sum(shares) == owed and all(s >= 0 for s in shares)
    total = sum(remaining) or len(remaining)
    weights = remaining if sum(remaining) else [1] * len(remaining)
    for s, r in zip(shares, weights, strict=True):
        assert abs(s - Fraction(owed * r, total)) < 1  # each within one word of its share


def test_words_per_token_per_writer():
    assert writer_words_per_token(get_writer("extractive")) == WORDS_PER_TOKEN

    class Prose:
        pass

    class Measured:
        words_per_token = 0.61

    class Broken:
        words_per_token = -1.0

    assert writer_words_per_token(Prose()) == LLM_WORDS_PER_TOKEN
    assert writer_words_per_token(Measured()) == 0.61
    with pytest.raises(InvalidInputError):
        writer_words_per_token(Broken())


def test_fit_plan_marks_a_trimmed_section_not_whole():
    plan = [PlanSection("A", 400, ("F1",)), PlanSection("B", 400, ("F2",)),
            PlanSection("C", 400, ("F3",))]
    kept = fit_plan(plan, 590)
    # A whole (400), B trimmed to the 190 left (≥ half of 400? no: 190 < 200, so B waits)
    assert [(p.title, p.target_words, p.whole) for p in kept] == [("A", 400, True)]
    kept = fit_plan(plan, 620)
    assert [(p.title, p.target_words, p.whole) for p in kept] == [
        ("A", 400, True), ("B", 220, False)]
    # the first section is always planned, trimmed to the budget when it exceeds it
    kept = fit_plan([PlanSection("Long", 1333, ("F1",))], 590)
    assert [(p.target_words, p.whole) for p in kept] == [(590, False)]
    # trimmed by no more than a minimal section's 40 words counts as whole
    kept = fit_plan([PlanSection("Near", 620, ("F1",))], 590)
    assert kept[0].whole


def _session(options: SessionOptions, words: tuple[int, ...] = (700, 700, 600)) -> Session:
    rng = np.random.default_rng(0)
    sqs = [SubQuery(f"sq-{i + 1}", t, w) for i, (t, w) in enumerate(zip(
        ("Alpha", "Beta", "Gamma"), words, strict=True))]
    emb = rng.normal(size=(len(sqs), 8)).astype(np.float32)
    return Session.start("Write about letters", sqs, emb, rng.normal(size=8), "test-model",
                         max_windows=20, options=options)


def _report(attribution: list[str | None], words: dict[str, int]) -> DpeReport:
    return DpeReport(addressed={k: 0.5 for k in words}, words=words,
                     paragraphs=len(attribution), unattributed_words=0,
                     attribution=attribution, bodies=["text"] * len(attribution))


def test_written_whole_keeps_cut_and_trimmed_sections_open():
    s = _session(SessionOptions(length="contract"))
    plan = [PlanSection("Alpha", 300, ("F1",)), PlanSection("Beta", 200, ("F2",)),
            PlanSection("Gamma", 100, ("F3",), whole=False)]
    report = _report(["sq-1", "sq-2", "sq-3"], {"sq-1": 280, "sq-2": 190, "sq-3": 90})
    # stopped by itself: the whole sections are done, the trimmed one is not
    assert written_whole(s, plan, report, "stop") == ["sq-1", "sq-2"]
    # cut by the token limit while writing Beta (its last attributed section)
    cut = _report(["sq-1", "sq-2", None], {"sq-1": 280, "sq-2": 120})
    assert written_whole(s, plan, cut, "length") == ["sq-1"]
    # stopped where the model began to loop (cdr.text.self_repeat): cut the same way
    assert written_whole(s, plan, cut, REPETITION) == ["sq-1"]
    # cut, but already past the words it was planned for: written (a small model that spends
    # the window on its first section is not asked to go on with it)
    long_cut = _report(["sq-1", "sq-1"], {"sq-1": 520})
    assert written_whole(s, plan, long_cut, "length") == ["sq-1"]
    # a planned section the window never reached is not done
    short = _report(["sq-1"], {"sq-1": 280})
    assert written_whole(s, plan, short, "stop") == ["sq-1"]


def test_contract_session_counts_words_and_stops_on_the_band():
    s = _session(SessionOptions(length="contract"))
    assert s.words_asked == 2000
    s.update_after_window({"sq-1": 0.9}, "w " * 1000, embedding_model_id="test-model",
                          finished=["sq-1"])
    assert s.words_written == 1000 and s.finished_ids == ["sq-1"]
    assert s.exit_reason(0.9) is None
    s.update_after_window({"sq-2": 0.5}, "w " * 699, embedding_model_id="test-model",
                          finished=["sq-2", "sq-1"])
    assert s.words_written == 1699 and s.finished_ids == ["sq-1", "sq-2"]
    assert s.exit_reason(0.9) is None
    s.update_after_window({"sq-3": 0.01}, "w", embedding_model_id="test-model")
    assert s.exit_reason(0.9) == TASK_COMPLETE  # 1700 of 2000: the band's lower edge
    # the state round-trips through storage; damaged state is refused
    back = Session.from_json(s.to_json())
    assert (back.words_written, back.finished_ids) == (1700, ["sq-1", "sq-2"])
    bad = s.to_dict() | {"finished_ids": ["sq-9"]}
    with pytest.raises(InvalidInputError, match="unknown sub-queries"):
        Session.from_dict(bad)
    with pytest.raises(InvalidInputError, match="words_written"):
        Session.from_dict(s.to_dict() | {"words_written": -3})
    with pytest.raises(InvalidInputError):
        s.update_after_window({}, "", embedding_model_id="test-model", finished=["sq-9"])


def test_open_sessions_store_and_stop_as_before():
    s = _session(SessionOptions())
    s.update_after_window({"sq-1": 0.9}, "w " * 5000, embedding_model_id="test-model",
                          finished=["sq-1"])
    assert s.words_written == 0 and s.finished_ids == []
    assert "words_written" not in s.to_dict() and "finished_ids" not in s.to_dict()
    assert s.exit_reason(0.9) is None


def test_focused_profile_keeps_the_contract():
    assert PROFILES["focused"].length == "contract"
    assert PROFILES["spec"].length == "open"

