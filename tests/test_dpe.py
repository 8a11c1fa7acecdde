"""Decomposition and Stage 8 verification."""

from __future__ import annotations

import numpy as np
import pytest

from cdr.coverage import SubQuery
from cdr.errors import InvalidInputError
from cdr.retrieval.subject import task_topic
from cdr.window.dpe import (
    decompose_from_facts,
    parse_outline,
    split_paragraphs,
    split_words,
    verify_window,
    word_count,
)


def test_parse_outline_strips_markers_and_splits_words():
    sqs = parse_outline("# Intro\n\n- Creating tasks\n* Timeouts\n3. Cancellation\n  \n", 1000)
    assert [s.text for s in sqs] == ["Intro", "Creating tasks", "Timeouts", "Cancellation"]
    assert [s.id for s in sqs] == ["sq-1", "sq-2", "sq-3", "sq-4"]
    assert [s.expected_words for s in sqs] == [250, 250, 250, 250]
    with pytest.raises(InvalidInputError, match="no lines"):
        parse_outline("\n - \n#\n")


def test_split_words():
    assert split_words(10, 3) == [4, 3, 3]
    with pytest.raises(InvalidInputError):
        split_words(2, 3)


def test_task_topic_drops_instruction_words():
    assert task_topic("Write a comprehensive guide to asyncio tasks") == "asyncio tasks"
    assert task_topic("Explain the logging module") == "logging module"
    assert task_topic("asyncio tasks") == "asyncio tasks"


def test_split_paragraphs_keeps_heading_context():
    text = "## Timeouts\n\nFirst para here.\n\nSecond para.\n## Other\nThird."
    assert split_paragraphs(text) == [("Timeouts", "First para here."),
                                      ("Timeouts", "Second para."), ("Other", "Third.")]


def test_verify_by_heading_and_by_similarity():
    sqs = [SubQuery("sq-1", "Timeouts", 100), SubQuery("sq-2", "Cancellation", 20)]
    sq_emb = np.array([[1, 0, 0], [0, 1, 0]], np.float32)
    paragraphs = [("Timeouts", " ".join(["w"] * 95)), (None, "cancel " * 30),
                  (None, "unrelated words here")]
    p_emb = np.array([[0, 0, 1], [0.2, 0.98, 0], [0.1, 0.1, 0.99]], np.float32)
    rep = verify_window(sqs, sq_emb, p_emb, paragraphs, threshold=0.3)
    assert rep.words == {"sq-1": 95, "sq-2": 30}
    assert rep.addressed == {"sq-1": pytest.approx(0.9), "sq-2": pytest.approx(0.9)}
    assert rep.unattributed_words == 3
    assert rep.attribution == ["sq-1", "sq-2", None]
    assert word_count("a b, c") == 3


def test_decompose_from_facts_names_clusters_by_sections():
    rng = np.random.default_rng(0)
    centres = np.eye(8, dtype=np.float32)[:3]
    emb, sections = [], []
    for j, name in enumerate(["Page > Alpha", "Page > Beta", "Page > Gamma"]):
        for _ in range(10):
            v = centres[j] + 0.05 * rng.normal(size=8)
            emb.append(v / np.linalg.norm(v))
            sections.append(name)
    sqs = decompose_from_facts(np.array(emb, np.float32), sections, 3, 900)
    assert sorted(s.text for s in sqs) == ["Alpha", "Beta", "Gamma"]
    assert sqs[0].text == "Alpha"  # the cluster of the best-ranked fact comes first
    assert sum(s.expected_words for s in sqs) == 900
    with pytest.raises(InvalidInputError):
        decompose_from_facts(np.zeros((0, 8), np.float32), [], 3)
