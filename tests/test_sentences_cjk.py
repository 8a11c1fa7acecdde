"""Chinese and Japanese sentence ends (`cdr.text.sentences`): `。！？` end a sentence with no
space after them; text without them is cut exactly as before; a document holding them is
cut anew at ingest (its hash says so) and a document without them keeps its hash."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cdr.ckf import CKF, DocumentInput, ingest_texts
from cdr.text.sentences import ends_sentence, finished_end, split_sentences


@pytest.mark.parametrize(("text", "want"), [
    ("这是第一句。这是第二句。", ["这是第一句。", "这是第二句。"]),
    ("真的吗？是的！好。", ["真的吗？", "是的！", "好。"]),
    ("「你好！」他说。", ["「你好！」", "他说。"]),  # a closer belongs to its sentence
    ("今日は晴れです。 明日は雨です。", ["今日は晴れです。", "明日は雨です。"]),
    ("PostgreSQL 支持索引。It is fast. 很快。", ["PostgreSQL 支持索引。", "It is fast.", "很快。"]),
    ("It is fast. 很快", ["It is fast.", "很快"]),  # a Latin sentence before an ideograph
    ("没有句号的文本", ["没有句号的文本"]),
])
def test_cjk_sentence_ends(text: str, want: list[str]) -> None:
    assert split_sentences(text) == want


def test_a_cut_cjk_text_keeps_its_finished_sentences() -> None:
    assert ends_sentence("这是第一句。") and not ends_sentence("这是第")
    assert finished_end("这是第一句。这是第") == len("这是第一句。")


WORD = st.sampled_from(["One", "two", "e.g.", "Dr.", "J.", "x", "3.5", "(a)", "\"q\"", "end."])


@settings(max_examples=200, deadline=None)
@given(st.lists(WORD, max_size=30), st.sampled_from(["。", "！", "？"]))
def test_a_cjk_end_only_adds_cuts(words: list[str], mark: str) -> None:
    """Appending a CJK sentence after any Latin text cuts the Latin part as before."""
    latin = " ".join(words)
    got = split_sentences(f"{latin} 中文句子{mark}")
    assert got[-1].endswith(f"中文句子{mark}")
    head = [*got[:-1], got[-1][: -len(f"中文句子{mark}")].rstrip()]
    assert [s for s in head if s] == split_sentences(latin)


def _facts(tmp: Path, name: str, text: str) -> list[str]:
    with CKF.create(tmp / f"{name}.ckf") as ckf:
        ingest_texts(ckf, [DocumentInput(f"{name}.md", text)])
    ckf = CKF.open(tmp / f"{name}.ckf")
    return [f.content for f in ckf.facts(range(ckf.n_rows))]


def test_a_long_chinese_paragraph_is_cut_at_its_sentence_ends(tmp_path: Path) -> None:
    sentence = "向量数据库保存每个事实的嵌入向量并按相似度检索它们。"
    facts = _facts(tmp_path, "zh", "# 向量\n\n" + sentence * 80 + "\n")
    assert len(facts) > 1
    assert all(f.endswith("。") for f in facts), facts[:3]


EN = "# A\n\n" + "Plain English text about indexes and the planner, long enough. " * 3 + "\n"
ZH = "# 中\n\n" + "向量数据库保存每个事实的嵌入向量并按相似度检索它们。" * 3 + "\n"


def test_only_a_document_with_cjk_changes_its_ingest_hash(tmp_path: Path) -> None:
    from cdr.ckf.ingest import CJK_CUT  # the marker the hash carries

    with CKF.create(tmp_path / "kb.ckf") as ckf:
        ingest_texts(ckf, [DocumentInput("en.md", EN), DocumentInput("zh.md", ZH)])
        en, zh = ckf.document_state("en.md"), ckf.document_state("zh.md")
    assert CJK_CUT and en is not None and zh is not None
    import hashlib

    from cdr.ckf.chunk import DEFAULT_CHUNKING
    from cdr.ckf.parse import PARSER_VERSION

    def plain_hash(data: bytes) -> str:
        recipe = f"cdr-ckf parser {PARSER_VERSION} {DEFAULT_CHUNKING!r}\0".encode()
        return hashlib.sha256(recipe + data).hexdigest()

    assert en["content_hash"] == plain_hash(EN.encode())  # as before
    assert zh["content_hash"] != plain_hash(ZH.encode())
