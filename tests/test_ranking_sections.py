"""Ranking mode `sections` (per-section retrieval): the merge, `rank`, the loop, CLI, gateway."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from cdr.ckf import CKF
from cdr.cli import app
from cdr.errors import InvalidInputError
from cdr.gateway.schemas import GenerationOptions
from cdr.ranking import RANKING_MODES, check_mode, rank, sections_order
from cdr.window.loop import GenerationConfig, Generator
from cdr.writers import get_writer
from tests.conftest import BUILTIN_TYPES_OUTLINE, BUILTIN_TYPES_TASK


def unit(*rows: list[float]) -> np.ndarray:
    x = np.asarray(rows, dtype=np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_sections_is_a_ranking_mode() -> None:
    assert "sections" in RANKING_MODES
    assert check_mode("sections") == "sections"


def test_merge_takes_each_sections_best_in_turn() -> None:
    # Candidates 0-3; section A prefers 0 > 1 > 2, section B prefers 3 > 1.
    sims = np.array([[0.9, 0.1], [0.8, 0.7], [0.6, 0.0], [0.2, 0.95]], np.float32)
    order, score, rel = sections_order(sims, np.ones(4, np.float32), 0.5)
    # Turn 1: A's 0, B's 3; turn 2: A's 1, B's 1 (already placed); turn 3: A's 2.
    assert order.tolist() == [0, 3, 1, 2]
    np.testing.assert_allclose(rel, [0.9, 0.95, 0.8, 0.6])
    np.testing.assert_allclose(score, [0.9, 0.95, 0.8, 0.6])


def test_merge_weighs_importance_and_drops_what_no_section_gates_in() -> None:
    sims = np.array([[0.9, 0.0], [0.7, 0.0], [0.3, 0.3]], np.float32)
    order, score, rel = sections_order(sims, np.array([0.5, 1.0, 1.0], np.float32), 0.5)
    assert order.tolist() == [1, 0]  # 0.7 × 1.0 beats 0.9 × 0.5; candidate 2 fails the gate
    np.testing.assert_allclose(score, [0.7, 0.45])
    np.testing.assert_allclose(rel, [0.7, 0.9])


def test_merge_of_nothing_is_empty() -> None:
    order, score, rel = sections_order(np.zeros((0, 2), np.float32), np.zeros(0), 0.5)
    assert order.size == score.size == rel.size == 0


def test_rank_sections_uses_the_sections_not_the_query() -> None:
    emb = unit([1, 0, 0], [0, 1, 0], [0.6, 0.8, 0], [0, 0, 1])
    query_rel = np.array([0.0, 0.0, 0.0, 1.0], np.float32)  # the query would pick 3 only
    secs = unit([1, 0, 0], [0, 1, 0])
    r = rank(emb, query_rel, mode="sections", sections=secs, min_relevance=0.5,
             rows=np.array([10, 11, 12, 13]))
    assert r.mode == "sections"
    assert r.indices.tolist() == [10, 11, 12]  # A: 0 > 2, B: 1 > 2 → 0, 1, then 2
    # 2 is second in both lists; turn 2 reaches section A first, so A's cosine is its relevance.
    np.testing.assert_allclose(r.relevance, [1.0, 1.0, 0.6], rtol=1e-6)
    assert np.all(r.novelty == 1) and np.all(r.ngram_penalty == 0)
    assert r.n_candidates == 3
    assert len(rank(emb, query_rel, mode="sections", sections=secs, min_relevance=0.5,
                    top_k=2)) == 2


def test_rank_sections_errors() -> None:
    emb = unit([1, 0], [0, 1])
    with pytest.raises(InvalidInputError, match="needs the planned sections"):
        rank(emb, np.ones(2), mode="sections")
    with pytest.raises(InvalidInputError, match="sections has shape"):
        rank(emb, np.ones(2), mode="sections", sections=np.ones((1, 3)))
    with pytest.raises(InvalidInputError, match="relevance has shape"):
        rank(emb, np.ones(3), mode="sections", sections=unit([1, 0]))


@pytest.fixture(scope="module")
def types_ckf(types_ckf_path: Path) -> CKF:
    return CKF.open(types_ckf_path)


def test_loop_with_sections_retrieves_for_the_planned_sections(types_ckf: CKF) -> None:
    gen = Generator(types_ckf, get_writer("extractive"),
                    GenerationConfig(ranking="sections", max_windows=3, words=3000))
    session = gen.start(BUILTIN_TYPES_TASK, BUILTIN_TYPES_OUTLINE)
    assert session.ranking == "sections"
    events = list(gen.run(BUILTIN_TYPES_TASK, session=session))
    assert events and all(e.prepared.envelope.ranking.mode == "sections" for e in events
                          if len(e.prepared.envelope))
    first = events[0].prepared
    # Every planned section of Window 1 got facts (the merge gives each section its turn).
    assert first.plan and all(p.fact_refs for p in first.plan)
    # Relevance is to a planned section, so at least the gate.
    assert float(first.envelope.ranking.relevance.min()) >= session.min_relevance - 1e-6


def test_cli_and_gateway_accept_sections(types_ckf_path: Path, tmp_path: Path) -> None:
    outline = tmp_path / "o.txt"
    outline.write_text("Numeric types\nSequence types\n", encoding="utf-8")
    res = CliRunner().invoke(app, ["generate", BUILTIN_TYPES_TASK, "--ckf", str(types_ckf_path),
                                   "--outline", str(outline), "--windows", "1",
                                   "--ranking", "sections"])
    assert res.exit_code == 0, res.output
    assert GenerationOptions(ranking="sections").ranking == "sections"
    with pytest.raises(ValueError, match="ranking"):
        GenerationOptions(ranking="bm25")
