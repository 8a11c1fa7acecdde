"""`plan: "packed"` (cdr.window.plan, `--profile focused`): a model writer's window plans only
open sections that own enough of its packed facts; the spec's planning is unchanged.

Structure only, no model: the built-in types knowledge base with a prose writer (the
extractive writer's text of the planned sections, cut as a model is at max_tokens), which
does not paste facts, so the loop plans, fits and prompts as for a model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from cdr.ckf import CKF
from cdr.errors import InvalidInputError
from cdr.options import PROFILES, SessionOptions, resolve_options
from cdr.session import IN_PROGRESS
from cdr.text.prompt_format import parse_prompt
from cdr.window.loop import GenerationConfig, Generator
from cdr.window.plan import PLAN_MIN_FACTS, heading_key, label_owners, owning_sections
from tests.conftest import BUILTIN_TYPES_OUTLINE, BUILTIN_TYPES_TASK
from tests.prose_writer import ProseWriter

# ------------------------------------------------------------------ the rule, exact cases


@pytest.mark.parametrize(("owner", "n", "k", "want"), [
    ([0, 0, 2, 2, 2, -1], 4, 2, [2, 0]),  # 1 and 3 own nothing: never; the most first
    ([0, 0, 2, 2, 2, -1], 4, 3, [2]),  # section 0 owns 2 < 3
    ([0, 0, 2, 2, 2, -1], 4, 4, [2]),  # none owns 4: those owning the most (3)
    ([1, 3, 1, 3], 4, 3, [1, 3]),  # a tie at the most: both, in outline order
    ([3], 4, 1, [3]),  # one fact, of the last section
    ([-1, -1], 3, 2, []),  # no fact owned by any section: none
    ([], 3, 2, []),  # an empty envelope
])
def test_owning_sections_exact_cases(owner: list[int], n: int, k: int, want: list[int]):
    assert owning_sections(np.asarray(owner, dtype=np.int64), n, k) == want


def test_owning_sections_refuses_a_threshold_below_one():
    with pytest.raises(ValueError, match="at least 1"):
        owning_sections(np.asarray([0]), 1, 0)


def test_a_fact_s_heading_names_its_section_deepest_first_without_numbers():
    titles = ["Module contents", "Basic customization", "Frozen instances"]
    sections = [
        "dataclasses — Data Classes > Module contents",
        "3. Data model > 3.3. Special method names > 3.3.1. Basic customization",
        "dataclasses > Module contents > Frozen instances",  # the deepest that is a title
        "dataclasses > Inheritance",  # no title: none
        "",  # no heading at all
        "MODULE   contents",  # case and spacing aside
    ]
    assert label_owners(sections, titles).tolist() == [0, 1, 2, -1, -1, 0]
    assert heading_key("3.3.1. Basic  Customization") == "basic customization"
    assert heading_key("2to3 tool") == "2to3 tool"  # a number that is part of the name stays


# ------------------------------------------------------------------ the option


def test_focused_plans_by_the_packed_facts_and_the_spec_does_not():
    assert PROFILES["focused"].plan == "packed"
    assert SessionOptions().plan == "outline" and SessionOptions().to_dict() == {}
    assert PROFILES["spec"].plan == PROFILES["fresh"].plan == "outline"
    assert resolve_options("focused", plan="outline").plan == "outline"
    with pytest.raises(InvalidInputError, match="unknown plan option"):
        SessionOptions(plan="leading")


# ------------------------------------------------------------------ the loop


class Recording(Generator):
    """Records, per window, each packed fact's owner among the open sections and the plan."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.seen: list[tuple[list[str], np.ndarray, list[str]]] = []

    def _window_plan(self, session: Any, plan_sqs: list[Any], rows: np.ndarray, envelope: Any,
                     facts: Any, words: int | None) -> Any:
        plan, grounds = super()._window_plan(session, plan_sqs, rows, envelope, facts, words)
        labels = [f.section for f in facts]
        owner = (self._owners(session, plan_sqs, rows, labels) if len(rows) and plan_sqs
                 else np.zeros(0, np.int64))
        self.seen.append(([sq.text for sq in plan_sqs], owner, [p.title for p in plan]))
        return plan, grounds


