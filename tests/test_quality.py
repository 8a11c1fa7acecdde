"""The quality measures of docs/design.md §6 "Quality, measured the same way every time", on
hand-checked cases."""

from __future__ import annotations

import pytest

from cdr.report.quality import alpha_ndcg, cumulative_repetition, cwr6, fact_reuse, subtopic_recall


def test_cwr6():
    w1 = "a b c d e f g"  # 2 six-grams
    w2 = "a b c d e f x y z"  # "a b c d e f" repeated; 4 distinct six-grams
    assert cwr6([w1, w2]) == [0.0, 0.25]
    assert cwr6(["short", ""]) == [0.0, 0.0]


def test_cumulative_repetition():
    assert cumulative_repetition(["a b c d e f", "a b c d e f"]) == [0.0, 0.5]


def test_fact_reuse_and_recall():
    env = [["f1", "f2"], ["f2", "f3", "f4", "f5"], []]
    assert fact_reuse(env) == [0.0, 0.25, 0.0]
    labels = {"f1": "A", "f2": "A", "f3": "B", "f4": "X", "f5": "C"}
    assert subtopic_recall(env, labels, ["A", "B", "C", "D"]) == [0.25, 0.75, 0.75]


def test_alpha_ndcg():
    labels = {"a1": "A", "a2": "A", "b1": "B"}
    assert alpha_ndcg(["a1", "b1", "a2"], labels, ["A", "B"]) == pytest.approx(1.0)
    worse = alpha_ndcg(["a1", "a2", "b1"], labels, ["A", "B"])
    assert 0 < worse < 1
    assert alpha_ndcg(["zz"], labels, ["A"]) == 0.0
