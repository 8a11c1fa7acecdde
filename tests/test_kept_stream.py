"""KeptStream: what a stream releases is exactly what the window keeps (issue 9: a streamed
response must not carry the tail a token-limited window drops)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from cdr.text.kept_stream import KeptStream
from cdr.text.markdown import keep_complete

WORDS = st.sampled_from(["alpha", "beta", "gamma", "deque", "the", "items", "Counter", "x"])
SENTENCE = st.lists(WORDS, min_size=2, max_size=9).map(lambda w: " ".join(w).capitalize() + ".")
PARAGRAPH = st.lists(SENTENCE, min_size=1, max_size=4).map(" ".join)
HEADING = st.tuples(st.sampled_from(["#", "##", "###"]), st.lists(WORDS, min_size=1, max_size=4)
                    ).map(lambda t: f"{t[0]} {' '.join(t[1]).title()}")
LIST = st.lists(SENTENCE, min_size=1, max_size=4).flatmap(
    lambda items: st.sampled_from(["- ", "1. ", "* "]).flatmap(
        lambda mark: st.sampled_from(["\n", "\n\n"]).map(
            lambda sep: sep.join(mark + i for i in items))))
CODE = st.lists(WORDS, min_size=1, max_size=6).map(
    lambda w: "```python\n" + "\n\n".join(f"{x} = 1" for x in w) + "\n```")
LABEL = st.lists(WORDS, min_size=1, max_size=3).map(lambda w: " ".join(w).title())
BLOCK = st.one_of(PARAGRAPH, HEADING, LIST, CODE, LABEL, PARAGRAPH)
DOCUMENT = st.lists(BLOCK, min_size=1, max_size=8).map("\n\n".join)


def stream(text: str, cut: int, sizes: list[int]) -> tuple[str, str]:
    """Stream text[:cut] in pieces of the given sizes as a token-limited window; return
    (everything the sink received, the text the window keeps)."""
    got: list[str] = []
    held = KeptStream(got.append)
    written = text[:cut]
    i = 0
    for size in sizes:
        if i >= len(written):
            break
        held.feed(written[i:i + size])
        i += size
    if i < len(written):
        held.feed(written[i:])
    kept, _ = keep_complete(written)
    assert held.released_at_least(kept) == kept  # a token-limit cut holds every released block
    held.finish(kept)
    return "".join(got), kept


@settings(max_examples=300, deadline=None)
@given(DOCUMENT, st.floats(0, 1), st.lists(st.integers(1, 12), min_size=1, max_size=400))
def test_a_cut_window_streams_exactly_the_text_it_keeps(doc, where, sizes):
    streamed, kept = stream(doc, int(len(doc) * where), sizes)
    assert streamed == kept


@settings(max_examples=100, deadline=None)
@given(DOCUMENT, st.lists(st.integers(1, 12), min_size=1, max_size=400))
def test_a_finished_window_streams_all_of_it(doc, sizes):
    got: list[str] = []
    held = KeptStream(got.append)
    i = 0
    for size in [*sizes, len(doc)]:
        held.feed(doc[i:i + size])
        i += size
    assert held.released_at_least(doc) == doc  # a finished text holds every released block
    held.finish(doc)
    assert "".join(got) == doc


def test_the_unfinished_block_is_held_until_the_next_begins():
    got: list[str] = []
    held = KeptStream(got.append)
    held.feed("## Deque objects\n\nA deque is a double-ended queue.")
    assert got == []  # the heading has nothing complete under it yet
    held.feed(" It supports appends.\n\nRotation moves items")
    first = "## Deque objects\n\nA deque is a double-ended queue. It supports appends."
    assert "".join(got) == first
    held.finish(first + "\n")
    assert "".join(got).endswith("appends.\n") and "Rotation" not in "".join(got)


def test_a_kept_text_that_disagrees_with_the_stream_sends_nothing_more():
    got: list[str] = []
    held = KeptStream(got.append)
    held.feed("First paragraph.\n\nSecond")
    held.finish("Something else entirely.\n")
    assert "".join(got) == "First paragraph."


def test_a_list_cut_by_the_limit_keeps_its_finished_items():
    text = ("## Handlers\n\nThe handlers module provides these:\n\n- StreamHandler writes to a "
            "stream.\n- FileHandler writes to a file.\n  It opens the file itself.\n- Rotating")
    kept, tail = keep_complete(text)
    assert kept == ("## Handlers\n\nThe handlers module provides these:\n\n- StreamHandler "
                    "writes to a stream.\n- FileHandler writes to a file.\n  It opens the file "
                    "itself.\n")
    assert tail == "- Rotating" and kept + tail == text
    # One item begun: nothing of the list is finished, the cut falls before it.
    assert keep_complete("Intro.\n\n- only one item, cut")[0] == "Intro.\n"
    # Nested items do not count as the list's own.
    assert keep_complete("Intro.\n\n- a\n  - a1\n  - a2 cut")[0] == "Intro.\n"
    # Streamed item by item: each finished item is released as soon as the next begins.
    got: list[str] = []
    held = KeptStream(got.append)
    for line in text.splitlines(keepends=True):
        held.feed(line)
    assert "".join(got).endswith("- StreamHandler writes to a stream.")  # before the window ends
    held.finish(kept)
    assert "".join(got) == kept


@settings(max_examples=300, deadline=None)
@given(DOCUMENT, st.lists(BLOCK, min_size=1, max_size=3), st.integers(2, 4),
       st.lists(st.integers(1, 12), min_size=1, max_size=400))
def test_a_window_stopped_at_its_loop_streams_exactly_the_text_it_keeps(doc, unit, copies,
                                                                        sizes):
    """The writer stops once the text repeats itself (`cdr.text.self_repeat`) and keeps the
    text before the loop; where the stream already released blocks of the second copy (a
    loop of several blocks), the window keeps those too, so the stream and the window agree."""
    from cdr.writers.base import Pieces, WriterResult, cut_repetition

    loop = "\n\n".join(unit)
    text = doc + "\n\n" + "\n\n".join([loop] * copies) + "\n\n"
    got: list[str] = []
    held = KeptStream(got.append)
    emit = Pieces(held.feed)
    i = 0
    for size in [*sizes, len(text)]:
        emit(text[i:i + size])
        i += size
        if emit.repeating or i >= len(text):
            break
    result = cut_repetition(WriterResult(emit.text, "stop", {}))
    kept = held.released_at_least(result.text)
    held.finish(kept)
    assert "".join(got) == kept
    assert text.startswith(kept.rstrip())
