"""A begun section is continued where it stopped: its last words travel with the session and
the next window that plans it is shown them (docs/design.md §3.15 "Continued sections")."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from cdr.ckf import CKF
from cdr.coverage import SubQuery
from cdr.errors import InvalidInputError
from cdr.session import Session
from cdr.text.prompt_format import PlanSection
from cdr.window.dpe import DpeReport, tail_words
from cdr.window.loop import SECTION_END_WORDS, GenerationConfig, Generator
from cdr.window.prompt import build_user_prompt
from cdr.writers import get_writer

WORD = st.text(alphabet="abcdefgh", min_size=1, max_size=6)
SENTENCE = st.lists(WORD, min_size=1, max_size=12).map(lambda w: " ".join(w) + ".")


def test_tail_words_exact_cases():
    assert tail_words("One two three.", 5) == "One two three."
    # The span's first sentence boundary is used: the quote starts a sentence.
    assert tail_words("Alpha beta gamma. Delta epsilon zeta eta.", 5) == "Delta epsilon zeta eta."
    # The word before the span ends a sentence: the span already starts one.
    assert tail_words("Alpha beta. Gamma delta epsilon.", 3) == "Gamma delta epsilon."
    # No boundary inside the span: a fragment, marked.
    assert tail_words("a b c d e f g h", 3) == "… f g h"


@given(st.lists(SENTENCE, min_size=1, max_size=20), st.integers(1, 60))
def test_tail_words_is_a_bounded_suffix(sentences, max_words):
    text = " ".join(sentences)
    tail = tail_words(text, max_words)
    bare = tail.removeprefix("… ")
    assert text.endswith(bare) and bare
    assert len(bare.split()) <= max_words
    if tail.startswith("… "):  # only when no sentence starts inside the span
        assert not any(w.endswith(".") for w in text.split()[-max_words - 1:-1])
    else:  # a whole-sentence suffix
        assert bare == text or text[: -len(bare)].rstrip().endswith(".")


def test_report_section_ends_keep_each_sections_last_paragraph():
    report = DpeReport({"a": 0.5, "b": 0.2}, {"a": 9, "b": 3}, 4, 2,
                       ["a", None, "b", "a"],
                       ["First of a.", "Chatter here.", "Only b.", "Second of a ends here."])
    assert report.section_ends(40) == {"a": "Second of a ends here.", "b": "Only b."}
    assert report.section_ends(2) == {"a": "… ends here.", "b": "Only b."}


def _session() -> Session:
    sqs = [SubQuery("s1", "Alpha", 100), SubQuery("s2", "Beta", 100)]
    emb = np.eye(2, 4, dtype=np.float32)
    return Session.start("Task", sqs, emb, np.ones(4, np.float32) / 2, "m")


def test_session_keeps_section_ends_round_trip_and_refuses_unknown_ids():
    s = _session()
    s.update_after_window({"s1": 0.3}, "text one", embedding_model_id="m",
                          section_ends={"s1": "Alpha stops here."})
    s.update_after_window({"s2": 0.3}, "text two", embedding_model_id="m",
                          section_ends={"s2": "Beta stops."})
    assert s.section_ends == {"s1": "Alpha stops here.", "s2": "Beta stops."}
    back = Session.from_json(s.to_json())
    assert back.section_ends == s.section_ends and back.to_dict() == s.to_dict()
    before = s.to_json()
    with pytest.raises(InvalidInputError):
        s.update_after_window({"s1": 0.1}, "x", embedding_model_id="m",
                              section_ends={"nope": "x"})
    assert s.to_json() == before  # nothing changed
    bad = s.to_dict() | {"section_ends": {"nope": "x"}}
    with pytest.raises(InvalidInputError, match="section_ends"):
        Session.from_dict(bad)
    with pytest.raises(InvalidInputError, match="section_ends"):
        Session.from_dict(s.to_dict() | {"section_ends": {"s1": 3}})
    # A session stored before the field existed loads with none.
    old = s.to_dict()
    del old["section_ends"]
    assert Session.from_dict(old).section_ends == {}


def test_prompt_quotes_where_a_continued_section_stopped():
    plan = [PlanSection("Index types", 200, ("F1",)), PlanSection("Maintenance", 100, ("F1",))]
    facts = [("F1", "Doc", "B-tree is the default type.")]
    text = build_user_prompt("T", "A", plan, facts, first_window=False,
                             continued={"Index types": "Hash indexes only do equality.",
                                        "Maintenance": ""})
    assert ('"Index types" was begun earlier and its text so far ends: "Hash indexes only do '
            'equality." Continue it from there') in text
    assert '"Maintenance" was begun earlier: add new material to it' in text


@pytest.mark.parametrize("shown", [True, False])
def test_next_window_is_shown_where_its_begun_sections_stopped(types_ckf_path: Path, shown):
    cfg = GenerationConfig(max_windows=4, words=6000, show_section_ends=shown)
    gen = Generator(CKF.open(types_ckf_path), get_writer("extractive"), cfg)
    session = gen.start("Write a guide to Python's built-in types",
                        "Numeric types\nSequence types\nMapping types")
    first = gen.step(session)
    written = " ".join(first.output.split())
    begun = {sq.id: sq.text for sq in session.sub_queries if session.cumulative_depth[sq.id] > 0}
    assert begun and set(session.section_ends) == set(begun)
    for end in session.section_ends.values():
        bare = end.removeprefix("… ")
        assert bare in written and len(bare.split()) <= SECTION_END_WORDS
    prompt = gen.prepare(session).messages[1]["content"]
    continued = [(i, t) for i, t in begun.items() if f'"{t}" was begun earlier' in prompt]
    assert continued  # 6,000 words planned: what W1 began is still residual and planned
    for sq_id, title in continued:
        quoted = f'"{title}" was begun earlier and its text so far ends: ' \
                 f'"{session.section_ends[sq_id]}"'
        assert (quoted in prompt) is shown
