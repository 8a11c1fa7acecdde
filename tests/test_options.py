"""The opt-in options beyond the spec (issue 13): each rule on small exact cases (fact memory,
fitted envelopes, expanded sub-queries), the options persisted in sessions and traces (on and
off, and sessions stored before the options existed), and the CLI flags and the gateway's `crp`
options accepted, persisted and refused with a clear error."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import httpx
import jsonschema
import numpy as np
import pytest
from typer.testing import CliRunner

from cdr.ckf import CKF
from cdr.cli import app
from cdr.coverage import SubQuery
from cdr.errors import InvalidInputError
from cdr.fact_memory import FactMemory, MemoryRule, apply_memory, written_rows
from cdr.gateway.schemas import GenerationOptions
from cdr.gateway.session_record import SessionRecord
from cdr.ngrams import NgramIndex
from cdr.options import PROFILES, SessionOptions, resolve_options
from cdr.ranking import Ranking
from cdr.retrieval.expansion import expand_sub_queries, widened_selection, widened_weights
from cdr.session import Session
from cdr.trace import TRACE_SCHEMA, build_trace
from cdr.window.fit import FIT_MIN_FACTS, fit_facts, planned_words
from cdr.window.loop import GenerationConfig, Generator
from cdr.writers import get_writer
from tests.conftest import BUILTIN_TYPES_OUTLINE, BUILTIN_TYPES_TASK
from tests.gateway_server import CRP, TASK

pytest_plugins = ["tests.gateway_server"]

STORED_V1 = Path(__file__).parent / "data" / "stored_session_v1.json"
FRESH = {"memory": "facts", "envelope": "fit", "queries": "expanded"}
runner = CliRunner()


@pytest.fixture(scope="module")
def types_ckf(types_ckf_path: Path) -> CKF:
    return CKF.open(types_ckf_path)


def generator(ckf: CKF, **config: object) -> Generator:
    cfg = GenerationConfig(**{"max_windows": 4, "words": 3000, **config})
    return Generator(ckf, get_writer("extractive"), cfg)


# ------------------------------------------------------------------ options and profiles


def test_options_default_to_the_spec_and_store_only_what_differs():
    assert SessionOptions().is_default and SessionOptions().to_dict() == {}
    assert SessionOptions.from_dict(None) == SessionOptions.from_dict({}) == SessionOptions()
    fresh = resolve_options("fresh")
    assert fresh == PROFILES["fresh"] and fresh.to_dict() == FRESH
    assert SessionOptions.from_dict(fresh.to_dict()) == fresh
    assert resolve_options("fresh", queries="titles").to_dict() == {"memory": "facts",
                                                                    "envelope": "fit"}
    assert resolve_options(None, envelope="fit").to_dict() == {"envelope": "fit"}
    assert resolve_options("spec") == SessionOptions()


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"memory": "topics"}, "unknown memory option 'topics'"),
    ({"envelope": "full"}, "unknown envelope option 'full'"),
    ({"queries": "bm25"}, "unknown queries option 'bm25'"),
    ({"repeats": "hide"}, "unknown repeats option 'hide'"),
])
def test_bad_option_values_are_refused_naming_the_choices(kwargs, message):
    with pytest.raises(InvalidInputError, match=message):
        resolve_options(None, **kwargs)
    with pytest.raises(InvalidInputError, match="choose one of"):
        SessionOptions(**kwargs)


def test_unknown_profiles_and_stored_keys_are_refused():
    with pytest.raises(InvalidInputError, match="unknown profile 'stale'"):
        resolve_options("stale")
    with pytest.raises(InvalidInputError, match=r"unknown session options \['speed'\]"):
        SessionOptions.from_dict({"speed": "fast"})
    with pytest.raises(InvalidInputError, match="unknown profile"):
        GenerationConfig(profile="stale").session_options()


# ------------------------------------------------------------------ fact memory


def test_memory_weights_shown_written_and_recovering():
    mem = FactMemory()
    mem.record(["f10", "f11", "f12"], np.array([True, False, False]), window=1)
    mem.record(["f12"], np.array([False]), window=2)
    ids = ["f10", "f11", "f12", "f13"]
    rule = MemoryRule(shown=0.2, written=0.05, recovery=1.0)
    np.testing.assert_allclose(mem.weights(ids, 2, rule), [0.05, 0.2, 0.2, 1.0], rtol=1e-6)
    np.testing.assert_allclose(mem.weights(ids, 3, rule), [0.05, 0.2, 0.2, 1.0], rtol=1e-6)
    # Recovery: 1 − (1 − 0.2)·0.5^(w − last − 1); f11 last shown in 1, f12 in 2.
    rec = MemoryRule(shown=0.2, written=0.0, recovery=0.5)
    np.testing.assert_allclose(mem.weights(ids, 3, rec), [0.0, 0.6, 0.2, 1.0], rtol=1e-6)
    np.testing.assert_allclose(mem.weights(ids, 4, rec), [0.0, 0.8, 0.6, 1.0], rtol=1e-6)
    # Written once stays written (its first window kept); showing it again changes nothing.
    mem.record(["f10"], np.array([False]), window=3)
    assert mem.written == {"f10": 1} and mem.shown == {"f10": 3, "f11": 1, "f12": 2}
    assert FactMemory.from_dict(mem.to_dict()) == mem
    assert mem.to_dict()["key"] == "fact_id"
    assert FactMemory.from_dict(None) == FactMemory()
    with pytest.raises(InvalidInputError, match="fact memory is damaged"):
        FactMemory.from_dict({"key": "fact_id", "shown": [["f1"]], "written": []})
    with pytest.raises(InvalidInputError, match="aligned"):
        mem.record(["f1", "f2"], np.array([True]), window=4)
    with pytest.raises(InvalidInputError, match="within"):
        MemoryRule(shown=1.5)


def test_row_keyed_memory_from_the_first_version_migrates_to_fact_ids():
    # The first version stored {"shown": [[row, window]], "written": [[row, window]]}.
    old = {"shown": [[0, 1], [2, 2]], "written": [[0, 1]]}
    mem = FactMemory.from_dict(old)
    assert len(mem) == 2 and mem.legacy_rows is not None and not mem.shown
    # Stored again before any window: still the rows, under their own key.
    assert FactMemory.from_dict(mem.to_dict()) == mem
    with pytest.raises(InvalidInputError, match="migrated"):
        mem.weights(["a"], 3)
    ids = np.array(["a", "b", "c"])
    mem.migrate(lambda rows: ids[rows].tolist())
    assert mem.shown == {"a": 1, "c": 2} and mem.written == {"a": 1}
    assert mem.legacy_rows is None and "legacy_rows" not in mem.to_dict()
    np.testing.assert_allclose(mem.weights(["a", "b", "c"], 3), [0.05, 1.0, 0.2], rtol=1e-6)


def test_written_means_most_of_the_facts_6grams_are_in_the_text():
    facts = ["one two three four five six seven eight nine ten",
             "alpha beta gamma delta epsilon zeta eta theta iota kappa",
             "short fact here", "lambda mu nu xi omicron pi rho sigma tau upsilon"]
    index = NgramIndex.from_texts(facts)
    text = ("Intro. one two three four five six seven eight nine ten. Then "
            "alpha beta gamma delta epsilon zeta eta and something else. short fact here.")
    # Fact 0: all 5 of its 6-grams; fact 1: 2 of 5 (< 0.5); fact 2: no 6-gram at all.
    assert written_rows(np.array([0, 1, 2, 3]), text, index).tolist() == [True, False, False,
                                                                           False]
    assert written_rows(np.array([1]), text, index, share=0.4).tolist() == [True]
    assert written_rows(np.array([0, 99]), text, None).tolist() == [False, False]
    assert written_rows(np.array([0, 99]), text, index).tolist() == [True, False]


def _ranking(rows: list[int], scores: list[float]) -> Ranking:
    n = len(rows)
    f = np.float32
    return Ranking(np.array(rows), np.array(scores, f), np.full(n, 0.5, f), np.ones(n, f),
                   np.zeros(n, f), np.zeros(n, f), np.zeros(n, f), "cdr", n)


def _ids(rows: np.ndarray) -> list[str]:
    return [f"f{r}" for r in np.asarray(rows).tolist()]


def test_apply_memory_reranks_and_lets_exit3_see_stale_facts():
    mem = FactMemory()
    mem.record(["f1", "f2"], np.array([True, False]), window=1)
    r = apply_memory(_ranking([1, 2, 3], [0.9, 0.8, 0.3]), mem, 2, _ids)
    assert r.indices.tolist() == [3, 2, 1]
    np.testing.assert_allclose(r.score, [0.3, 0.16, 0.045], rtol=1e-6)
    np.testing.assert_allclose(r.memory, [1.0, 0.2, 0.05], rtol=1e-6)
    np.testing.assert_allclose(r.novelty_ratio(), [1.0, 0.2, 0.05], rtol=1e-6)
    back = Ranking.from_dict(json.loads(json.dumps(r.to_dict())))
    np.testing.assert_array_equal(back.memory, r.memory)
    assert "memory" not in _ranking([1], [0.5]).to_dict()
    assert Ranking.from_dict(_ranking([1], [0.5]).to_dict()).memory is None


# ------------------------------------------------------------------ fitted envelopes


def test_fit_counts_facts_from_the_planned_words_within_the_window():
    sqs = [SubQuery("a", "A", 300), SubQuery("b", "B", 300), SubQuery("c", "C", 100)]
    assert planned_words(sqs, {"a": 0.5, "b": 1.0, "c": 0.0}) == 150 + 40 + 100
    assert planned_words(sqs, {}) == 700
    # 290 words at 0.03 facts per word: ceil(8.7) = 9.
    assert fit_facts(290, 1024, 0.03) == 9
    # The window caps the words: 0.70 words per token × 1024 = 716.8 → ceil(21.504) = 22.
    assert fit_facts(5000, 1024, 0.03) == 22
    assert fit_facts(10, 1024, 0.03) == FIT_MIN_FACTS
    with pytest.raises(InvalidInputError, match="generation tokens"):
        fit_facts(100, 0)
    with pytest.raises(InvalidInputError, match="facts per word"):
        fit_facts(100, 100, 0.0)


# ------------------------------------------------------------------ expanded sub-queries


def test_expansion_adds_the_nearest_facts_to_each_title():
    titles = np.array([[1, 0, 0], [0, 1, 0]], np.float32)
    s = np.float32(np.sqrt(0.5))
    pool = np.array([[s, 0, s], [0, 0, 1], [0, s, s], [1, 0, 0]], np.float32)
    out = expand_sub_queries(titles, pool, k=1)
    # Title 1's nearest fact is [1, 0, 0]: title + it, normalised, is the title itself.
    np.testing.assert_allclose(out[0], [1, 0, 0], atol=1e-6)
    # Title 2's nearest is [0, s, s]: (0, 1 + s, s) normalised.
    want = np.array([0, 1 + s, s]) / np.linalg.norm([0, 1 + s, s])
    np.testing.assert_allclose(out[1], want, atol=1e-6)
    two = expand_sub_queries(titles, pool, k=2)
    want = np.array([1 + (1 + s) / 2, 0, s / 2])  # title + mean([1, 0, 0], [s, 0, s])
    np.testing.assert_allclose(two[0], want / np.linalg.norm(want), atol=1e-6)
    np.testing.assert_array_equal(expand_sub_queries(titles, np.zeros((0, 3), np.float32)),
                                  titles)
    with pytest.raises(InvalidInputError, match="expansion needs"):
        expand_sub_queries(titles, np.zeros((2, 4), np.float32))


def test_expansion_neighbours_can_come_from_another_score():
    titles = np.array([[1, 0, 0], [0, 1, 0]], np.float32)
    pool = np.array([[1, 0, 0], [0, 1, 0], [0, 0, 1]], np.float32)
    # By cosine title 1 would take fact 0; a scorer that prefers fact 2 for it moves it there.
    near = np.array([[0.1, 0.0], [0.0, 0.9], [0.5, 0.1]])
    out = expand_sub_queries(titles, pool, k=1, near=near)
    np.testing.assert_allclose(out[0], np.array([1, 0, 1]) / np.sqrt(2), atol=1e-6)
    np.testing.assert_allclose(out[1], [0, 1, 0], atol=1e-6)
    with pytest.raises(InvalidInputError, match="neighbour scores"):
        expand_sub_queries(titles, pool, k=1, near=np.zeros((3, 3)))


def test_top_up_widening_adds_only_what_a_section_lacks(types_ckf):
    gen = generator(types_ckf, queries="expanded")
    s = gen.start(BUILTIN_TYPES_TASK, BUILTIN_TYPES_OUTLINE)
    gate = s.min_relevance
    base = types_ckf.select(s.query_vector, gate, 4000)
    per = 10
    want: set[int] = set(base.indices.tolist())
    for v in s.expanded_embeddings:
        have = int((base.embeddings @ v >= gate).sum())
        own = types_ckf.select(v, gate, per).indices.tolist()
        want |= set([r for r in own if r not in set(base.indices.tolist())][:max(per - have, 0)])
    up = widened_selection(types_ckf, s.query_vector, s.expanded_embeddings, gate, 4000, per,
                           top_up=True)
    full = widened_selection(types_ckf, s.query_vector, s.expanded_embeddings, gate, 4000, per)
    assert set(up.indices.tolist()) == want
    assert set(base.indices.tolist()) <= want <= set(full.indices.tolist())
    # A section with enough material in the query's pool adds nothing.
    assert widened_selection(types_ckf, s.query_vector, s.expanded_embeddings, gate, 4000, 0,
                             top_up=True).indices.tolist() == base.indices.tolist()


def test_widened_in_facts_are_weighted_by_how_close_they_got():
    np.testing.assert_allclose(widened_weights(np.array([0.5, 0.4, 0.3, -0.1]), 0.4),
                               [1.0, 1.0, 0.75, 0.0], rtol=1e-6)
    np.testing.assert_allclose(widened_weights(np.array([0.5, 0.3, 0.2]), 0.4, 2.0),
                               [1.0, 0.5625, 0.25], rtol=1e-6)
    np.testing.assert_array_equal(widened_weights(np.array([0.1]), 0.0), [1.0])
    np.testing.assert_array_equal(widened_weights(np.array([0.1]), 0.4, 0.0), [1.0])
    with pytest.raises(InvalidInputError, match="power"):
        widened_weights(np.array([0.1]), 0.4, -1.0)


def test_widened_phase1_is_the_union_of_the_gates_with_query_relevances(types_ckf):
    gen = generator(types_ckf, queries="expanded")
    s = gen.start(BUILTIN_TYPES_TASK, BUILTIN_TYPES_OUTLINE)
    gate = s.min_relevance
    base = types_ckf.select(s.query_vector, gate, 4000)
    wide = widened_selection(types_ckf, s.query_vector, s.expanded_embeddings, gate, 4000)
    union = set(base.indices.tolist())
    for v in s.expanded_embeddings:
        union |= set(types_ckf.select(v, gate, 10).indices.tolist())
    assert set(wide.indices.tolist()) == union and len(union) > len(base)
    emb = np.asarray(types_ckf.vectors(wide.indices))
    np.testing.assert_allclose(wide.relevances, emb @ s.query_vector, atol=1e-6)
    assert (np.diff(wide.relevances) <= 0).all() and wide.relevances.min() < gate
    assert gen.candidates(s).indices.tolist() == wide.indices.tolist()
    # Widened facts keep their query relevance in the ranking, below the gate included.
    r = gen.prepare(s).envelope.ranking
    np.testing.assert_allclose(
        r.relevance, np.asarray(types_ckf.vectors(r.indices)) @ s.query_vector, atol=1e-6)


# ------------------------------------------------------------------ sessions, loop, trace


def test_a_spec_session_stores_no_option_keys(types_ckf):
    gen = generator(types_ckf)
    session = gen.start(BUILTIN_TYPES_TASK, BUILTIN_TYPES_OUTLINE)
    gen.step(session)
    stored = session.to_dict()
    assert not {"options", "fact_memory", "expanded_embeddings"} & set(stored)
    back = Session.from_json(session.to_json(), types_ckf.ngram_index)
    assert back.options == SessionOptions() and back.expanded_embeddings is None
    assert back.to_json() == session.to_json()


def test_a_fresh_session_round_trips_and_runs_its_options_after_reloading(types_ckf):
    gen = generator(types_ckf, profile="fresh")
    session = gen.start(BUILTIN_TYPES_TASK, BUILTIN_TYPES_OUTLINE)
    assert session.options.to_dict() == FRESH
    assert session.expanded_embeddings is not None
    assert not np.allclose(session.expanded_embeddings, session.sub_query_embeddings)
    np.testing.assert_allclose(np.linalg.norm(session.expanded_embeddings, axis=1), 1, atol=1e-5)
    first = gen.step(session)
    shown = set(first.prepared.rows.tolist())
    assert session.fact_memory.shown == dict.fromkeys(first.prepared.envelope.fact_ids, 1)
    assert set(session.fact_memory.written) <= set(first.prepared.envelope.fact_ids)
    assert session.fact_memory.written
    back = Session.from_json(session.to_json(), types_ckf.ngram_index)
    assert back.to_json() == session.to_json()
    assert back.options == session.options and back.fact_memory == session.fact_memory
    np.testing.assert_array_equal(back.expanded_embeddings, session.expanded_embeddings)
    # The reloaded session follows its own options whatever the generator's config says.
    spec_gen = generator(types_ckf)
    second = spec_gen.step(back)
    again = copy.deepcopy(session)
    same = gen.step(again)
    assert second.prepared.envelope.fact_ids == same.prepared.envelope.fact_ids
    r = second.prepared.envelope.ranking
    assert r.memory is not None and len(r) <= 30
    # Facts of window 1 come back only after every fresh candidate: none did here.
    assert not shown & set(second.prepared.rows.tolist())
    trace = build_trace(back, [first, second])
    jsonschema.validate(trace, TRACE_SCHEMA)
    assert trace["options"] == FRESH
    assert all(0 <= f["memory"] <= 1 for f in trace["windows"][1]["envelope"])
    assert "memory" not in trace["windows"][0]["envelope"][0] or \
        trace["windows"][0]["envelope"][0]["memory"] == 1.0


def test_fact_memory_follows_the_facts_through_a_compaction(types_ckf_path, tmp_path):
    """`cdr ckf compact` between two windows renumbers rows; the memory, keyed by fact id,
    still weighs the same facts (and not the ones that moved into their old rows)."""
    shutil.copytree(types_ckf_path, tmp_path / "c.ckf")
    with CKF.open(tmp_path / "c.ckf") as ckf:
        gen = generator(ckf, memory="facts")
        session = gen.start(BUILTIN_TYPES_TASK, BUILTIN_TYPES_OUTLINE)
        first = gen.step(session)
        shown = list(first.prepared.envelope.fact_ids)
        old_rows = first.prepared.rows.copy()
        # Delete the document holding the lowest row none of window 1's facts came from.
        docs = [(min(ckf.document_rows(d["doc_id"])), d["doc_id"]) for d in ckf.documents()]
        low = min(d for d in docs if not set(ckf.document_rows(d[1])) & set(old_rows.tolist()))
        assert low[0] < old_rows.min()
        ckf.delete_document(low[1])
        ckf.compact()
        new_rows = ckf.rows_for_ids(shown)
        assert (new_rows != old_rows).all()  # every shown fact moved
        weights = session.fact_memory.weights(ckf.fact_ids(new_rows), 2)
        written = {f for f in shown if f in session.fact_memory.written}
        np.testing.assert_allclose(weights, [0.05 if f in written else 0.2 for f in shown],
                                   rtol=1e-6)
        # The facts now in the old rows are other facts: not remembered.
        moved_in = [f for f in ckf.fact_ids(old_rows[old_rows < ckf.n_rows]) if f not in shown]
        assert moved_in and (session.fact_memory.weights(moved_in, 2) == 1.0).all()
        # The next window ranks on the compacted CKF: each fact's memory weight is its own.
        second = gen.step(session)
        env = second.prepared.envelope
        order = {f: i for i, f in enumerate(ckf.fact_ids(env.ranking.indices))}
        got = [float(env.ranking.memory[order[f]]) for f in env.fact_ids]
        want = [0.05 if f in written else 0.2 if f in shown else 1.0 for f in env.fact_ids]
        np.testing.assert_allclose(got, want, rtol=1e-6)
        assert 1.0 in want  # fresh facts first, as ever
        assert set(session.fact_memory.shown) == set(shown) | set(second.prepared.envelope.fact_ids)


def test_a_session_stored_with_row_keyed_memory_loads_and_runs_as_before(types_ckf):
    """Sessions stored by the first version of the option keyed memory by CKF row: they load,
    and (the CKF unchanged) their next window is the one the id-keyed session gets."""
    gen = generator(types_ckf, memory="facts")
    session = gen.start(BUILTIN_TYPES_TASK, BUILTIN_TYPES_OUTLINE)
    gen.step(session)
    stored = session.to_dict()
    mem = stored["fact_memory"]
    assert mem["key"] == "fact_id"

    def rows(pairs: list[list]) -> list[list[int]]:
        r = types_ckf.rows_for_ids([f for f, _ in pairs]).tolist()
        return [[row, w] for row, (_, w) in zip(r, pairs, strict=True)]

    stored["fact_memory"] = {"shown": rows(mem["shown"]), "written": rows(mem["written"])}
    old = Session.from_dict(json.loads(json.dumps(stored)), types_ckf.ngram_index)
    assert old.fact_memory.legacy_rows is not None and len(old.fact_memory) == len(mem["shown"])
    a, b = gen.step(old), gen.step(session)
    assert a.prepared.envelope.fact_ids == b.prepared.envelope.fact_ids
    assert old.fact_memory == session.fact_memory and old.fact_memory.legacy_rows is None


def test_fit_packs_fewer_facts_than_the_budget(types_ckf):
    spec = generator(types_ckf)
    fit = generator(types_ckf, envelope="fit")
    a = spec.prepare(spec.start(BUILTIN_TYPES_TASK, BUILTIN_TYPES_OUTLINE))
    s = fit.start(BUILTIN_TYPES_TASK, BUILTIN_TYPES_OUTLINE)
    b = fit.prepare(s)
    want = fit_facts(planned_words(s.sub_queries, s.cumulative_depth), 1024)
    assert len(b.envelope) == want < len(a.envelope)
    # Same ranking, so the fitted envelope is the spec envelope's best `want` facts.
    best = np.argsort(-a.envelope.ranking.score, kind="stable")[:want]
    assert set(b.envelope.fact_ids) == {a.envelope.fact_ids[i] for i in best}


def test_a_session_stored_before_the_options_loads_with_the_spec_defaults(tiny_ckf_path):
    text = STORED_V1.read_text(encoding="utf-8")
    with CKF.open(tiny_ckf_path) as ckf:
        rec = SessionRecord.from_json(text, ckf.ngram_index)
        assert rec.session.options == SessionOptions()
        assert rec.session.expanded_embeddings is None and not rec.session.fact_memory
        assert json.loads(rec.to_json()) == json.loads(text)
        assert "options" not in rec.trace("s-old")


# ------------------------------------------------------------------ CLI


def test_cli_profile_and_flags_reach_the_trace(types_ckf_path, tmp_path):
    outline = tmp_path / "outline.md"
    outline.write_text(BUILTIN_TYPES_OUTLINE, encoding="utf-8")
    trace = tmp_path / "t.json"
    r = runner.invoke(app, ["generate", BUILTIN_TYPES_TASK, "--ckf", str(types_ckf_path),
                            "--outline", str(outline), "--windows", "2", "--profile", "fresh",
                            "--queries", "titles", "--trace", str(trace),
                            "--out", str(tmp_path / "o.md")])
    assert r.exit_code == 0, r.output
    doc = json.loads(trace.read_text(encoding="utf-8"))
    jsonschema.validate(doc, TRACE_SCHEMA)
    assert doc["options"] == {"memory": "facts", "envelope": "fit"}


@pytest.mark.parametrize(("flag", "value"), [("--memory", "topics"), ("--envelope", "all"),
                                             ("--queries", "bm25"), ("--profile", "stale"),
                                             ("--repeats", "hide"), ("--subject", "title"),
                                             ("--lexical", "tfidf"), ("--stale", "skip"),
                                             ("--documents", "all")])
def test_cli_refuses_bad_option_values_with_one_line(flag, value, tmp_path):
    r = runner.invoke(app, ["generate", "t", "--ckf", str(tmp_path), flag, value])
    assert r.exit_code == 2
    assert value in r.output and flag.lstrip("-") in r.output


# ------------------------------------------------------------------ gateway


def test_gateway_crp_schema_takes_the_options_and_refuses_others():
    o = GenerationOptions(profile="fresh", memory="off")
    assert (o.profile, o.memory, o.envelope, o.queries) == ("fresh", "off", None, None)
    with pytest.raises(ValueError, match="memory"):
        GenerationOptions(memory="topics")
    with pytest.raises(ValueError, match="profile"):
        GenerationOptions(profile="stale")
    assert GenerationOptions(repeats="drop").repeats == "drop"
    with pytest.raises(ValueError, match="repeats"):
        GenerationOptions(repeats="hide")
    o = GenerationOptions(profile="focused", subject="off", lexical="bm25", stale="stop")
    assert (o.profile, o.subject, o.lexical, o.stale) == ("focused", "off", "bm25", "stop")
    for name, bad in (("subject", "title"), ("lexical", "tfidf"), ("stale", "skip")):
        with pytest.raises(ValueError, match=name):
            GenerationOptions(**{name: bad})


def test_sidecar_session_persists_its_options(gateway):
    with gateway.client() as client:
        r = client.post("/v1/sessions", json={"task": TASK, **CRP, "profile": "fresh",
                                              "queries": "titles"})
        assert r.status_code == 201, r.text
        sid, token = r.json()["session_id"], r.json()["token"]
        env = client.post(f"/v1/sessions/{sid}/envelope",
                          headers={"Authorization": f"Bearer {token}"})
        assert env.status_code == 200, env.text
        trace = client.get(f"/v1/sessions/{sid}", headers={"Authorization": f"Bearer "
                                                           f"{env.json()['token']}"})
        assert trace.status_code == 200, trace.text
        assert trace.json()["options"] == {"memory": "facts", "envelope": "fit"}
        bad = client.post("/v1/sessions", json={"task": TASK, **CRP, "envelope": "all"})
        assert bad.status_code == 422 and "envelope" in bad.text


def test_openai_crp_options_are_persisted_and_bad_ones_are_422(gateway):
    body = {"model": "cdr", "messages": [{"role": "user", "content": TASK}],
            "crp": {**CRP, "memory": "facts", "subject": "anchor", "stale": "stop"}}
    r = httpx.post(f"{gateway.url}/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    crp = r.json()["crp"]
    tr = httpx.get(f"{gateway.url}/v1/sessions/{crp['session_id']}",
                   headers={"Authorization": f"Bearer {crp['token']}"}, timeout=30)
    assert tr.status_code == 200, tr.text
    assert tr.json()["options"] == {"memory": "facts", "subject": "anchor", "stale": "stop"}
    jsonschema.validate(tr.json(), TRACE_SCHEMA)
    assert all("sent_before" in w for w in tr.json()["windows"])
    bad = httpx.post(f"{gateway.url}/v1/chat/completions", timeout=30,
                     json={**body, "crp": {**CRP, "queries": "bm25"}})
    assert bad.status_code == 422 and "queries" in bad.text
    bad = httpx.post(f"{gateway.url}/v1/chat/completions", timeout=30,
                     json={**body, "crp": {**CRP, "lexical": "tfidf"}})
    assert bad.status_code == 422 and "lexical" in bad.text