def _run(ckf_path: Path, outline: str = BUILTIN_TYPES_OUTLINE, **options: Any
         ) -> tuple[Recording, ProseWriter, list[Any]]:
    writer = ProseWriter(words=150)
    cfg = GenerationConfig(max_windows=6, words=2400, context_tokens=2048,
                           generation_tokens=320, **options)
    gen = Recording(CKF.open(ckf_path), writer, cfg)
    session = gen.start(BUILTIN_TYPES_TASK, outline)
    events = []
    while session.status == IN_PROGRESS:
        events.append(gen.step(session))
    return gen, writer, events


@pytest.fixture(scope="module")
def focused_run(types_ckf_path: Path) -> tuple[Recording, ProseWriter, list[Any]]:
    return _run(types_ckf_path, profile="focused")


def test_every_planned_section_owns_enough_packed_facts(focused_run: tuple):
    """Under `focused`, each section a window plans owns at least `PLAN_MIN_FACTS` of its
    packed facts (by heading, else by cosine; or, when none owns that many, as many as any
    section owns), the plan is in outline order, and every packed fact is still cited (the
    prompt lists the whole envelope)."""
    gen, writer, events = focused_run
    written = [e for e in events if e.output]
    assert len(written) >= 3
    checked = 0
    for open_titles, owner, planned in gen.seen:
        if not planned:
            continue
        counts = np.bincount(owner[owner >= 0], minlength=len(open_titles))
        floor = min(PLAN_MIN_FACTS, int(counts.max()))
        for title in planned:
            assert counts[open_titles.index(title)] >= floor, (title, open_titles, counts)
        positions = [open_titles.index(t) for t in planned]
        assert positions == sorted(positions)
        checked += 1
    assert checked >= len(written)
    for event, prompt in zip(written, writer.prompts, strict=True):
        cited = {r for p in event.prepared.plan for r in p.fact_refs}
        assert cited == set(parse_prompt(prompt)[1]) == {
            f"F{i + 1}" for i in range(len(event.prepared.envelope))}


def test_the_outline_planning_asks_for_a_section_the_envelope_holds_nothing_of(
        types_ckf_path: Path):
    """The case the option is for, on an outline whose first line the knowledge base holds
    nothing of: the outline planning names it (all the facts assigned to it), the packed
    planning names the sections the facts are closest to instead."""
    outline = "Ownership and borrowing in Rust\n" + BUILTIN_TYPES_OUTLINE
    gen, _, _ = _run(types_ckf_path, outline, profile="focused", plan="outline")
    first = gen.seen[0]
    assert first[2][0] == "Ownership and borrowing in Rust"
    assert np.count_nonzero(first[1] == 0) < PLAN_MIN_FACTS  # it owns almost nothing
    gen, _, _ = _run(types_ckf_path, outline, profile="focused")
    assert all("Ownership and borrowing in Rust" not in planned for _, _, planned in gen.seen)


NO_HEADINGS = "All about truthiness\nAll about numbers and arithmetic\nAll about containers\n"


def test_facts_of_no_section_leave_the_outline_planning(types_ckf_path: Path):
    """Edge: an envelope whose facts belong to no outline section — no heading is an outline
    line and every cosine is below `plan_min_similarity` — plans as the outline planning
    does, exactly."""
    packed = _run(types_ckf_path, NO_HEADINGS, profile="focused",
                  plan_min_similarity=0.99)[1].prompts
    outline = _run(types_ckf_path, NO_HEADINGS, profile="focused", plan="outline",
                   plan_min_similarity=0.99)[1].prompts
    assert packed and packed == outline


def test_facts_of_no_heading_go_to_their_closest_section(types_ckf_path: Path):
    """Edge: no fact's heading is an outline line: the cosine decides alone, every window
    still plans a section and cites every packed fact."""
    events = _run(types_ckf_path, NO_HEADINGS, profile="focused")[2]
    written = [e for e in events if e.output]
    assert written and all(e.prepared.plan for e in written)
    for event in written:
        cited = {r for p in event.prepared.plan for r in p.fact_refs}
        assert cited == {f"F{i + 1}" for i in range(len(event.prepared.envelope))}


def test_the_spec_profile_plans_as_before(types_ckf_path: Path):
    """`plan` is not the spec's: a spec run's plans are the outline planning's, whatever
    `plan_min_facts` says (its prompts do not change with it)."""
    a = _run(types_ckf_path)[1].prompts
    b = _run(types_ckf_path, plan_min_facts=5)[1].prompts
    assert a and a == b
