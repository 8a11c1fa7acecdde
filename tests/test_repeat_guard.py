"""The opt-in repeat guard (`repeats: "drop"`, cdr.window.repeat_guard): what an earlier window
wrote, in the same words or the same meaning, is taken out of a window before Stage 8, reported,
streamed exactly as stored, and remembered across a stored session."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import jsonschema
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from cdr.ckf import CKF
from cdr.cli import app
from cdr.errors import InvalidInputError
from cdr.ngrams import ngram_hashes
from cdr.retrieval.embed import default_embedder
from cdr.session import Session
from cdr.text.kept_stream import KeptStream
from cdr.text.markdown import complete_blocks_end, line_starts, parse_blocks
from cdr.trace import TRACE_SCHEMA, build_trace
from cdr.window.loop import GenerationConfig, Generator
from cdr.window.repeat_guard import (
    MIN_MEANING_WORDS,
    REPEAT_SHARE,
    RESTATE_COSINE,
    RepeatGuard,
    split_items,
    split_sentences,
)
from cdr.writers.base import WriterResult

EMBEDDER = default_embedder()
DIM = EMBEDDER.dim

EARLIER = ("## Module contents\n\nThe dataclasses module provides a decorator and functions for "
           "automatically adding generated special methods to user-defined classes.\n")
SAME_WORDS = ("The dataclasses module provides a decorator and functions for automatically "
              "adding generated special methods to user-defined classes.")
SAME_MEANING = ("This module offers a decorator plus helper functions that automatically add "
                "generated special methods to classes you define.")
NEW = "Setting frozen to true makes assigning to a field raise FrozenInstanceError."


def guard_after(*earlier_texts: str) -> RepeatGuard:
    """The guard a window gets after windows that kept `earlier_texts`."""
    seen: set[int] = set()
    sentences: list[str] = []
    for text in earlier_texts:
        seen.update(ngram_hashes(text).tolist())
        for b in parse_blocks(text):
            if b.kind == "paragraph":
                sentences += split_sentences(b.text)
    vecs = EMBEDDER.encode(sentences) if sentences else np.zeros((0, DIM), np.float32)
    return RepeatGuard(seen.__contains__, vecs, EMBEDDER.encode)


# ------------------------------------------------------------------ units


def test_sentences_and_items_are_cut_as_written():
    # The one sentence rule (`cdr.text.sentences`): a colon or a lower-case start ends no
    # sentence, an abbreviation neither.
    assert split_sentences("One two. Three `a.b` four: five! Six, e.g. Seven") == [
        "One two.", "Three `a.b` four: five!", "Six, e.g. Seven"]
    assert split_sentences("Ends (here.) Next one.") == ["Ends (here.)", "Next one."]
    assert split_items("- a\n  more a\n- b\n   1. nested\n\n* c") == [
        "- a\n  more a", "- b\n   1. nested\n", "* c"]


def test_a_window_with_nothing_said_before_comes_back_byte_for_byte():
    text = ("\n## Frozen instances\n\n" + NEW +
            "\n\n- one item here and now\n\n```python\nx = 1\n```\n")
    kept = guard_after(EARLIER).filter(text)
    assert kept.text == text and kept.dropped == []
    assert kept.vectors.shape == (2, DIM)  # the sentence and the item (code is not prose)


def test_same_words_and_same_meaning_are_dropped_and_reported():
    text = (f"## Module contents\n\n{SAME_WORDS} {NEW}\n\n## Again\n\n{SAME_MEANING}\n\n"
            "## Fresh\n\nA field with init=False is left out of the generated __init__.\n")
    kept = guard_after(EARLIER).filter(text)
    assert kept.dropped == [SAME_WORDS, SAME_MEANING]
    # The emptied section loses its heading; the others keep theirs and their new text.
    assert kept.text == (f"## Module contents\n\n{NEW}\n\n## Fresh\n\nA field with "
                         "init=False is left out of the generated __init__.\n")
    assert kept.vectors.shape == (2, DIM)


def test_the_thresholds_are_the_documented_ones():
    vecs = EMBEDDER.encode([SAME_WORDS, SAME_MEANING, NEW])
    assert float(vecs[0] @ vecs[1]) >= RESTATE_COSINE > float(vecs[0] @ vecs[2])
    # Exactly half the 6-grams already written is a repeat; one fewer is not.
    words = [f"w{i}" for i in range(13)]  # 8 distinct 6-grams
    before = " ".join(words[:9])  # holds the first 4 of them
    g = RepeatGuard(set(ngram_hashes(before).tolist()).__contains__,
                    np.zeros((0, DIM), np.float32), EMBEDDER.encode)
    assert REPEAT_SHARE == 0.5
    assert g.filter(" ".join(words) + ".").dropped == [" ".join(words) + "."]
    assert g.filter(" ".join(words[1:]) + ".").dropped == []  # 3 of 7 seen


def test_code_retyped_is_dropped_and_short_prose_is_never_judged_by_meaning():
    code = "```python\nfrom dataclasses import dataclass\n\n@dataclass\nclass P:\n    x: int\n```"
    g = guard_after(EARLIER + "\n" + code + "\n")
    kept = g.filter(f"For example:\n\n{code}\n\nThe decorator adds methods.\n")
    assert code in kept.dropped and "For example:" in kept.text
    assert MIN_MEANING_WORDS > 2  # "For example:" is two words: never judged by meaning


def test_repeats_inside_the_window_count_too():
    kept = guard_after().filter(f"{NEW}\n\n{NEW}\n")
    assert kept.dropped == [NEW] and kept.text.count(NEW) == 1


# ------------------------------------------------------------------ properties

WORDS = st.sampled_from(["alpha", "beta", "gamma", "deque", "the", "items", "Counter", "field",
                         "frozen", "default", "factory", "returns", "value", "class"])
SENTENCE = st.lists(WORDS, min_size=3, max_size=10).map(lambda w: " ".join(w).capitalize() + ".")
PARAGRAPH = st.lists(SENTENCE, min_size=1, max_size=3).map(" ".join)
HEADING = st.lists(WORDS, min_size=1, max_size=3).map(lambda w: "## " + " ".join(w).title())
LIST = st.lists(SENTENCE, min_size=1, max_size=3).map(lambda i: "\n".join("- " + x for x in i))
BLOCK = st.one_of(PARAGRAPH, HEADING, LIST, PARAGRAPH)
DOCUMENT = st.lists(BLOCK, min_size=1, max_size=7).map("\n\n".join)
SLOW = settings(max_examples=40, deadline=None,
                suppress_health_check=[HealthCheck.too_slow])


def units_of(text: str) -> list[str]:
    out: list[str] = []
    for b in parse_blocks(text):
        if b.kind == "paragraph":
            out += split_sentences(b.text)
        elif b.kind == "list":  # reported without the marker
            out += [re.sub(r"^(?:[-*+]|\d+[.)])\s*", "", i.strip()) for i in split_items(b.text)]
    return out


@SLOW
@given(DOCUMENT, DOCUMENT, st.lists(st.integers(1, 40), min_size=1, max_size=60))
def test_streamed_equals_kept_and_nothing_is_lost(earlier, text, sizes):
    g = guard_after(earlier)
    kept = g.filter(text)
    got: list[str] = []
    held = KeptStream(got.append, lambda t: g.filter(t).text)
    i = 0
    for size in sizes * 50:
        if i >= len(text):
            break
        held.feed(text[i:i + size])
        i += size
    held.finish(kept.text)
    assert "".join(got) == kept.text
    # Every unit is either kept or reported; the kept ones are not repeats any more.
    assert sorted(units_of(kept.text) + kept.dropped) == sorted(units_of(text))
    assert guard_after(earlier).filter(kept.text).dropped == []
    if not kept.dropped:
        assert kept.text == text


# ------------------------------------------------------------------ the loop


class EchoWriter:
    """A writer that opens every window with the same paragraph, then one new sentence: what
    the reference model does to a section it is asked to continue."""

    name = "echo"

    NEW = ("Integers have unlimited precision in Python.",
           "A set holds unordered distinct hashable objects.",
           "Dictionary views reflect later changes to their dictionary.")

    def __init__(self) -> None:
        self.calls = 0

    def generate(self, messages, max_tokens, *, on_delta=None):
        self.calls += 1
        text = f"## Numeric types\n\n{SAME_WORDS}\n\n{self.NEW[self.calls - 1]}\n"
        if on_delta is not None:
            for line in text.splitlines(keepends=True):
                on_delta(line)
        return WriterResult(text, "stop", {"completion_tokens": 40})


def test_the_loop_drops_repeats_streams_what_it_keeps_and_remembers_them(types_ckf_path: Path):
    cfg = GenerationConfig(max_windows=3, words=6000, repeats="drop")
    gen = Generator(CKF.open(types_ckf_path), EchoWriter(), cfg)
    session = gen.start("Write a guide to Python's built-in types",
                        "Numeric types\nSequence types\nMapping types")
    streamed: dict[int, str] = {}
    first = gen.step(session, lambda n, piece: streamed.__setitem__(n, streamed.get(n, "") +
                                                                     piece))
    assert first.dropped == [] and SAME_WORDS in first.output
    n_first = len(session.written_vectors)
    assert n_first == 2
    # Stored and reloaded between windows: the guard decides the same from storage.
    session = Session.from_json(session.to_json(), gen.index.ngram_index)
    assert np.allclose(session.written_vectors[:n_first],
                       session.written_vectors[:n_first].astype(np.float16))
    second = gen.step(session, lambda n, piece: streamed.__setitem__(n, streamed.get(n, "") +
                                                                      piece))
    assert second.dropped == [SAME_WORDS]
    assert SAME_WORDS not in second.output and EchoWriter.NEW[1] in second.output
    assert streamed[2].strip() == second.output.strip()
    assert len(session.written_vectors) == n_first + 1
    # Stage 8 credits only what was kept: the repeated paragraph earned nothing.
    assert sum(second.report.words.values()) <= len(second.output.split()) < len(
        second.output.split()) + len(SAME_WORDS.split())
    trace = build_trace(session, [first, second])
    jsonschema.validate(trace, TRACE_SCHEMA)
    assert trace["options"] == {"repeats": "drop"}
    assert trace["windows"][1]["dropped"] == [SAME_WORDS] and "dropped" not in trace["windows"][0]


def test_without_the_option_the_window_is_kept_as_written(types_ckf_path: Path):
    gen = Generator(CKF.open(types_ckf_path), EchoWriter(), GenerationConfig(max_windows=2,
                                                                          words=6000))
    session = gen.start("Write a guide to Python's built-in types", "Numeric types\nMapping")
    events = list(gen.run("x", session=session))
    assert all(SAME_WORDS in e.output and e.dropped == [] for e in events)
    assert session.written_vectors is None and "written_vectors" not in session.to_dict()


def test_damaged_written_vectors_are_refused_naming_the_field(types_ckf_path: Path):
    gen = Generator(CKF.open(types_ckf_path), EchoWriter(),
                    GenerationConfig(max_windows=2, words=6000, repeats="drop"))
    session = gen.start("Write a guide to Python's built-in types", "Numeric types\nMapping")
    gen.step(session)
    stored = session.to_dict()
    assert "written_vectors" in stored
    for bad in (7, "!!!", "AAAA"):  # not text; not base64; 3 bytes, not whole float16 rows
        with pytest.raises(InvalidInputError, match="written_vectors"):
            Session.from_dict(stored | {"written_vectors": bad})


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}


@pytest.mark.parametrize(("option", "value"), [("repeats", "hide"), ("subject", "title"),
                                               ("lexical", "tfidf"), ("stale", "skip")])
def test_cli_refuses_an_unknown_option_value_and_leaves_the_ckf_as_it_was(
        types_ckf_path: Path, tmp_path: Path, option: str, value: str):
    ckf = tmp_path / "ckf"
    shutil.copytree(types_ckf_path, ckf)
    before = _tree(ckf)
    r = CliRunner().invoke(app, ["generate", "Write a guide to Python's built-in types",
                                 "--ckf", str(ckf), f"--{option}", value,
                                 "--out", str(tmp_path / "o.md")])
    assert r.exit_code == 2
    assert f"unknown {option} option '{value}'" in r.output and f"--{option}" in r.output
    assert "Traceback" not in r.output and not (tmp_path / "o.md").exists()
    assert _tree(ckf) == before


def test_cli_repeats_drop_reaches_the_trace(types_ckf_path: Path, tmp_path: Path):
    trace = tmp_path / "t.json"
    r = CliRunner().invoke(app, ["generate", "Write a guide to Python's built-in types",
                                 "--ckf", str(types_ckf_path), "--windows", "2",
                                 "--profile", "spec", "--repeats", "drop", "--trace", str(trace),
                                 "--out", str(tmp_path / "o.md")])
    assert r.exit_code == 0, r.output
    doc = json.loads(trace.read_text(encoding="utf-8"))
    jsonschema.validate(doc, TRACE_SCHEMA)
    assert doc["options"] == {"repeats": "drop"}


# Line endings a model's text can hold: CommonMark ends lines at the first three only, and
# `str.splitlines` at all of them, so offsets taken from the one and the parser's line
# numbers from the other used to drift apart (a window of "\r\r0" failed with an error).
LINE_END = st.sampled_from(["\n", "\r\n", "\r", "\u2028", "\x0c", "\x85", "\x1c", "\n\n",
                            "\r\r", "\r\n\r\n"])
LINE = st.sampled_from(["## Frozen instances", NEW, "- one item here and now", "```python",
                        "x = 1", "```", "   ", "0", "Setting order makes comparisons work."])


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(LINE, LINE_END), max_size=14, unique_by=lambda t: t[0]))
def test_any_line_endings_come_back_byte_for_byte_and_cut_at_a_line(lines):
    text = "".join(line + end for line, end in lines)
    assert guard_after(EARLIER).filter(text).text == text
    assert complete_blocks_end(text) in line_starts(text)
