"""A model's loop is seen as it streams, generation stops, and the window keeps the text before
it (`cdr.text.self_repeat`): the exact rule, its independence from how the text is cut into
pieces, prose that never trips it, and the writers and the loop acting on it."""

from __future__ import annotations

import pydoc_data.topics
import re

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from cdr.text.self_repeat import (
    MAX_UNIT_WORDS,
    MIN_UNIT_DISTINCT,
    MIN_UNIT_WORDS,
    REPETITION,
    RepeatWatch,
    find_repeat,
    kept_before_repeat,
)
from cdr.writers.base import Pieces, WriterResult, cut_repetition


def reference_cut(text: str) -> int | None:
    """The rule by brute force: the first word at which the words so far end with a unit of
    MIN..MAX words (MIN_UNIT_DISTINCT of them different) written twice back to back; the
    first copy's end."""
    spans = [(m.start(), m.end()) for m in re.finditer(r"\S+", text)]
    words = [text[s:e] for s, e in spans]
    for j in range(1, len(words) + 1):
        for k in range(MIN_UNIT_WORDS, min(MAX_UNIT_WORDS, j // 2) + 1):
            if words[j - 2 * k:j - k] == words[j - k:j] and \
                    len(set(words[j - k:j])) >= MIN_UNIT_DISTINCT:
                return spans[j - k - 1][1]
    return None


def test_a_unit_of_eight_words_said_twice_is_a_loop_and_seven_is_not():
    unit = "the quick brown fox jumps over the dog"
    text = f"Intro words here. {unit} {unit} and on"
    assert find_repeat(text) == len(f"Intro words here. {unit}")
    seven = "one two three four five six seven"
    assert find_repeat(f"{seven} {seven} end of it") is None


def test_a_short_unit_shows_once_it_makes_eight_words():
    item = "- `tuple` again\n"
    text = "Types:\n\n" + item * 12
    cut = find_repeat(text)
    assert cut is not None
    kept, dropped = kept_before_repeat(text, cut)
    assert kept == "Types:\n\n" + item * 3  # 3 items = 9 words, the first unit of 8 or more
    assert dropped.count("`tuple`") == 9


def test_the_first_copy_ending_mid_sentence_keeps_the_finished_sentences():
    loop = "the function can be used to set the memory policy for a range of "
    text = "Memory policy matters. It is set per range. " + "Here " + loop * 3
    cut = find_repeat(text)
    assert cut is not None and text[:cut].endswith("range of")
    kept, dropped = kept_before_repeat(text, cut)
    assert kept == "Memory policy matters. It is set per range.\n"
    assert text.startswith(kept.rstrip()) and dropped.startswith("Here the function")


def test_a_loop_inside_a_code_block_keeps_the_blocks_before_it():
    line = "print(value) # prints the value of the variable once more\n"
    text = "Intro paragraph.\n\n```python\n" + line * 3 + "```\n"
    cut = find_repeat(text)
    assert cut is not None
    kept, _ = kept_before_repeat(text, cut)
    assert kept == "Intro paragraph.\n" and kept.count("```") % 2 == 0


def test_a_paragraph_said_twice_keeps_the_first():
    para = "The datetime module supplies classes for manipulating dates and times."
    text = f"## Dates\n\n{para}\n\n{para}\n\n{para}\n"
    kept, dropped = kept_before_repeat(text, find_repeat(text))
    assert kept == f"## Dates\n\n{para}\n" and dropped == f"{para}\n\n{para}\n"


def test_the_python_documentation_never_trips_it():
    """Prose written by people: every pydoc topic of this Python (tens of thousands of words
    of reference text, lists and examples) runs through without a loop."""
    topics = pydoc_data.topics.topics
    assert sum(len(t.split()) for t in topics.values()) > 30_000
    assert [name for name, text in topics.items() if find_repeat(text) is not None] == []


_WORDS = st.lists(st.sampled_from(["a", "b", "c", "- x", "y.", "z\n\n"]), min_size=0,
                  max_size=60)


@settings(max_examples=300, deadline=None)
@given(words=_WORDS, data=st.data())
def test_any_cutting_into_pieces_sees_the_loop_where_the_rule_says(words, data):
    text = " ".join(words)
    want = reference_cut(text)
    assert find_repeat(text) == want
    bounds = sorted(data.draw(st.sets(st.integers(0, len(text)), max_size=12)))
    watch = RepeatWatch()
    for a, b in zip([0, *bounds], [*bounds, len(text)], strict=True):
        watch.feed(text[a:b])
    watch.feed(" ")
    assert watch.cut == want


@settings(max_examples=200, deadline=None)
@given(head=st.lists(st.sampled_from(["alpha", "beta.", "gamma\n"]), max_size=20),
       unit=st.lists(st.sampled_from(["one", "two", "three", "four", "five."]),
                     min_size=MIN_UNIT_WORDS, max_size=20), copies=st.integers(2, 4))
def test_kept_text_is_a_prefix_that_holds_no_loop(head, unit, copies):
    assume(len(set(unit)) >= MIN_UNIT_DISTINCT)
    text = " ".join(head + unit * copies)
    cut = find_repeat(text)
    assert cut is not None  # the unit said `copies` times is seen
    kept, dropped = kept_before_repeat(text, cut)
    assert text.startswith(kept.rstrip())
    assert find_repeat(kept) is None
    assert len(kept.split()) + len(dropped.split()) == len(text.split())


def test_pieces_say_when_to_stop_and_generate_keeps_the_text_before_the_loop():
    got: list[str] = []
    emit = Pieces(got.append)
    unit = "this sentence keeps coming back to the same point again. "
    for piece in ("Start here. ", unit, unit[:20]):
        emit(piece)
    assert not emit.repeating
    emit(unit[20:])
    assert emit.repeating and emit.text.startswith("".join(got))
    # the piece that showed the loop is held back (the loop began before it); what came
    # before it had gone on already, and a stream keeps no more than its complete blocks
    assert "".join(got) == "Start here. " + unit + unit[:20]
    result = cut_repetition(WriterResult(emit.text, "stop", {}))
    assert result.finish_reason == REPETITION
    assert result.text == "Start here. " + unit.rstrip() + "\n"
    untouched = cut_repetition(WriterResult("No loop here at all.", "stop", {}))
    assert untouched.finish_reason == "stop" and untouched.dropped_text == ""


def test_one_word_over_and_over_is_no_loop_and_a_unit_past_the_bound_is_not_looked_for():
    assert find_repeat("x " * 40) is None  # one different word: data, not a loop
    assert find_repeat("x y z " * 6) == len(" ".join(["x y z"] * 3))
    distinct = " ".join(f"w{i}" for i in range(MAX_UNIT_WORDS + 1))
    assert find_repeat(f"{distinct} {distinct}") is None


def test_tables_and_runs_of_one_value_are_not_loops():
    """Markdown and data that repeat a token or two by nature: a wide table's delimiter row,
    a buffer of zeros, a hexdump line. A unit needs `MIN_UNIT_DISTINCT` different words."""
    cols = 10
    table = ("| " + " | ".join(f"c{i}" for i in range(cols)) + " |\n"
             + "| " + " | ".join(["---"] * cols) + " |\n"
             + "| " + " | ".join(str(i) for i in range(cols)) + " |\n")
    zeros = "```python\nbuf = [" + ", ".join(["0"] * 40) + "]\n```\n"
    hexdump = "0000: " + " ".join(["00"] * 16) + "\n"
    for text in (f"Intro.\n\n{table}\nAfter.", f"Make the buffer.\n\n{zeros}", hexdump):
        assert find_repeat(text) is None, text


def test_a_loop_inside_a_fence_keeps_only_what_came_before_the_fence():
    code = "```python\n# Sum it. Then print.\nx = [" + "a, b, c, " * 8 + "]\n```\n\nDone.\n"
    for intro in ("", "Intro paragraph.\n\n"):
        text = intro + code
        cut = find_repeat(text)
        assert cut is not None
        kept, dropped = kept_before_repeat(text, cut)
        assert kept.count("```") == 0 and kept.strip() == intro.strip()
        assert dropped.startswith("```python")


def test_a_loop_handed_on_in_one_piece_reaches_the_stream_only_up_to_its_first_copy():
    """A writer that answers whole hands its text on as one piece: the stream (and so the
    window, which keeps what the stream released) gets the text before the loop, not the
    complete blocks of the loop that came in the same piece."""
    from cdr.text.kept_stream import KeptStream

    para = "The datetime module supplies classes for manipulating dates and times."
    text = "Intro paragraph here.\n\n" + (para + "\n\n") * 6
    got: list[str] = []
    held = KeptStream(got.append)
    emit = Pieces(held.feed)
    emit(text)
    assert emit.repeating and emit.text == text  # all of it was written (and is counted)
    result = cut_repetition(WriterResult(emit.text, "stop", {}))
    kept = held.released_at_least(result.text)
    held.finish(kept)
    assert kept == f"Intro paragraph here.\n\n{para}\n" and "".join(got) == kept
