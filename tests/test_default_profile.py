"""The faces' default profile (`cdr.options.FACES_PROFILE`, docs/retrieval.md "The default:
`focused`"): `cdr generate` and the gateway start a run with `focused` when the user names no
profile, the library keeps the spec loop, `--profile spec` is exactly the library's run, old
knowledge bases run under the new default (or are refused with a message naming the fix) and
a session stored before the switch goes on with the options it was started with."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import jsonschema
import pytest
from typer.testing import CliRunner

from cdr.ckf import CKF, ingest
from cdr.cli import app
from cdr.gateway.app_state import Gateway
from cdr.gateway.schemas import GenerationOptions
from cdr.gateway.selections import SelectionCache
from cdr.gateway.session_record import SessionRecord
from cdr.options import DEFAULTS, FACE_DEFAULTS, FACES_PROFILE, PROFILES, SessionOptions
from cdr.trace import TRACE_SCHEMA, build_trace
from cdr.window.loop import GenerationConfig, Generator, PreparedWindow
from cdr.writers import get_writer
from tests.conftest import BUILTIN_TYPES_OUTLINE, BUILTIN_TYPES_TASK, write_docs

runner = CliRunner()
STORED_V1 = Path(__file__).parent / "data" / "stored_session_v1.json"
DATA = Path(__file__).parent / "data" / "ckf"


def _generate(ckf: Path, tmp_path: Path, *args: str, task: str = BUILTIN_TYPES_TASK,
              outline: str | None = BUILTIN_TYPES_OUTLINE) -> tuple[Any, dict[str, Any] | None]:
    """`cdr generate` on `ckf` (3 windows, 1500 words: within what 3 windows carry, so the
    length contract warns nothing); the result and the trace it wrote (None: none written)."""
    trace = tmp_path / "trace.json"
    trace.unlink(missing_ok=True)
    cmd = ["generate", task, "--ckf", str(ckf), "--windows", "3", "--words", "1500",
           "--writer", "extractive", "--trace", str(trace), "--out", str(tmp_path / "o.md")]
    if outline is not None:
        (tmp_path / "outline.md").write_text(outline, encoding="utf-8")
        cmd += ["--outline", str(tmp_path / "outline.md")]
    res = runner.invoke(app, [*cmd, *args])
    doc = json.loads(trace.read_text(encoding="utf-8")) if trace.exists() else None
    return res, doc


def _gateway_stub(cap: int = 20) -> Any:
    """A stand-in gateway with only what `Gateway.options` and `Gateway.generator` read."""
    return SimpleNamespace(settings=SimpleNamespace(max_windows_cap=cap, min_relevance=None),
                           selections=SelectionCache(), writer=get_writer("extractive"))


# ------------------------------------------------------------------ the defaults


def test_the_faces_default_to_focused_and_the_library_to_the_spec():
    assert FACES_PROFILE == "focused" and FACE_DEFAULTS.profile == FACES_PROFILE
    assert DEFAULTS.profile is None and GenerationConfig().session_options() == SessionOptions()
    from dataclasses import replace

    assert replace(FACE_DEFAULTS, profile=None) == DEFAULTS  # nothing else differs
    stored = Gateway.options(_gateway_stub(), None)
    assert stored["profile"] == "focused"
    assert GenerationConfig(**stored).session_options() == PROFILES["focused"]
    spec = Gateway.options(_gateway_stub(), GenerationOptions(profile="spec"))
    assert GenerationConfig(**spec).session_options() == SessionOptions()
    # A single option on top of the default profile overrides only itself.
    one = Gateway.options(_gateway_stub(), GenerationOptions(stale="write"))
    assert GenerationConfig(**one).session_options() == SessionOptions(
        **{**PROFILES["focused"].__dict__, "stale": "write"})


def test_cli_profile_spec_is_the_library_s_default_run(types_ckf_path: Path, tmp_path: Path):
    res, cli = _generate(types_ckf_path, tmp_path, "--profile", "spec")
    assert res.exit_code == 0, res.output
    with CKF.open(types_ckf_path) as ckf:
        gen = Generator(ckf, get_writer("extractive"),
                        GenerationConfig(max_windows=3, words=1500))
        session = gen.start(BUILTIN_TYPES_TASK, BUILTIN_TYPES_OUTLINE)
        events = list(gen.run(BUILTIN_TYPES_TASK, session=session))
        library = build_trace(session, events)
    assert cli == library and "options" not in library


def test_cli_without_profile_runs_focused(types_ckf_path: Path, tmp_path: Path):
    res, doc = _generate(types_ckf_path, tmp_path)
    assert res.exit_code == 0, res.output
    assert doc is not None
    jsonschema.validate(doc, TRACE_SCHEMA)
    assert doc["options"] == PROFILES["focused"].to_dict()
    assert "warning" not in res.output and "deprecat" not in res.output.lower()  # no nagging
    _, explicit = _generate(types_ckf_path, tmp_path, "--profile", "focused")
    assert explicit == doc


def test_the_help_names_the_default_profile():
    import typer

    command = typer.main.get_command(app).commands["generate"]  # type: ignore[attr-defined]
    param = next(p for p in command.params if "--profile" in p.opts)
    assert param.default == "focused" and "default to focused" in (param.help or "")
    res = runner.invoke(app, ["generate", "--help"], env={"COLUMNS": "200"})
    assert res.exit_code == 0 and "[default: focused]" in res.output
    props = GenerationOptions.model_json_schema()["properties"]
    assert props["profile"]["default"] == "focused"


# ------------------------------------------------------------------ old knowledge bases


def test_focused_runs_on_a_ckf_built_before_fact_recipes(tiny_plain_ckf_path: Path,
                                                         tmp_path: Path):
    """A `plain` CKF (facts embedded alone, before recipes; BM25 is built from its rows on
    first use, so there is no index it lacks): the default run writes from it."""
    res, doc = _generate(tiny_plain_ckf_path, tmp_path, task="Write about the pass statement",
                         outline="The pass statement\nTruth value testing\n")
    assert res.exit_code == 0, res.output
    assert "Traceback" not in res.output
    assert doc is not None and doc["options"] == PROFILES["focused"].to_dict()
    assert doc["windows"] and doc["windows"][0]["envelope"]
    assert any("pass" in f["source"] for f in doc["windows"][0]["envelope"])


def test_focused_runs_on_a_one_document_ckf(tmp_path: Path):
    """Document support over one document weighs nothing away (its ratio is 1): the run
    writes from it; a task it holds nothing of is refused with a message naming the fix."""
    docs = write_docs(tmp_path / "docs", {
        "indexes.md": (DATA / "indexes.md").read_text(encoding="utf-8")})
    with CKF.create(tmp_path / "one") as ckf:
        report = ingest(ckf, [str(docs)], source_type="official")
        assert report.documents == 1 and report.facts_added > 0
    res, doc = _generate(tmp_path / "one", tmp_path, task="Write a guide to database indexes",
                         outline="B-tree indexes\nPartial indexes\n")
    assert res.exit_code == 0, res.output
    assert doc is not None and doc["options"] == PROFILES["focused"].to_dict()
    assert doc["windows"][0]["envelope"]
    assert len({f["source"] for w in doc["windows"] for f in w["envelope"]}) == 1
    res, _ = _generate(tmp_path / "one", tmp_path, task="Write about volcanic eruptions",
                       outline=None)
    assert res.exit_code == 1 and isinstance(res.exception, SystemExit), res.output
    assert "give an outline (--outline) or ingest documents about it" in " ".join(
        res.output.split())
    res, doc = _generate(tmp_path / "one", tmp_path, task="Write about volcanic eruptions",
                         outline="Eruption types\nLava flows\n")
    assert res.exit_code == 0, res.output  # nothing grounds it: the honest stop, with the fix
    assert doc is not None and doc["status"] == "ckf-exhausted"
    assert "ingest more documents on the task" in " ".join(res.output.split())


# ------------------------------------------------------------------ stored sessions


def test_a_session_stored_before_the_switch_resumes_with_its_options(tiny_plain_ckf_path):
    """tests/data/stored_session_v1.json: stored by the gateway with no profile (the spec).
    Resumed the way the sidecar API resumes it (`Gateway.generator(index, rec.options)`),
    its next window is prepared and completed under the spec, not the new default."""
    text = STORED_V1.read_text(encoding="utf-8")
    assert "profile" not in json.loads(text)["options"]
    gw = _gateway_stub()
    with CKF.open(tiny_plain_ckf_path) as ckf:
        rec = SessionRecord.from_json(text, ckf.ngram_index)
        gen = Gateway.generator(gw, ckf, rec.options)
        assert gen.options == SessionOptions() == rec.session.options
        pending = PreparedWindow.from_dict(rec.pending)
        event = gen.complete(rec.session, pending, "The pass statement does nothing at all.")
        assert event.number == 2
        again = gen.prepare(rec.session)
        assert again.number == 3
        assert rec.session.options == SessionOptions()
        stored = json.loads(rec.to_json())
        assert "options" not in stored["session"] and "profile" not in stored["options"]


def test_a_session_started_under_the_default_keeps_focused_when_resumed(tiny_ckf_path: Path):
    """The gateway stores the profile with the session: a run started under the default is
    resumed as focused even by a gateway whose default were the spec (`GenerationConfig`'s)."""
    gw = _gateway_stub()
    stored = Gateway.options(gw, GenerationOptions(max_windows=3, words=900,
                                                   outline=["The pass statement"]))
    with CKF.open(tiny_ckf_path) as ckf:
        gen = Gateway.generator(gw, ckf, stored)
        session = gen.start("Write about the pass statement", "The pass statement")
        rec = SessionRecord(session=session, options=json.loads(json.dumps(stored)))
        back = SessionRecord.from_json(rec.to_json(), ckf.ngram_index)
        assert back.options["profile"] == "focused"
        assert back.session.options == PROFILES["focused"]
        resumed = Gateway.generator(gw, ckf, back.options)
        assert resumed.options == PROFILES["focused"]
        prepared = resumed.prepare(back.session)
        assert prepared.number == 1


@pytest.mark.parametrize("profile", ["spec", "fresh", "focused"])
def test_a_named_profile_is_stored_as_named(profile: str):
    stored = Gateway.options(_gateway_stub(), GenerationOptions(profile=profile))
    assert stored["profile"] == profile
