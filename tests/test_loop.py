"""The window loop end to end on a real corpus, with the extractive writer and a real LLM wire."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import numpy as np
import pytest

from cdr.ckf import CKF
from cdr.errors import InvalidInputError
from cdr.report.quality import cwr6, fact_reuse
from cdr.trace import TRACE_SCHEMA, build_trace
from cdr.window.loop import EmptyKnowledgeBaseError, GenerationConfig, Generator
from cdr.writers import get_writer
from tests.conftest import BUILTIN_TYPES_OUTLINE, BUILTIN_TYPES_TASK

TINY_TASK = "Write a guide to the pass statement and truth value testing"
TINY_OUTLINE = "The pass statement\nTruth value testing"


@pytest.fixture(scope="module")
def types_ckf(types_ckf_path: Path) -> CKF:
    return CKF.open(types_ckf_path)


def run(ckf: CKF, task: str = BUILTIN_TYPES_TASK, outline: str = BUILTIN_TYPES_OUTLINE,
        **config: object) -> tuple[Generator, list]:
    gen = Generator(ckf, get_writer("extractive"), GenerationConfig(**config))
    session = gen.start(task, outline)
    events = list(gen.run(task, session=session))
    return gen, events


@pytest.fixture(scope="module")
def both_rankings(types_ckf: CKF) -> dict[str, list]:
    return {r: run(types_ckf, ranking=r, max_windows=5, words=3000)[1]
            for r in ("cdr", "relevance")}


def test_window_one_is_identical_between_cdr_and_relevance(both_rankings):
    cdr, rel = both_rankings["cdr"][0], both_rankings["relevance"][0]
    assert cdr.prepared.envelope.fact_ids == rel.prepared.envelope.fact_ids
    np.testing.assert_allclose(cdr.prepared.envelope.ranking.score,
                               rel.prepared.envelope.ranking.score, rtol=1e-6)
    assert cdr.output == rel.output


def test_later_envelopes_differ_and_cdr_reuses_less(both_rankings):
    cdr, rel = both_rankings["cdr"], both_rankings["relevance"]
    assert set(cdr[1].prepared.envelope.fact_ids) != set(rel[1].prepared.envelope.fact_ids)
    reuse_cdr = fact_reuse([e.prepared.envelope.fact_ids for e in cdr])[1:]
    reuse_rel = fact_reuse([e.prepared.envelope.fact_ids for e in rel])[1:]
    assert np.mean(reuse_cdr) < np.mean(reuse_rel)
    rep_cdr = cwr6([e.output for e in cdr])[1:]
    rep_rel = cwr6([e.output for e in rel])[1:]
    assert np.mean(rep_cdr) < np.mean(rep_rel)
    assert cdr[-1].completeness > rel[-1].completeness
    # relevance-only keeps sending the same envelope: novelty never drops, nothing is new
    assert all(e.headers["CRP-Context-Coverage-Score"] == "1.00" for e in rel)
    assert float(cdr[1].headers["CRP-Context-Coverage-Score"]) < 1.0


def test_headers_per_window(both_rankings):
    events = both_rankings["cdr"]
    for i, e in enumerate(events, start=1):
        h = e.headers
        assert h["CRP-Context-Window"] == f"{i}/5"
        assert h["CRP-Context-Coverage-Depth"] == str(
            sum(len(x.report.addressed) for x in events[: i - 1]))
        assert h["CRP-Context-Continuation-Status"] == e.status
        # novelty ratio = novelty × (1 − n-gram penalty) ≥ 0.20 × 0.20
        # (docs/design.md §3.7 "Novelty ratio")
        assert 0.04 <= float(h["CRP-Context-Coverage-Score"]) <= 1.0
        assert h["CRP-Quality-Completeness"] == f"{e.completeness:.2f}"
        assert len(h["CRP-Envelope-ETag"]) == 32
    assert events[0].headers["CRP-Context-NGram-Guard-Activations"] == "0"
    assert int(events[1].headers["CRP-Context-NGram-Guard-Activations"]) > 0


def test_anchor_shrinks_as_sections_complete(both_rankings):
    events = both_rankings["cdr"]
    anchors = [e.prepared.envelope.anchor for e in events]
    assert anchors[0].startswith("Remaining sections to complete: Truth value testing")
    assert len(anchors[-1]) < len(anchors[0])
    assert all(len(events[i].residual) <= len(events[i - 1].residual)
               for i in range(1, len(events)))


def test_trace_validates_and_round_trips(types_ckf, tmp_path):
    gen, events = run(types_ckf, max_windows=2, words=3000)
    session = gen.start(BUILTIN_TYPES_TASK, BUILTIN_TYPES_OUTLINE)
    trace = build_trace(session, events)
    jsonschema.validate(trace, TRACE_SCHEMA)
    text = json.dumps(trace)
    assert json.loads(text) == trace
    first = trace["windows"][0]["envelope"][0]
    assert set(first) == {"fact_id", "source", "section", "relevance", "novelty",
                          "residual_pull", "ngram_penalty", "score", "tokens"}


def test_exit_task_complete(types_ckf):
    _, events = run(types_ckf, max_windows=10, words=1500)
    assert events[-1].status == "task-complete"
    assert events[-1].completeness >= 0.92 and events[-1].residual == []
    assert all(e.status == "in-progress" for e in events[:-1])


def test_exit_limit_reached(types_ckf):
    _, events = run(types_ckf, max_windows=2, words=6000)
    assert [e.status for e in events] == ["in-progress", "limit-reached"]
    assert events[-1].headers["CRP-Context-Mode"] == "full"


def test_exit_ckf_exhausted_on_tiny_ckf(tiny_ckf_path):
    _, events = run(CKF.open(tiny_ckf_path), TINY_TASK, TINY_OUTLINE, max_windows=10,
                    words=3000)
    last = events[-1]
    assert last.status == "ckf-exhausted" and len(events) < 10
    assert last.headers["CRP-Context-Mode"] == "ckf-exhausted"
    assert last.headers["CRP-Onboarding-Hint"] == "ingest-more-documents-for-continued-quality"
    assert float(last.headers["CRP-Context-Coverage-Score"]) < 0.40


def test_exit_safety_budget_depleted(types_ckf):
    spent = []

    def check(window: int, text: str) -> float:
        spent.append(window)
        return 0.5

    _, events = run(types_ckf, max_windows=5, words=6000, safety_check=check)
    assert [e.status for e in events] == ["in-progress", "safety-budget-depleted"]
    assert spent == [1, 2]


def test_empty_ckf_is_safety_only(tmp_path):
    ckf = CKF.create(tmp_path / "empty")
    gen = Generator(ckf, get_writer("extractive"))
    with pytest.raises(EmptyKnowledgeBaseError) as err:
        gen.start("Write a guide to anything")
    assert err.value.headers == {"CRP-Context-Mode": "safety-only",
                                 "CRP-Onboarding-Hint": "ingest-documents-for-context-grounding"}
    assert "ingest" in str(err.value)


def test_bad_input(types_ckf):
    gen = Generator(types_ckf, get_writer("extractive"))
    with pytest.raises(InvalidInputError, match="task is empty"):
        gen.start("  ")
    with pytest.raises(InvalidInputError, match="no lines"):
        gen.start("Write about types", "\n-\n")
    with pytest.raises(InvalidInputError, match="windows"):
        Generator(types_ckf, get_writer("extractive"), GenerationConfig(max_windows=0))


def test_automatic_decomposition_names_sections(types_ckf):
    gen = Generator(types_ckf, get_writer("extractive"), GenerationConfig(sub_queries=4))
    sqs = gen.decompose("Write a guide to Python's built-in types")
    assert 1 <= len(sqs) <= 4
    assert all(sq.text and sq.expected_words > 0 for sq in sqs)
    assert len({sq.text for sq in sqs}) == len(sqs)


def test_openai_writer_over_real_http(types_ckf):
    from tests.chat_server import ChatServer

    with ChatServer(reply=lambda messages: "## Numeric types\n\nIntegers and floats are "
                    "numbers; they support arithmetic and comparisons of all kinds.") as server:
        writer = get_writer("openai", base_url=server.openai_base_url, model="m", api_key="k")
        gen = Generator(types_ckf, writer, GenerationConfig(max_windows=2, words=3000))
        session = gen.start(BUILTIN_TYPES_TASK, BUILTIN_TYPES_OUTLINE)
        events = list(gen.run(BUILTIN_TYPES_TASK, session=session))
        assert len(events) == 2
        sent = server.requests[0].body["messages"]
        assert "Remaining sections to complete: Truth value testing" in sent[-1]["content"]
        assert events[0].report.addressed.keys() == {"sq-2"}  # the "Numeric types" heading
        # the second window repeats the first: its words are not new, so depth stays
        assert events[1].report.addressed == {}


def test_unreachable_llm_keeps_what_was_written(types_ckf):
    from tests.chat_server import ChatServer

    with ChatServer(reply="## Numeric types\n\nIntegers are numbers.") as server:
        writer = get_writer("openai", base_url=server.openai_base_url, model="m", api_key="k",
                            max_retries=1)
        gen = Generator(types_ckf, writer, GenerationConfig(max_windows=3, words=3000))
        session = gen.start(BUILTIN_TYPES_TASK, BUILTIN_TYPES_OUTLINE)
        it = gen.run(BUILTIN_TYPES_TASK, session=session)
        first = next(it)
        server.fail_next(10, 503)
        second = next(it)
    assert first.output.startswith("## Numeric types")
    assert second.status == "upstream-error" and "503" in (second.error or "")
    trace = build_trace(session, [first, second])
    jsonschema.validate(trace, TRACE_SCHEMA)
    assert trace["windows"][0]["output"] == first.output
    assert trace["status"] == "upstream-error"
