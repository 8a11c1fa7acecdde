"""`resume: "prefill"` (cdr.window.resume): a window continuing a begun section starts its
answer with the section's heading and last words, when its writer can be handed a begun answer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cdr.ckf import CKF
from cdr.errors import InvalidInputError
from cdr.options import SessionOptions
from cdr.text.kept_stream import KeptStream
from cdr.text.prompt_format import PlanSection
from cdr.trace import window_record
from cdr.window.loop import GenerationConfig, Generator
from cdr.window.resume import (
    Resume,
    can_resume,
    repeats_itself,
    resume_for,
    without_own_heading,
    write_resumed,
)
from cdr.writers import get_writer
from cdr.writers.base import StreamInterruptedError, WriterBase, WriterResult
from tests.prose_writer import ProseWriter

PLAN = [PlanSection("Alpha", 200, ("F1",)), PlanSection("Beta", 100, ("F2",))]


def test_resume_for_takes_the_first_planned_section_only_when_begun_with_known_words():
    assert resume_for([], {"Alpha": "x."}) is None
    assert resume_for(PLAN, {}) is None
    assert resume_for(PLAN, {"Alpha": ""}) is None  # begun, but its words are not shown
    assert resume_for(PLAN, {"Beta": "Later."}) is None  # an answer has one start
    got = resume_for(PLAN, {"Alpha": " It ends here. ", "Beta": "b."})
    assert got == Resume("## Alpha", "It ends here.")
    assert got.prefix == "## Alpha\n\nIt ends here."
    assert got.head == "## Alpha\n\n"


@pytest.mark.parametrize("tail", [
    "… ends mid-sentence here.",  # a fragment (`tail_words` found no sentence start)
    "The types are: - `date`: a day - `time`: a time of day",  # a list, its lines joined
    "For example: ```python d = date(2024, 1, 1) ```",  # code, its lines joined
    "| a | b | | 1 | 2 |",  # a table
    "See below. ## Next part",  # a heading
])
def test_only_plain_prose_is_handed_on(tail):
    """The quote joins its lines with spaces: Markdown structure in it would reach the
    model as one broken line."""
    assert resume_for(PLAN, {"Alpha": tail}) is None


def test_a_tail_that_repeats_itself_is_not_handed_on():
    loop = " ".join(["The tzinfo objects hold the zone."] * 6)
    assert repeats_itself(loop) and resume_for(PLAN, {"Alpha": loop}) is None
    prose = ("The `Generic` base class makes a class generic in the type variables it names, "
             "and a subclass may fix some of them.")
    assert not repeats_itself(prose) and resume_for(PLAN, {"Alpha": prose}) is not None
    assert not repeats_itself("")


def test_without_own_heading_drops_only_the_same_sections_heading():
    assert without_own_heading("## Alpha\n\nText.", "## Alpha") == "Text."
    assert without_own_heading("### 2. alpha\nText.", "## Alpha") == "Text."
    assert without_own_heading("## Beta\n\nText.", "## Alpha") == "## Beta\n\nText."
    assert without_own_heading("  Text first.", "## Alpha") == "Text first."


class _Continuing:
    """A writer that can be handed a begun answer: it answers with `reply`, streamed in
    `pieces`, and records the prefixes it was given."""

    name = "continuing"
    pastes_facts = False
    continues_prefix = True

    def __init__(self, pieces: list[str], fail_after: int | None = None) -> None:
        self.pieces, self.fail_after = pieces, fail_after
        self.prefixes: list[str] = []

    def generate(self, messages: list[dict[str, str]], max_tokens: int, *,
                 on_delta: Any = None, prefix: str = "") -> WriterResult:
        self.prefixes.append(prefix)
        for i, p in enumerate(self.pieces):
            if self.fail_after is not None and i == self.fail_after:
                raise StreamInterruptedError("cut", None, "".join(self.pieces[:i]))
            if on_delta is not None:
                on_delta(p)
        return WriterResult("".join(self.pieces), "stop", {"completion_tokens": 3})


@given(st.lists(st.text(alphabet=" \nab.", max_size=5), max_size=6))
def test_streamed_pieces_concatenate_to_the_windows_text(pieces):
    writer = _Continuing(pieces)
    got: list[str] = []
    resume = Resume("## Alpha", "So far.")
    result, kept = write_resumed(writer, [{"role": "user", "content": "u"}], 50, resume,
                                 got.append)
    assert writer.prefixes[0] == "## Alpha\n\nSo far."
    if "".join(pieces).strip():
        assert kept and writer.prefixes == ["## Alpha\n\nSo far."]
        assert "".join(got) == result.text == "## Alpha\n\n" + "".join(pieces).lstrip()
    else:  # stopped at once: nothing was sent, and the window is written again unresumed
        assert not kept and writer.prefixes == ["## Alpha\n\nSo far.", ""]
        assert "".join(got) == result.text


def test_the_words_so_far_are_not_written_again_and_an_interruption_keeps_the_heading():
    writer = _Continuing([" Next one.", " And more."])
    result, kept = write_resumed(writer, [{"role": "user", "content": "u"}], 50,
                                 Resume("## Alpha", "So far."))
    assert kept and result.text == "## Alpha\n\nNext one. And more."
    broken = _Continuing([" Next one.", " And more."], fail_after=1)
    with pytest.raises(StreamInterruptedError) as info:
        write_resumed(broken, [{"role": "user", "content": "u"}], 50,
                      Resume("## Alpha", "So far."))
    assert info.value.partial_text == "## Alpha\n\nNext one."
    nothing = _Continuing([" ", "Next."], fail_after=1)
    with pytest.raises(StreamInterruptedError) as info:
        write_resumed(nothing, [{"role": "user", "content": "u"}], 50,
                      Resume("## Alpha", "So far."))
    assert info.value.partial_text == ""  # nothing but whitespace had come


class _CutThenPlain:
    """After a prefix: `first` streamed and then cut at the token limit with nothing kept;
    plainly: a fresh answer under the section's own heading."""

    name = "cut"
    continues_prefix = True

    def __init__(self, first: str) -> None:
        self.first = first
        self.calls: list[str] = []

    def generate(self, messages: list[dict[str, str]], max_tokens: int, *,
                 on_delta: Any = None, prefix: str = "") -> WriterResult:
        self.calls.append(prefix)
        if prefix:
            if on_delta is not None:
                on_delta(self.first)
            return WriterResult("", "length", {"completion_tokens": 50, "prompt_tokens": 7},
                                dropped_text=self.first)
        text = "## Alpha\n\nA fresh paragraph."
        if on_delta is not None:
            on_delta(text)
        return WriterResult(text, "stop", {"completion_tokens": 4, "prompt_tokens": 6})


