"""The section pool (`pool: "sections"`, the reading of CRP-SPEC-024 §2.6 for a task with
sections): the union of selections exact against a brute force (hypothesis); on a real CKF the
pool is the task's candidates and every section's within the documents the task's query
reached, each fact at its best relevance, computed once per session and knowledge-base state;
a knowledge base whose sections live in different documents has every section's document sent;
the spec's pool is untouched; hostile outlines
(10,000 lines, a document without a title) stay bounded and clear."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cdr.ckf import CKF, DocumentInput, ingest_texts
from cdr.errors import InvalidInputError
from cdr.options import PROFILES, resolve_options
from cdr.retrieval.doc_support import document_codes
from cdr.retrieval.factindex import Selection
from cdr.retrieval.navigation import navigation_rows
from cdr.vectors import normalize
from cdr.window.loop import (
    DRAWN_WHOLE,
    MAX_SECTION_QUERIES,
    PHASE1_LIMIT,
    SECTION_DOC_GATE,
    GenerationConfig,
    Generator,
    union_selection,
)
from cdr.writers import get_writer
from tests.conftest import BUILTIN_TYPES_OUTLINE, BUILTIN_TYPES_TASK


def _selection(rows: list[int], rels: list[float], dim: int = 3) -> Selection:
    r = np.asarray(rows, np.int64)
    emb = np.zeros((len(rows), dim), np.float32)
    emb[:, 0] = r  # a row's vector names it, so the test can check it travels with the row
    return Selection(r, np.asarray(rels, np.float32), emb)


def test_union_exact_on_a_small_case() -> None:
    a = _selection([4, 1, 7], [0.9, 0.5, 0.4])
    b = _selection([1, 2], [0.8, 0.5])
    got = union_selection([a, b, Selection.empty(3)], 3)
    assert got.indices.tolist() == [4, 1, 2, 7]
    np.testing.assert_array_equal(got.relevances, np.float32([0.9, 0.8, 0.5, 0.4]))
    assert got.embeddings[:, 0].tolist() == [4, 1, 2, 7]
    assert len(union_selection([], 3)) == 0 and union_selection([], 3).embeddings.shape == (0, 3)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.dictionaries(st.integers(0, 30), st.sampled_from([0.3, 0.4, 0.5, 0.6, 0.9]),
                                max_size=12), max_size=5))
def test_union_equals_a_brute_force(parts: list[dict[int, float]]) -> None:
    sels = [_selection(list(p), list(p.values())) for p in parts]
    got = union_selection(sels, 3)
    best: dict[int, float] = {}
    for p in parts:
        for r, v in p.items():
            best[r] = max(best.get(r, -1.0), v)
    want = sorted(best, key=lambda r: (-np.float32(best[r]), r))
    assert got.indices.tolist() == want
    assert got.relevances.tolist() == [float(np.float32(best[r])) for r in want]
    assert got.embeddings[:, 0].tolist() == want


def test_the_option_and_the_profiles() -> None:
    assert resolve_options(None).pool == "task"  # the spec's Phase 1
    assert PROFILES["focused"].pool == "sections" and PROFILES["spec"].pool == "task"
    with pytest.raises(InvalidInputError, match="unknown pool option 'all'"):
        resolve_options(None, pool="all")


@pytest.fixture(scope="module")
def types_ckf(types_ckf_path: Path) -> CKF:
    return CKF.open(types_ckf_path)


def _generator(ckf: CKF, pool: str, **kw: object) -> Generator:
    settings = {"max_windows": 3, "words": 1200, **kw}
    cfg = GenerationConfig(profile="focused", pool=pool, **settings)  # type: ignore[arg-type]
    return Generator(ckf, get_writer("extractive"), cfg)


def test_the_pool_is_each_querys_candidates_at_their_best(types_ckf: CKF) -> None:
    gen = _generator(types_ckf, "sections")
    session = gen.start(BUILTIN_TYPES_TASK, BUILTIN_TYPES_OUTLINE)
    pool = gen.candidates(session)
    # by hand: the task's Phase 1, then each section as itself pulled toward the task, each with
    # its own BM25 words and document support, keeping the facts of the documents the task's
    # own candidates come from and of each section's best match
    opts = session.options
    parts = [gen.phase1_index(opts, session.task, session.sub_queries).select(
        session.query_vector, session.min_relevance, PHASE1_LIMIT)]
    for sq, vec in zip(session.sub_queries, session.sub_query_embeddings, strict=True):
        parts.append(gen.phase1_index(opts, session.task, [sq]).select(
            normalize(session.query_vector + vec, "q"), session.min_relevance, PHASE1_LIMIT))
    codes = document_codes(types_ckf)
    # each section's pages by meaning: among content facts at the cosine gate, the document
    # whose best three cosines (a missing one counting 0) sum highest, and every document whose
    # best three average at least SECTION_DOC_GATE; their facts at cosine
    content = ~navigation_rows(types_ckf) & np.asarray(types_ckf.active, bool)
    homes = []
    section_pages: list[set[int]] = []
    for vec in session.sub_query_embeddings:
        q = normalize(session.query_vector + vec, "q")
        cos = np.asarray(types_ckf.embeddings, np.float32) @ q
        near = [r for r in np.flatnonzero(content) if cos[r] >= np.float32(gen.cosine_gate())]
        by_doc: dict[int, list[float]] = {}
        for r in near:
            by_doc.setdefault(int(codes[r]), []).append(float(cos[r]))
        if by_doc:
            top3 = {d: sum(sorted(v, reverse=True)[:3]) / 3 for d, v in by_doc.items()}
            home = min(by_doc, key=lambda d: (-top3[d], d))
            # and every page as well supported by meaning as SECTION_DOC_GATE asks
            pages = {home} | {d for d, t in top3.items() if t >= SECTION_DOC_GATE - 1e-12}
            homes.append({int(r): float(cos[r]) for r in near if codes[r] in pages})
            section_pages.append(pages)
    reached = {int(codes[r]) for r in parts[0].indices}
    reached |= {int(codes[p.indices[0]]) for p in parts[1:] if len(p)}  # the sections' best
    reached |= set().union(*section_pages)
    best: dict[int, float] = {}
    for i, p in enumerate(parts):
        for r, v in zip(p.indices.tolist(), p.relevances.tolist(), strict=True):
            if i == 0 or int(codes[r]) in reached:
                best[r] = max(best.get(r, -1.0), v)
    for h in homes:
        for r, v in h.items():
            best[r] = max(best.get(r, -1.0), v)
    assert len(best) > len(parts[0])  # the sections add candidates on this task
    got = dict(zip(pool.indices.tolist(), pool.relevances.tolist(), strict=True))
    assert got.keys() == best.keys()
    np.testing.assert_allclose([got[r] for r in best], list(best.values()), atol=1e-6)
    task_only = _generator(types_ckf, "task")
    task_pool = task_only.candidates(task_only.start(BUILTIN_TYPES_TASK, BUILTIN_TYPES_OUTLINE))
    assert set(task_pool.indices.tolist()) <= set(best)
    np.testing.assert_array_equal(task_pool.indices, parts[0].indices)
    # computed once per session and state: the same object each window, a new one for a
    # new session
    assert gen.candidates(session) is pool
    assert gen.candidates(gen.start(BUILTIN_TYPES_TASK, BUILTIN_TYPES_OUTLINE)) is not pool
    events = list(gen.run(BUILTIN_TYPES_TASK, session=session))
    assert events and all(set(e.prepared.rows.tolist()) <= set(best) for e in events)


def test_the_spec_pool_is_the_task_querys_select(types_ckf: CKF) -> None:
    gen = Generator(types_ckf, get_writer("extractive"), GenerationConfig(max_windows=2))
    session = gen.start(BUILTIN_TYPES_TASK, BUILTIN_TYPES_OUTLINE)
    got = gen.candidates(session)
    want = types_ckf.select(session.query_vector, session.min_relevance, PHASE1_LIMIT)
    np.testing.assert_array_equal(got.indices, want.indices)
    np.testing.assert_array_equal(got.relevances, want.relevances)


VILLAGE = {
    "harbour.md": "# Harbour of Vell\n\n## Tides\n\nThe harbour of Vell drains twice a day; at "
                  "low tide the fishing boats rest on the mud flats beside the stone quay.\n\n"
                  "## Boats\n\nVell's fishing fleet is twelve clinker-built boats that go out "
                  "for herring before dawn.\n",
    "mill.md": "# The mill of Vell\n\n## Grinding\n\nThe water mill of Vell grinds wheat and "
               "barley for the whole valley with two pairs of millstones.\n\n## The race\n\n"
               "The mill race is a stone channel that takes water from the river above the "
               "weir.\n",
    "school.md": "# Vell school\n\n## Lessons\n\nThe village school of Vell teaches thirty "
                 "children in one room heated by an iron stove.\n\n## Holidays\n\nThe school "
                 "closes for three weeks at harvest so that the children help in the fields.\n",
    "cloud.md": "# Cloud computing\n\n## Machines\n\nCloud providers rent virtual machines by "
                "the hour to companies that run web services.\n",
    "chess.md": "# Chess openings\n\n## Defences\n\nThe Sicilian defence answers the king's "
                "pawn opening and is studied by tournament players.\n",
    "untitled.txt": "Stock markets trade shares of listed companies on every weekday.\n",
}
VILLAGE_TASK = "Write a guide to the fishing harbour of Vell and its village"
VILLAGE_OUTLINE = ("Fishing boats and the harbour tides\nGrinding grain at the water mill\n"
                   "Lessons at the village school\n")


@pytest.fixture(scope="module")
def village(tmp_path_factory: pytest.TempPathFactory) -> CKF:
    root = tmp_path_factory.mktemp("village")
    with CKF.create(root / "kb.ckf") as ckf:
        ingest_texts(ckf, [DocumentInput(k, v) for k, v in VILLAGE.items()])
    return CKF.open(root / "kb.ckf")


def test_every_sections_document_is_sent(village: CKF) -> None:
    gen = _generator(village, "sections", max_windows=6)
    session = gen.start(VILLAGE_TASK, VILLAGE_OUTLINE)
    codes = document_codes(village)
    source = {int(c): f.source for f, c in zip(village.facts(np.arange(village.n_rows)),
                                                codes.tolist(), strict=True)}
    sent = {source[int(codes[r])] for e in gen.run(VILLAGE_TASK, session=session)
            if e.output.strip() for r in e.prepared.rows}
    assert {"harbour.md", "mill.md", "school.md"} <= {Path(s).name for s in sent}
    assert not {"cloud.md", "chess.md", "untitled.txt"} & {Path(s).name for s in sent}


def test_a_long_outline_scans_a_bounded_number_of_times(village: CKF,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """10,000 outline lines: at most MAX_SECTION_QUERIES section scans (neighbours share one),
    and the pool still holds the task's own candidates."""
    gen = _generator(village, "sections", max_windows=1, words=20000)
    outline = "\n".join(f"{('Tides', 'Millstones', 'Lessons')[i % 3]} part {i}"
                        for i in range(10_000))
    session = gen.start(VILLAGE_TASK, outline)
    assert len(session.sub_queries) == 10_000
    calls = []
    real = Generator.phase1_index

    def counted(self: Generator, *args: object) -> object:
        calls.append(args)
        return real(self, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(Generator, "phase1_index", counted)
    pool = gen.candidates(session)
    assert len(calls) == 1 + MAX_SECTION_QUERIES
    assert sum(len(c[2]) for c in calls[1:]) == 10_000  # every line in exactly one scan
    task_only = _generator(village, "task", max_windows=1, words=20000)
    task_pool = task_only.candidates(task_only.start(VILLAGE_TASK, outline))
    assert set(task_pool.indices.tolist()) <= set(pool.indices.tolist())


def test_an_outline_of_empty_lines_is_refused(village: CKF) -> None:
    gen = _generator(village, "sections")
    with pytest.raises(InvalidInputError, match="the outline has no lines"):
        gen.start(VILLAGE_TASK, "\n  \n-\n#\n")


def test_an_exhausted_run_names_the_sections_left_and_why(village: CKF, tmp_path: Path) -> None:
    """Through the real `cdr generate`: a section the knowledge base holds nothing about is
    named as left, with why; the trace validates and carries the documents sent."""
    import json

    import jsonschema
    from typer.testing import CliRunner

    from cdr.cli import app
    from cdr.trace import TRACE_SCHEMA

    outline = tmp_path / "outline.md"
    outline.write_text(VILLAGE_OUTLINE + "Quantum chromodynamics of gluon fields\n",
                       encoding="utf-8")
    trace = tmp_path / "trace.json"
    r = CliRunner().invoke(app, ["generate", VILLAGE_TASK, "--ckf", str(village.path),
                                 "--outline", str(outline), "--windows", "6", "--words",
                                 "3000", "--trace", str(trace), "--out",
                                 str(tmp_path / "doc.md")])
    assert r.exit_code == 0, r.output
    assert "status: ckf-exhausted" in r.output
    assert ("section left: 'Quantum chromodynamics of gluon fields': no unsent fact of the "
            "knowledge base passes the relevance gate for it") in " ".join(r.output.split())
    doc = json.loads(trace.read_text(encoding="utf-8"))
    jsonschema.validate(doc, TRACE_SCHEMA)
    assert doc["options"]["pool"] == "sections"
    last = doc["windows"][-1]["documents"]
    assert {Path(s).name for s in last["shares"]} >= {"harbour.md", "mill.md", "school.md"}
    assert abs(sum(last["shares"].values()) - 1.0) < 1e-3


def test_the_pool_is_bounded_like_the_tasks_own_phase1(types_ckf: CKF,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """However many sections add candidates, a window ranks at most PHASE1_LIMIT of them:
    the best of the union."""
    import cdr.window.loop as loop_mod

    whole = _generator(types_ckf, "sections")
    full = whole.candidates(whole.start(BUILTIN_TYPES_TASK, BUILTIN_TYPES_OUTLINE))
    assert len(full) > 5
    monkeypatch.setattr(loop_mod, "PHASE1_LIMIT", 5)
    capped_gen = _generator(types_ckf, "sections")
    capped = capped_gen.candidates(capped_gen.start(BUILTIN_TYPES_TASK, BUILTIN_TYPES_OUTLINE))
    assert len(capped) == 5
    assert list(capped.relevances) == sorted(capped.relevances, reverse=True)
    # each scan is bounded too, so the capped pool's facts are the full pool's, as relevant
    at = dict(zip(full.indices.tolist(), full.relevances.tolist(), strict=True))
    assert all(at[r] == v for r, v in zip(capped.indices.tolist(), capped.relevances.tolist(),
                                          strict=True))


@pytest.mark.parametrize("every", [2, 6])
def test_documents_the_run_draws_on_widen_the_pool(types_ckf: CKF, every: int) -> None:
    """The unsent facts of each document the run draws on (at least a quarter of its content
    facts sent, and two) join the pool at their best cosine to the task's or a section's
    query, when it passes the cosine gate, and all of them when at least DRAWN_WHOLE of its
    content facts were sent; a document with one fact sent adds nothing. Here the pool is the
    section pool less one in `every` facts of its largest document, as a pool the fused gate
    left partly out of a page, and that document's other facts in the pool count as sent."""
    gen = _generator(types_ckf, "sections")
    session = gen.start(BUILTIN_TYPES_TASK, BUILTIN_TYPES_OUTLINE)
    full = gen.candidates(session)
    codes = document_codes(types_ckf)
    ids = types_ckf.fact_ids(np.arange(types_ckf.n_rows))
    in_pool = codes[full.indices]
    top, lone = (int(d) for d in np.argsort(-np.bincount(in_pool), kind="stable")[:2])
    top_rows = full.indices[in_pool == top].tolist()
    left_out = top_rows[every - 1::every]
    sent_rows = [r for r in top_rows if r not in left_out]
    sent_rows += full.indices[in_pool == lone].tolist()[:1]
    session.fact_memory.shown.update({ids[r]: 1 for r in sent_rows})
    shown = session.fact_memory.shown
    base = full.where(~np.isin(full.indices, left_out))
    widened = gen._drawn_on(session, base)
    content = ~navigation_rows(types_ckf) & np.asarray(types_ckf.active, bool)
    sent = [r for r in base.indices.tolist() if ids[r] in shown]
    drawn = {d for d in set(codes[sent].tolist())
             if (n := sum(1 for r in sent if codes[r] == d)) >= 2
             and n >= 0.25 * int(np.count_nonzero(content & (codes == d)))}
    whole = {d for d in drawn if sum(1 for r in sent if codes[r] == d)
             >= DRAWN_WHOLE * int(np.count_nonzero(content & (codes == d)))}
    assert top in drawn and lone not in drawn
    assert (top in whole) == (every == 6)
    queries = [session.query_vector] + [normalize(session.query_vector + v, "q")
                                        for v in session.sub_query_embeddings]
    emb = np.asarray(types_ckf.embeddings, np.float32)
    want = dict(zip(base.indices.tolist(), base.relevances.tolist(), strict=True))
    for r in np.flatnonzero(content).tolist():
        if int(codes[r]) in drawn and r not in want and ids[r] not in shown:
            rel = max(float(emb[r] @ q) for q in queries)
            if rel >= gen.cosine_gate() or int(codes[r]) in whole:
                want[r] = rel
    got = dict(zip(widened.indices.tolist(), widened.relevances.tolist(), strict=True))
    assert got.keys() == want.keys()
    np.testing.assert_allclose([got[r] for r in want], list(want.values()), atol=1e-6)
    assert set(left_out) & set(got)  # facts of the page the pool had left out are back
    if every == 6:  # the whole page: facts under the cosine gate join too
        assert any(got[r] < gen.cosine_gate() for r in set(got) - set(base.indices.tolist()))
