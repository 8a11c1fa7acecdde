"""Subject-anchored sub-queries (`subject: "anchor"`) and the stop on stale envelopes
(`stale: "stop"`): exact texts and vectors, the per-window `sent_before` share every trace
carries, and a run that stops instead of writing what earlier windows already got."""

from __future__ import annotations

import jsonschema
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from cdr.ckf import CKF
from cdr.options import PROFILES, resolve_options
from cdr.retrieval.embed import default_embedder
from cdr.retrieval.subject import SUBJECT_WORDS, anchored, sub_query_texts, subject_of
from cdr.session import CKF_EXHAUSTED, EXHAUSTION_RATIO, LIMIT_REACHED, TASK_COMPLETE
from cdr.trace import TRACE_SCHEMA, build_trace
from cdr.window.dpe import parse_outline
from cdr.window.loop import GenerationConfig, Generator
from cdr.window.stale import STALE_SHARE, is_stale, sent_before_per_window, sent_before_share
from cdr.writers import get_writer
from tests.conftest import BUILTIN_TYPES_OUTLINE, BUILTIN_TYPES_TASK


@pytest.fixture(scope="module")
def types_ckf(types_ckf_path) -> CKF:
    return CKF.open(types_ckf_path)


def run(ckf: CKF, **options: str | float):
    gen = Generator(ckf, get_writer("extractive"),
                    GenerationConfig(max_windows=8, words=3000, **options))
    session = gen.start(BUILTIN_TYPES_TASK, BUILTIN_TYPES_OUTLINE)
    events = list(gen.run(BUILTIN_TYPES_TASK, session=session))
    return session, events, build_trace(session, events)


# ------------------------------------------------------------------ subject anchoring


def test_the_subject_is_the_task_without_its_instruction_words():
    assert subject_of("Write a comprehensive guide to asyncio tasks") == "asyncio tasks"
    assert subject_of("A guide to asyncio tasks") == "asyncio tasks"
    assert subject_of("Write a reference page about open(2): open a file") == (
        "open(2): open a file")
    assert subject_of("Write a guide") == "guide"  # never empty
    assert anchored("asyncio tasks", "Background") == "asyncio tasks — Background"
    # a line that already names the subject is embedded as written
    assert anchored("asyncio", "Cancelling asyncio tasks") == "Cancelling asyncio tasks"
    assert anchored("", "Background") == "Background"


def test_hostile_subjects_are_cleaned_and_bounded():
    assert subject_of("Write a guide to\x00 open\x1b(2)\u2028 flags") == "open (2) flags"
    huge = subject_of("Write a guide to " + "word " * 10_000)
    assert len(huge.split()) == SUBJECT_WORDS


def test_off_keeps_the_lines_and_anchor_prefixes_each():
    sqs = parse_outline("Background\nasyncio tasks in depth\nReturn value", 900)
    assert sub_query_texts("A guide to asyncio tasks", sqs, "off") == [
        "Background", "asyncio tasks in depth", "Return value"]
    assert sub_query_texts("A guide to asyncio tasks", sqs, "anchor") == [
        "asyncio tasks — Background", "asyncio tasks in depth", "asyncio tasks — Return value"]


def test_an_anchored_session_embeds_subject_plus_line_and_writes_under_the_line(types_ckf):
    gen = Generator(types_ckf, get_writer("extractive"),
                    GenerationConfig(max_windows=2, words=1200, subject="anchor"))
    session = gen.start(BUILTIN_TYPES_TASK, BUILTIN_TYPES_OUTLINE)
    lines = [sq.text for sq in parse_outline(BUILTIN_TYPES_OUTLINE, 1200)]
    assert [sq.text for sq in session.sub_queries] == lines  # labels unchanged
    expected = default_embedder().encode(
        [f"Python's built-in types — {line}" for line in lines])
    np.testing.assert_allclose(session.sub_query_embeddings, expected, atol=1e-6)
    spec = Generator(types_ckf, get_writer("extractive"), GenerationConfig(max_windows=2))
    plain = spec.start(BUILTIN_TYPES_TASK, BUILTIN_TYPES_OUTLINE)
    assert not np.allclose(plain.sub_query_embeddings, session.sub_query_embeddings)
    assert session.options.to_dict() == {"subject": "anchor"}


# ------------------------------------------------------------------ stale envelopes


def test_sent_before_shares_exact():
    assert sent_before_share([], set()) is None
    assert sent_before_share(["a", "b", "c", "d"], {"a", "c", "x"}) == 0.5
    assert sent_before_per_window([["a", "b"], ["b", "c", "d", "e"], [], ["a", "e"]]) == [
        0.0, 0.25, None, 1.0]
    assert is_stale(["a", "b", "c", "d"], {"a", "b", "c"})  # 0.75 ≥ STALE_SHARE
    assert not is_stale(["a", "b", "c", "d"], {"a", "b"})
    assert not is_stale([], {"a"})  # empty is Exit 3's own case
    assert STALE_SHARE == 0.75