@pytest.mark.parametrize("first", [" - `tuple` - `tuple`", "  \n "])
def test_a_continuation_cut_with_nothing_kept_is_written_again_unresumed(first):
    writer = _CutThenPlain(first)
    got: list[str] = []
    held = KeptStream(got.append)  # as the loop streams: complete blocks only
    result, kept = write_resumed(writer, [{"role": "user", "content": "u"}], 50,
                                 Resume("## Alpha", "So far."), held.feed)
    assert not kept and writer.calls == ["## Alpha\n\nSo far.", ""]
    assert result.text == "## Alpha\n\nA fresh paragraph." and result.finish_reason == "stop"
    assert result.usage == {"completion_tokens": 54, "prompt_tokens": 13,
                            "total_tokens": 67}  # both calls
    assert result.text.startswith("".join(got))  # released so far: a prefix of the text
    held.finish(result.text)
    assert "".join(got) == result.text  # the stream is the window's text


def test_a_writer_that_cannot_continue_a_prefix_refuses_it_before_any_work():
    class Plain(WriterBase):
        name = "plain"
        calls = 0

        def _generate(self, messages, max_tokens, on_delta):  # type: ignore[no-untyped-def]
            Plain.calls += 1
            return WriterResult("x", "stop", {})

    with pytest.raises(InvalidInputError, match="plain writer cannot continue a prefix"):
        Plain().generate([{"role": "user", "content": "u"}], 10, prefix="## A\n\nb.")
    assert Plain.calls == 0
    assert Plain().generate([{"role": "user", "content": "u"}], 10).text == "x"
    assert not can_resume(Plain()) and not can_resume(get_writer("extractive"))


def test_the_option_is_stored_only_when_chosen_and_unknown_values_are_refused():
    assert SessionOptions().to_dict() == {}
    assert SessionOptions(resume="prefill").to_dict() == {"resume": "prefill"}
    assert SessionOptions.from_dict({"resume": "prefill"}).resume == "prefill"
    with pytest.raises(InvalidInputError, match="unknown resume option"):
        SessionOptions(resume="always")


