"""The one window step (`Generator.step`) and what it stands on: the loop, the writer-outside
split (prepare + complete), a failing upstream, the core types' own serialisation (and a
session stored before it moved there), the headers function, and the trace schema against
every trace the CLI writes, failed runs included."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import get_args

import jsonschema
import numpy as np
import pytest
from typer.testing import CliRunner

from cdr.ckf import CKF
from cdr.cli import app
from cdr.errors import InvalidInputError, UpstreamError
from cdr.gateway.schemas import GenerationOptions
from cdr.gateway.session_record import SessionRecord
from cdr.ranking import RANKING_MODES, Ranking
from cdr.session import MAX_WINDOWS_LIMIT, RUN_FAILED, RUN_STATUSES, Session
from cdr.trace import TRACE_SCHEMA, build_trace, window_record
from cdr.window.envelope import Envelope
from cdr.window.headers import EXHAUSTED_HINT, crp_headers
from cdr.window.loop import GenerationConfig, Generator, PreparedWindow
from cdr.writers import get_writer
from tests.chat_server import ChatServer
from tests.conftest import BUILTIN_TYPES_OUTLINE, BUILTIN_TYPES_TASK

STORED_V1 = Path(__file__).parent / "data" / "stored_session_v1.json"
runner = CliRunner()


@pytest.fixture(scope="module")
def types_ckf(types_ckf_path: Path) -> CKF:
    return CKF.open(types_ckf_path)


def generator(ckf: CKF, writer=None, **config: object) -> Generator:
    cfg = GenerationConfig(**{"max_windows": 3, "words": 3000, **config})
    return Generator(ckf, writer or get_writer("extractive"), cfg)


# ------------------------------------------------------------------ the step


def test_run_is_step_until_done_and_the_writer_outside_gives_the_same_windows(types_ckf):
    gen = generator(types_ckf)
    a = gen.start(BUILTIN_TYPES_TASK, BUILTIN_TYPES_OUTLINE)
    b, c = copy.deepcopy(a), copy.deepcopy(a)
    by_run = list(gen.run(BUILTIN_TYPES_TASK, session=a))
    by_step, outside = [], []
    while not (by_step and by_step[-1].done):
        by_step.append(gen.step(b))
    while not (outside and outside[-1].done):  # the sidecar's way: the client writes
        prepared = gen.prepare(c)
        event = gen.close_if_empty(c, prepared)
        if event is None:
            text = get_writer("extractive").generate(prepared.messages,
                                                     prepared.max_tokens).text
            event = gen.complete(c, prepared, text)
        outside.append(event)
    assert len(by_run) == 3 and by_run[-1].status == "limit-reached"
    records = [window_record(e) for e in by_run]
    assert records == [window_record(e) for e in by_step] == [window_record(e) for e in outside]
    assert a.to_json() == b.to_json() == c.to_json()


def test_step_streams_each_window_under_its_number(types_ckf):
    gen = generator(types_ckf, max_windows=2)
    session = gen.start(BUILTIN_TYPES_TASK, BUILTIN_TYPES_OUTLINE)
    got: list[tuple[int, str]] = []
    events = [gen.step(session, lambda n, piece: got.append((n, piece))) for _ in range(2)]
    for e in events:
        assert "".join(p for n, p in got if n == e.number) == e.output


def test_step_keeps_the_partial_text_of_a_broken_stream(types_ckf):
    reply = "## Numeric types\n\nIntegers and floats are numbers with arithmetic."
    with ChatServer(reply=reply) as server:
        writer = get_writer("openai", base_url=server.openai_base_url, model="m", api_key="k",
                            max_retries=0)
        gen = generator(types_ckf, writer)
        session = gen.start(BUILTIN_TYPES_TASK, BUILTIN_TYPES_OUTLINE)
        streamed: list[str] = []
        server.cut_next(1, after=3)
        event = gen.step(session, lambda _n, piece: streamed.append(piece))
    assert event.status == "upstream-error" and event.done
    assert isinstance(event.upstream, UpstreamError) and event.error == str(event.upstream)
    assert event.output and event.output == "".join(streamed) and reply.startswith(event.output)
    assert session.window_count == 1  # the window counts: its text went out
    trace = build_trace(session, [event])
    jsonschema.validate(trace, TRACE_SCHEMA)
    assert trace["windows"][0]["error"] == event.error


# ------------------------------------------------------------------ serialisation


def test_core_types_round_trip_through_json(types_ckf):
    gen = generator(types_ckf)
    session = gen.start(BUILTIN_TYPES_TASK, BUILTIN_TYPES_OUTLINE)
    gen.step(session)
    prepared = gen.prepare(session)
    env = prepared.envelope
    r = Ranking.from_dict(json.loads(json.dumps(env.ranking.to_dict())))
    for name in ("indices", "score", "relevance", "novelty", "residual_pull", "ngram_penalty",
                 "coverage_score"):
        np.testing.assert_array_equal(getattr(r, name), getattr(env.ranking, name))
    assert (r.mode, r.n_candidates, r.ngram_activations) == (
        env.ranking.mode, env.ranking.n_candidates, env.ranking.ngram_activations)
    e = Envelope.from_dict(json.loads(json.dumps(env.to_dict())))
    assert (e.etag, e.fact_ids, e.budget, e.anchor, e.skipped) == (
        env.etag, env.fact_ids, env.budget, env.anchor, env.skipped)
    p = PreparedWindow.from_dict(json.loads(json.dumps(prepared.to_dict())))
    assert p.to_dict() == prepared.to_dict()
    assert [f.id for f in p.facts] == env.fact_ids and p.plan == prepared.plan
    back = Session.from_json(session.to_json(), types_ckf.ngram_index)
    assert back.to_json() == session.to_json()
    np.testing.assert_array_equal(back.blacklist.counts, session.blacklist.counts)
    with pytest.raises(InvalidInputError, match="malformed"):
        Session.from_json("[1, 2]")


def test_a_session_stored_before_the_move_still_loads_and_goes_on(tiny_plain_ckf_path):
    """tests/data/stored_session_v1.json was written by the gateway's own dump code before the
    core types owned their serialisation: one finished window and a pending envelope."""
    text = STORED_V1.read_text(encoding="utf-8")
    with CKF.open(tiny_plain_ckf_path) as ckf:
        rec = SessionRecord.from_json(text, ckf.ngram_index)
        assert json.loads(rec.to_json()) == json.loads(text)  # nothing lost or renamed
        pending = PreparedWindow.from_dict(rec.pending)
        assert pending.to_dict() == rec.pending
        assert pending.number == rec.session.window_count + 1 == 2
        trace = rec.trace("s-old")
        jsonschema.validate(trace, TRACE_SCHEMA)
        assert trace["session_id"] == "s-old" and len(trace["windows"]) == 1
        gen = Generator(ckf, get_writer("extractive"), GenerationConfig(**rec.options))
        event = gen.complete(rec.session, pending, "The pass statement does nothing at all.")
        rec.windows.append(window_record(event))
        assert event.number == 2 and rec.session.window_count == 2
        jsonschema.validate(rec.trace("s-old"), TRACE_SCHEMA)


# ------------------------------------------------------------------ headers and constants


def test_one_headers_function_for_a_window_and_for_a_session():
    session_only = crp_headers(window=2, max_windows=5, status="ckf-exhausted",
                               completeness=0.456)
    assert session_only == {
        "CRP-Context-Continuation-Status": "ckf-exhausted", "CRP-Context-Mode": "ckf-exhausted",
        "CRP-Quality-Completeness": "0.46", "CRP-Context-Window": "2/5",
        "CRP-Onboarding-Hint": EXHAUSTED_HINT,
    }
    going = crp_headers(window=1, max_windows=3, status="in-progress", completeness=0.0)
    assert going["CRP-Context-Mode"] == "full" and "CRP-Onboarding-Hint" not in going


def test_modes_statuses_and_the_window_limit_are_spelled_once(types_ckf):
    assert TRACE_SCHEMA["properties"]["ranking"]["enum"] == list(RANKING_MODES)
    assert TRACE_SCHEMA["properties"]["status"]["enum"] == list(RUN_STATUSES)
    field = GenerationOptions.model_fields["ranking"].annotation
    assert set(RANKING_MODES) <= {a for arg in get_args(field) for a in get_args(arg)}
    GenerationOptions(max_windows=MAX_WINDOWS_LIMIT)
    with pytest.raises(ValueError, match="max_windows"):
        GenerationOptions(max_windows=MAX_WINDOWS_LIMIT + 1)
    generator(types_ckf, max_windows=MAX_WINDOWS_LIMIT)
    with pytest.raises(InvalidInputError, match=f"1..{MAX_WINDOWS_LIMIT}"):
        generator(types_ckf, max_windows=MAX_WINDOWS_LIMIT + 1)
    r = runner.invoke(app, ["generate", "t", "--ckf", ".", "--windows",
                            str(MAX_WINDOWS_LIMIT + 1)])
    assert r.exit_code == 2 and f"1..{MAX_WINDOWS_LIMIT}" in r.output


# ------------------------------------------------------------------ CLI traces, failed runs


def test_cli_traces_of_failed_runs_follow_the_schema(types_ckf_path: Path, tmp_path: Path):
    # A run stopped by an error that is not the writer's: no room for any fact. The CLI
    # records status "error", which the schema now knows.
    trace = tmp_path / "error.json"
    r = runner.invoke(app, ["generate", BUILTIN_TYPES_TASK, "--ckf", str(types_ckf_path),
                            "--outline", str(_outline(tmp_path)), "--context-tokens", "600",
                            "--generation-tokens", "590", "--trace", str(trace)])
    assert r.exit_code == 1 and "no room for facts" in r.output
    data = json.loads(trace.read_text(encoding="utf-8"))
    jsonschema.validate(data, TRACE_SCHEMA)
    assert data["status"] == RUN_FAILED and data["windows"] == []

    # The upstream LLM fails (after the writer's retries): status upstream-error, and the
    # failed window is in the trace with its error.
    with ChatServer(reply="## Numeric types\n\nIntegers are numbers.") as server:
        server.fail_next(50, 503)
        trace = tmp_path / "upstream.json"
        r = runner.invoke(app, ["generate", BUILTIN_TYPES_TASK, "--ckf", str(types_ckf_path),
                                "--outline", str(_outline(tmp_path)), "--windows", "3",
                                "--writer", "openai", "--llm-model", "m",
                                "--llm-base-url", server.openai_base_url, "--trace", str(trace)],
                          env={"CDR_LLM_API_KEY": "k"})
    assert r.exit_code == 1, r.output
    data = json.loads(trace.read_text(encoding="utf-8"))
    jsonschema.validate(data, TRACE_SCHEMA)
    assert data["status"] == "upstream-error" and len(data["windows"]) == 1
    assert "503" in data["windows"][0]["error"]


def _outline(tmp_path: Path) -> Path:
    path = tmp_path / "outline.txt"
    path.write_text(BUILTIN_TYPES_OUTLINE, encoding="utf-8")
    return path