@given(st.lists(st.lists(st.sampled_from("abcdefgh"), max_size=6), max_size=8))
def test_sent_before_is_a_share_and_window_one_is_all_new(envelopes):
    shares = sent_before_per_window(envelopes)
    assert len(shares) == len(envelopes)
    for ids, s in zip(envelopes, shares, strict=True):
        assert (s is None) == (not ids)
        assert s is None or 0.0 <= s <= 1.0
    first = next((s for s in shares if s is not None), None)
    assert first in (None, 0.0)  # nothing was sent before the first non-empty envelope
    seen: set[str] = set()
    for ids, s in zip(envelopes, shares, strict=True):  # 1.0 exactly when all were sent
        assert (s == 1.0) == (bool(ids) and set(ids) <= seen)
        seen.update(ids)


# Gates above the calibrated one, so the knowledge base's material runs out within 8 windows.
# (0.5 and 0.55 before the budget counted the whole prompt: an envelope holds fewer facts now,
# so the material runs out a window later at each gate; docs/design.md §3.16)
SPEC_RUN_GATE = 0.53
STOP_RUN_GATE = 0.53


def test_the_spec_loop_writes_stale_windows_and_the_trace_shows_it(types_ckf):
    session, events, trace = run(types_ckf, min_relevance=SPEC_RUN_GATE)
    jsonschema.validate(trace, TRACE_SCHEMA)
    shares = [w["sent_before"] for w in trace["windows"]]
    assert shares[0] == 0.0
    stale = [i for i, s in enumerate(shares) if s is not None and s >= STALE_SHARE]
    assert stale, shares  # Exit 3 does not see an unwritten fact sent again ...
    assert all(events[i].output for i in stale)  # ... so the spec loop writes them
    # it runs on to another exit: Exit 3 never fired on those windows
    assert session.status in (LIMIT_REACHED, TASK_COMPLETE)
    assert "stale" not in trace.get("options", {})


def test_stale_stop_sends_what_is_left_then_ends_unwritten(types_ckf):
    _, spec_events, spec_trace = run(types_ckf, min_relevance=STOP_RUN_GATE)
    first_stale = next(i for i, w in enumerate(spec_trace["windows"])
                       if w["sent_before"] is not None and w["sent_before"] >= STALE_SHARE)
    gen = Generator(types_ckf, get_writer("extractive"),
                    GenerationConfig(max_windows=8, words=3000, stale="stop",
                                     min_relevance=STOP_RUN_GATE))
    session = gen.start(BUILTIN_TYPES_TASK, BUILTIN_TYPES_OUTLINE)
    events = list(gen.run(BUILTIN_TYPES_TASK, session=session))
    trace = build_trace(session, events)
    jsonschema.validate(trace, TRACE_SCHEMA)
    assert session.status == CKF_EXHAUSTED
    last = events[-1]
    assert last.output == ""
    assert last.headers["CRP-Context-Mode"] == CKF_EXHAUSTED
    assert "CRP-Onboarding-Hint" in last.headers
    # the windows before the first stale envelope are the spec's own ...
    assert [e.output for e in events[:first_stale]] == \
        [e.output for e in spec_events[:first_stale]]
    # ... no stale window is written: where the spec's envelope went stale, the candidates
    # never sent went out alone instead (sent before: 0)
    shares = [w["sent_before"] for w in trace["windows"]]
    written = [s for s, e in zip(shares, events, strict=True) if e.output]
    assert all(s < STALE_SHARE for s in written), shares
    assert len(events) > first_stale + 1 and shares[first_stale] == 0.0, shares
    # it ends when nothing past the gate is left unsent, or what is left is below Exit 3's
    # floor (the spec's loop would not write from it either)
    cand = gen.index.fact_ids(gen.candidates(session).indices)
    unsent = [f for f in cand if f not in session.fact_memory.shown]
    ratio = last.prepared.envelope.mean_novelty_ratio
    assert not unsent or (ratio is not None and ratio < EXHAUSTION_RATIO)
    assert trace["options"] == {"stale": "stop"}


def test_stale_stop_without_anything_unsent_ends_at_the_stale_envelope(tiny_ckf_path):
    """A knowledge base the first window sends whole: the second envelope is all repeats and
    nothing is left unsent, so the run ends there, unwritten."""
    with CKF.open(tiny_ckf_path) as ckf:
        gen = Generator(ckf, get_writer("extractive"),
                        GenerationConfig(max_windows=6, words=3000, stale="stop",
                                         min_relevance=-1.0))
        session = gen.start("Write about truth values and pass", "Truth\nPass")
        events = list(gen.run("Write about truth values and pass", session=session))
    assert events[0].output and session.status == CKF_EXHAUSTED
    assert events[-1].output == "" and len(events) == 2
    assert set(events[-1].prepared.envelope.fact_ids) <= set(events[0].prepared.envelope.fact_ids)


def test_the_focused_profile_bundles_the_options():
    focused = resolve_options("focused")
    assert focused == PROFILES["focused"]
    assert (focused.memory, focused.lexical, focused.stale, focused.documents) == (
        "facts", "bm25", "stop", "support")
    assert (focused.subject, focused.envelope, focused.queries) == ("off", "budget", "titles")
    assert resolve_options("focused", stale="write").stale == "write"