class _ContinuingProse(ProseWriter):
    """`ProseWriter` that can be handed a begun answer: its continuation is its usual text
    without the heading the prefix already holds."""

    continues_prefix = True

    def __init__(self, words: int) -> None:
        super().__init__(words=words)
        self.prefixes: list[str] = []

    def generate(self, messages: list[dict[str, str]], max_tokens: int, *,
                 on_delta: Any = None, prefix: str = "") -> WriterResult:
        self.prefixes.append(prefix)
        result = super().generate(messages, max_tokens, on_delta=None)
        if prefix:
            heading = prefix.split("\n\n", 1)[0]
            result.text = " " + result.text.removeprefix(heading).lstrip()
        if on_delta is not None:
            on_delta(result.text)
        return result


def _run(path: Path, writer: Any, resume: str | None) -> tuple[Generator, list[Any]]:
    cfg = GenerationConfig(max_windows=3, words=6000, length="contract", resume=resume)
    gen = Generator(CKF.open(path), writer, cfg)
    session = gen.start("Write a guide to Python's built-in types",
                        "Numeric types\nSequence types\nMapping types")
    events = []
    for _ in range(3):
        if session.status != "in-progress":
            break
        prepared = gen.prepare(session)
        events.append((prepared, gen.write_and_complete(session, prepared)))
    return gen, events


def test_a_window_continuing_its_first_section_is_handed_where_it_stopped(types_ckf_path: Path):
    writer = _ContinuingProse(words=40)  # every window is cut: its section goes on
    _, events = _run(types_ckf_path, writer, "prefill")
    resumed = [(p, e) for p, e in events if p.resume is not None]
    assert events[0][0].resume is None  # nothing begun before Window 1
    assert resumed, "a 40-word window cuts its section, so the next one continues it"
    for prepared, event in resumed:
        title = prepared.plan[0].title
        assert prepared.resume.heading == f"## {title}"
        assert f"## {title}\n\n{prepared.resume.words}" in writer.prefixes
        assert event.output.startswith(f"## {title}\n\n")
        assert window_record(event)["resumed"] is True
        assert not event.output.startswith(f"## {title}\n\n{prepared.resume.words}")


@pytest.mark.parametrize("resume", [None, "prompt", "prefill"])
def test_no_resume_without_the_option_or_the_writers_capability(types_ckf_path: Path, resume):
    _, events = _run(types_ckf_path, ProseWriter(words=40), resume)  # cannot continue
    assert all(p.resume is None for p, _ in events)
    assert all("resumed" not in window_record(e) for _, e in events)
    if resume != "prefill":
        writer = _ContinuingProse(words=40)
        _, events = _run(types_ckf_path, writer, resume)
        assert all(p.resume is None for p, _ in events) and set(writer.prefixes) == {""}


def test_resuming_is_an_opt_in_on_top_of_any_profile():
    """Chosen on the tuning pages, not confirmed on the report tasks: no profile turns it on
    (docs/length.md)."""
    from cdr.options import PROFILES, resolve_options

    assert all(p.resume == "prompt" for p in PROFILES.values())
    assert resolve_options("focused", resume="prefill").resume == "prefill"
    assert resolve_options("focused", resume="prefill").plan == "packed"


class _ResumeGoesNowhere(_ContinuingProse):
    """Handed a prefix, it is cut at the limit inside its first paragraph (keeps nothing)."""

    def generate(self, messages: list[dict[str, str]], max_tokens: int, *,
                 on_delta: Any = None, prefix: str = "") -> WriterResult:
        if prefix:
            self.prefixes.append(prefix)
            return WriterResult("", "length", {"completion_tokens": max_tokens},
                                dropped_text="cut")
        return super().generate(messages, max_tokens, on_delta=on_delta)


def test_a_window_written_unresumed_after_all_is_not_marked_resumed(types_ckf_path: Path):
    writer = _ResumeGoesNowhere(words=40)
    _, events = _run(types_ckf_path, writer, "prefill")
    assert any(p for p in writer.prefixes), "a resume was tried"
    for prepared, event in events:
        assert prepared.resume is None  # dropped once the window was written unresumed
        assert "resumed" not in window_record(event)
    assert all(e.output.strip() for _, e in events if e.status == "in-progress")
