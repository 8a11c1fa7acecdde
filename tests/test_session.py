"""Session state: §7.2 updates with docs/design.md §3.4–3.6 readings, exits, exact JSON round
trips."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cdr.coverage import SubQuery
from cdr.errors import EmbeddingModelMismatchError, InvalidInputError
from cdr.ngrams import NgramIndex, ngram_hashes
from cdr.session import Session, depth_from_words, exit_reason

MODEL = "sentence-transformers/all-MiniLM-L6-v2"


def make_session(n=3, d=8, seed=0, **kw) -> Session:
    rng = np.random.default_rng(seed)
    sqs = [SubQuery(f"sq-{i + 1}", f"topic {i + 1}", 300) for i in range(n)]
    return Session.start("Write a guide", sqs, rng.normal(size=(n, d)), rng.normal(size=d),
                         MODEL, **kw)


def test_depth_from_words_matches_spec_examples():
    assert depth_from_words(280, 300) == pytest.approx(0.90)
    assert depth_from_words(60, 300) == pytest.approx(0.20)
    assert depth_from_words(900, 300) == 0.90
    assert depth_from_words(0, 300) == 0.0
    with pytest.raises(InvalidInputError):
        depth_from_words(10, 0)


def test_cumulative_residual_and_completeness():
    s = make_session()
    rec = s.update_after_window({"sq-1": 0.9, "sq-2": 0.4}, "alpha", embedding_model_id=MODEL)
    assert s.window_count == 1 and rec.number == 1
    assert s.residual_ids == ["sq-2", "sq-3"]
    assert len(s.coverage) == 2
    assert s.coverage.window_numbers.tolist() == [1, 1]
    assert s.completeness() == pytest.approx((1.0 + 0.4 / 0.9 + 0.0) / 3)
    s.update_after_window({"sq-2": 0.4, "sq-3": 0.9}, "beta", embedding_model_id=MODEL)
    assert s.residual_ids == []
    assert s.cumulative_depth["sq-2"] == pytest.approx(0.8)
    assert s.completeness() == pytest.approx((1 + 0.8 / 0.9 + 1) / 3)
    assert s.exit_reason(0.9) == "task-complete"  # 0.96 ≥ 0.92 and nothing left


def test_exit_rules_priority_and_edges():
    kw = dict(completeness=0.5, residual_empty=False, window_count=2, max_windows=5,
              mean_novelty_ratio=0.5, safety_budget=1.0)
    assert exit_reason(**kw) is None
    assert exit_reason(**{**kw, "completeness": 0.92, "residual_empty": True}) == "task-complete"
    assert exit_reason(**{**kw, "completeness": 0.92}) is None
    assert exit_reason(**{**kw, "window_count": 5}) == "limit-reached"
    assert exit_reason(**{**kw, "mean_novelty_ratio": 0.14}) == "ckf-exhausted"
    assert exit_reason(**{**kw, "mean_novelty_ratio": None}) == "ckf-exhausted"
    assert exit_reason(**{**kw, "safety_budget": 0.10}) == "safety-budget-depleted"
    # priority: completion beats the limit, the limit beats exhaustion
    assert exit_reason(**{**kw, "completeness": 1.0, "residual_empty": True, "window_count": 5,
                          "mean_novelty_ratio": 0.0}) == "task-complete"
    assert exit_reason(**{**kw, "window_count": 5, "mean_novelty_ratio": 0.0,
                          "safety_budget": 0.0}) == "limit-reached"


def test_model_mismatch_is_refused_and_changes_nothing():
    s = make_session()
    before = s.to_json()
    with pytest.raises(EmbeddingModelMismatchError) as err:
        s.update_after_window({"sq-1": 0.9}, "x", embedding_model_id="text-embedding-3-large")
    assert MODEL in str(err.value) and "text-embedding-3-large" in str(err.value)
    assert s.to_json() == before


def test_unknown_subquery_or_bad_depth_changes_nothing():
    s = make_session()
    before = s.to_json()
    with pytest.raises(InvalidInputError, match="unknown sub-query"):
        s.update_after_window({"sq-1": 0.5, "sq-9": 0.5}, "x", embedding_model_id=MODEL)
    with pytest.raises(InvalidInputError, match="depth_weight"):
        s.update_after_window({"sq-1": 1.5}, "x", embedding_model_id=MODEL)
    assert s.to_json() == before


def test_start_validation():
    with pytest.raises(InvalidInputError, match="task is empty"):
        make_session().start(" ", [SubQuery("a", "a")], np.ones((1, 2)), np.ones(2), MODEL)
    with pytest.raises(InvalidInputError, match="no sub-queries"):
        Session.start("t", [], np.ones((0, 2)), np.ones(2), MODEL)
    with pytest.raises(InvalidInputError, match="max_windows"):
        make_session(max_windows=0)
    with pytest.raises(InvalidInputError, match="max_windows"):
        make_session(max_windows=21)
    with pytest.raises(InvalidInputError, match="not unique"):
        Session.start("t", [SubQuery("a", "a"), SubQuery("a", "b")], np.ones((2, 2)), np.ones(2),
                      MODEL)
    with pytest.raises(InvalidInputError, match="zero vector"):
        Session.start("t", [SubQuery("a", "a")], np.zeros((1, 2)), np.ones(2), MODEL)
    with pytest.raises(InvalidInputError, match="unknown ranking"):
        make_session(ranking="bm25")


def test_safety_budget():
    s = make_session()
    s.spend_safety(0.5)
    s.spend_safety(0.45)
    assert s.safety_budget == pytest.approx(0.05)
    assert s.exit_reason(0.9) == "safety-budget-depleted"
    with pytest.raises(InvalidInputError):
        s.spend_safety(-1)


def test_blacklist_counts_follow_window_text_with_index():
    facts = ["the quick brown fox jumps over the lazy dog", "nothing in common here at all ok",
             "quick brown fox jumps over the fence"]
    idx = NgramIndex.from_texts(facts)
    s = make_session(ngram_index=idx)
    s.update_after_window({}, "a quick brown fox jumps over the lazy cat", embedding_model_id=MODEL)
    # window 6-grams: "quick brown fox jumps over the" (in facts 0 and 2), "brown fox jumps over
    # the lazy" (fact 0 only), plus ones held by no fact
    assert s.blacklist.counts.tolist() == [2, 0, 1]
    reloaded = Session.from_json(s.to_json(), idx)
    assert reloaded.blacklist.counts.tolist() == [2, 0, 1]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.sets(st.sampled_from(["sq-1", "sq-2", "sq-3", "sq-4"])),
                          st.text(max_size=80)), max_size=5),
       st.integers(0, 1000))
def test_json_round_trip_is_exact(windows, seed):
    s = make_session(n=4, d=16, seed=seed)
    rng = np.random.default_rng(seed)
    for ids, text in windows:
        s.update_after_window({i: float(rng.choice([0.0, 0.15, 0.4, 0.9])) for i in ids}, text,
                              embedding_model_id=MODEL)
    text = s.to_json()
    back = Session.from_json(text)
    assert back.to_json() == text
    np.testing.assert_array_equal(back.coverage.embeddings, s.coverage.embeddings)
    np.testing.assert_array_equal(back.sub_query_embeddings, s.sub_query_embeddings)
    c_back, c_orig = back.coverage.centroid(), s.coverage.centroid()
    assert (c_back is None and c_orig is None) or np.array_equal(c_back, c_orig)
    assert back.blacklist.as_array().tolist() == s.blacklist.as_array().tolist()
    assert json.loads(text)["window_count"] == len(windows)


def test_from_json_errors():
    with pytest.raises(InvalidInputError, match="malformed"):
        Session.from_json("{not json")
    with pytest.raises(InvalidInputError, match="schema"):
        Session.from_json('{"schema": 99}')


def test_residual_set_view_tracks_updates():
    s = make_session()
    assert s.residual.ids == ["sq-1", "sq-2", "sq-3"]
    s.update_after_window({"sq-2": 0.9}, "", embedding_model_id=MODEL)
    assert s.residual.ids == ["sq-1", "sq-3"]
    np.testing.assert_array_equal(s.residual.embeddings, s.sub_query_embeddings[[0, 2]])
    assert len(ngram_hashes("a b c d e f")) == 1
