"""cdr.text.markdown: the structure of model-written Markdown, and cutting text a token limit
interrupted back to its last complete block."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from cdr.text.markdown import keep_complete, parse_blocks
from cdr.writers.base import WriterResult, trim_truncated


def test_blocks_with_heading_paths_lists_and_code():
    text = ("Sure! Here is the guide.\n\n# Indexes\n\nIntro para.\n\n## B-tree\n\n"
            "- one\n- two\n\n```sql\n# not a heading\nCREATE INDEX i ON t(c);\n```\n\n"
            "**Hash indexes**\n\nHash text.\n")
    blocks = parse_blocks(text)
    assert [(b.kind, b.heading) for b in blocks] == [
        ("paragraph", None), ("heading", None), ("paragraph", "Indexes"),
        ("heading", "Indexes"), ("list", "B-tree"), ("code", "B-tree"),
        ("heading", "B-tree"), ("paragraph", "Hash indexes")]
    assert blocks[3].level == 2 and blocks[1].level == 1
    assert blocks[4].text == "- one\n- two"
    assert "CREATE INDEX" in blocks[5].text
    assert blocks[7].section == ("Indexes", "B-tree", "Hash indexes")


def test_plain_label_line_is_a_heading_but_a_sentence_is_not():
    blocks = parse_blocks("Introduction\n\nIndexes speed up reads.\n\nShort sentence.\n")
    assert [b.kind for b in blocks] == ["heading", "paragraph", "paragraph"]
    assert blocks[1].heading == "Introduction"


def test_keep_complete_drops_the_unfinished_paragraph_and_orphan_heading():
    text = "## A\n\nFirst complete paragraph.\n\n## B\n\nSecond one stops mid"
    kept, tail = keep_complete(text)
    assert kept == "## A\n\nFirst complete paragraph.\n"
    assert tail.strip() == "## B\n\nSecond one stops mid"


def test_keep_complete_inside_an_open_code_fence():
    text = "## A\n\nDone para.\n\n```python\nx = 1\n"
    kept, tail = keep_complete(text)
    assert kept == "## A\n\nDone para.\n" and tail.lstrip().startswith("```python")


def test_keep_complete_one_long_paragraph_keeps_finished_sentences():
    kept, tail = keep_complete("One sentence. Two sentences! Three is cut of")
    assert kept == "One sentence. Two sentences!\n" and tail == " Three is cut of"
    assert keep_complete("no sentence end at all") == ("", "no sentence end at all")


def test_trim_only_on_length():
    done = trim_truncated(WriterResult("A.\n\nB cut", "stop", {}))
    assert done.text == "A.\n\nB cut" and done.dropped_text == ""
    cut = trim_truncated(WriterResult("A.\n\nB cut", "length", {}))
    assert cut.text == "A.\n" and cut.dropped_text == "B cut"


@given(st.lists(st.text(alphabet="abc .#-\n`*", max_size=40), max_size=6))
def test_keep_complete_never_loses_text(parts):
    text = "\n\n".join(parts)
    kept, tail = keep_complete(text)
    # Everything written is either kept or handed back as the tail, in order.
    assert re.sub(r"\s", "", kept + tail) == re.sub(r"\s", "", text)
    assert text.startswith(kept.rstrip())
