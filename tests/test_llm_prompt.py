"""The LLM-ready window prompt, budget-fitted plans, and Exit 3 before the writer runs."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from cdr.ckf import CKF
from cdr.text.prompt_format import PlanSection, parse_prompt
from cdr.window.loop import GenerationConfig, Generator, stale_envelope
from cdr.window.prompt import build_user_prompt, fit_plan
from cdr.writers import get_writer

PLAN = [PlanSection("Creating indexes", 300, ("F1", "F3")),
        PlanSection("Index types", 300, ("F2",)),
        PlanSection("Maintenance", 300, ("F4",))]
FACTS = [("F1", "Doc > Create", "CREATE INDEX builds an index."),
         ("F2", "Doc > Types", "B-tree is the default type."),
         ("F3", "Doc > Create", "CONCURRENTLY avoids locking writes."),
         ("F4", "Doc > Vacuum", "REINDEX rebuilds an index."),
         ("F5", "Doc > Other", "Unplanned fact.")]


def test_fit_plan_keeps_what_the_budget_covers():
    assert [s.title for s in fit_plan(PLAN, 700)] == ["Creating indexes", "Index types"]
    assert [s.target_words for s in fit_plan(PLAN, 700)] == [300, 300]
    assert fit_plan(PLAN, 100) == [PlanSection("Creating indexes", 100, ("F1", "F3"), whole=False)]
    # 760 words: the third section would get 160 of 300 (more than half): it is trimmed in.
    assert [s.target_words for s in fit_plan(PLAN, 760)] == [300, 300, 160]
    assert fit_plan([], 500) == []


@given(st.lists(st.integers(1, 900), min_size=1, max_size=8), st.integers(1, 3000))
def test_fit_plan_properties(targets, budget):
    plan = [PlanSection(f"S{i}", t, ("F1",)) for i, t in enumerate(targets)]
    kept = fit_plan(plan, budget)
    assert kept and kept[0].title == "S0"  # never an empty plan
    assert [s.title for s in kept] == [s.title for s in plan[: len(kept)]]  # a prefix, in order
    assert sum(s.target_words for s in kept) <= max(budget, 1)
    assert all(k.target_words <= p.target_words for k, p in zip(kept, plan, strict=False))


def test_prompt_names_headings_budget_and_continuation_and_round_trips():
    plan = fit_plan(PLAN, 700)
    text = build_user_prompt("Write a guide to indexes", "Remaining sections to complete: x",
                             plan, FACTS, continued=["Index types"], first_window=False)
    assert '"## Creating indexes", "## Index types". No other headings.' in text
    assert "About 600 words in all" in text
    assert "no introduction" in text and "already partly written" in text
    assert '"Index types" was begun earlier' in text
    assert "Unplanned fact." not in text and "REINDEX" not in text  # only cited facts
    parsed_plan, facts = parse_prompt(text)
    assert parsed_plan == plan
    assert facts == {"F1": "CREATE INDEX builds an index.", "F2": "B-tree is the default type.",
                     "F3": "CONCURRENTLY avoids locking writes."}
    first = build_user_prompt("T", "A", plan, FACTS)
    assert "already partly written" not in first and "begun earlier" not in first


class CountingWriter:
    """The real extractive writer, counting its calls."""

    name = "extractive"  # it is the extractive writer, with a call counter
    pastes_facts = True

    def __init__(self) -> None:
        self.inner = get_writer("extractive")
        self.calls = 0

    def generate(self, messages, max_tokens, *, on_delta=None):
        self.calls += 1
        return self.inner.generate(messages, max_tokens, on_delta=on_delta)


def test_exit3_on_the_prepared_envelope_skips_the_writer(tiny_ckf_path: Path):
    writer = CountingWriter()
    gen = Generator(CKF.open(tiny_ckf_path), writer, GenerationConfig(max_windows=10,
                                                                       words=3000))
    task = "Write a guide to the pass statement and truth value testing"
    session = gen.start(task, "The pass statement\nTruth value testing")
    events = list(gen.run(task, session=session))
    last = events[-1]
    assert last.status == "ckf-exhausted"
    assert last.headers["CRP-Context-Mode"] == "ckf-exhausted"
    for e in events:
        # Whatever the writer wrote came from a fresh envelope; a stale one was never sent.
        if stale_envelope(e.prepared.envelope):
            assert e.output == "" and e is last
    written = [e for e in events if e.output]
    assert writer.calls == len(written)
    # On this two-document CKF Window 2's envelope is already exhausted (mean novelty ratio
    # ~0.12 < 0.15): the loop stops before writing it, not after.
    assert len(events) == 2 and stale_envelope(last.prepared.envelope) and last.output == ""
    assert writer.calls == 1
