"""Citations through the window loop and its faces: the extractive writer cites exactly, a
writer that cites what it was not given is corrected, the stream carries the markers block by
block, numbers survive a resumed session, and the document, trace and report show them."""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import pytest

from cdr.citations import UNSUPPORTED
from cdr.ckf import CKF, ingest
from cdr.report import write_report
from cdr.session import Session
from cdr.text.prompt_format import CITE_LINE, parse_prompt
from cdr.trace import TRACE_SCHEMA, build_trace
from cdr.window.cite import document_of
from cdr.window.loop import GenerationConfig, Generator
from cdr.writers.base import WriterResult
from cdr.writers.extractive import ExtractiveWriter
from tests.conftest import BUILTIN_TYPES_OUTLINE, BUILTIN_TYPES_TASK

MARK = re.compile(r"\[(\d+)\]")


class ChunkedExtractive(ExtractiveWriter):
    """The extractive writer streaming its text three characters at a time, so markers and
    blocks arrive split across pieces as a model's tokens would."""

    def generate(self, messages, max_tokens, *, on_delta=None):
        result = super().generate(messages, max_tokens)
        if on_delta is not None:
            for i in range(0, len(result.text), 3):
                on_delta(result.text[i:i + 3])
        return result


class MiscitingWriter:
    """Pastes the plan's facts, each marked with a ref the prompt never listed and a ref to
    the wrong fact: what a small model's worst citations look like."""

    name = "miciting"
    pastes_facts = True
    needs_model = False

    def generate(self, messages, max_tokens, *, on_delta=None):
        plan, facts = parse_prompt(messages[-1]["content"])
        refs = [r for s in plan for r in s.fact_refs if r in facts]
        parts = [f"## {plan[0].title}"] if plan else []
        for i, ref in enumerate(refs):
            wrong = refs[(i + 1) % len(refs)]
            parts.append(f"{facts[ref]} [F999, {wrong}]")
        text = "\n\n".join(parts)
        if on_delta is not None:
            on_delta(text)
        return WriterResult(text, "stop", {"prompt_tokens": 1, "completion_tokens": 1,
                                           "total_tokens": 2})


@pytest.fixture(scope="module")
def types_ckf(types_ckf_path: Path) -> CKF:
    return CKF.open(types_ckf_path)


def _run(ckf, writer, *, resume_each_window: bool = False, **options):
    gen = Generator(ckf, writer, GenerationConfig(profile="focused", max_windows=4,
                                                  words=2400, **options))
    session = gen.start(BUILTIN_TYPES_TASK, BUILTIN_TYPES_OUTLINE)
    events, streamed = [], {}

    def sink(window: int, piece: str) -> None:
        streamed[window] = streamed.get(window, "") + piece

    while True:
        if resume_each_window:  # another replica takes the session over between windows
            session = Session.from_json(session.to_json(), ckf.ngram_index)
        event = gen.step(session, sink)
        events.append(event)
        if event.done:
            return session, events, streamed


@pytest.fixture(scope="module")
def cited_run(types_ckf):
    return _run(types_ckf, ChunkedExtractive())


def test_the_extractive_writer_cites_every_sentence_with_a_fact_it_pasted(cited_run):
    _, events, _ = cited_run
    written = [e for e in events if e.output.strip()]
    assert len(written) >= 2
    for e in written:
        assert CITE_LINE in e.prepared.messages[-1]["content"]
        cit = e.citations
        assert cit is not None and cit.factual > 0 and cit.invalid == 0
        envelope = set(e.prepared.envelope.fact_ids)
        for s in cit.sentences:
            assert s.status != UNSUPPORTED and s.facts and set(s.facts) <= envelope
            # the sentence is the pasted fact's own words
            facts = {f.id: f.content for f in e.prepared.facts}
            assert " ".join(e.output[s.start:s.end].split()) in " ".join(facts[s.facts[0]].split())
        assert "[F" not in e.output and "[F" not in e.shown


def test_the_stream_carries_exactly_the_shown_text_markers_included(cited_run):
    _, events, streamed = cited_run
    for e in events:
        if e.output.strip():
            assert streamed[e.number] == e.shown
            assert len(MARK.findall(e.shown)) > len(MARK.findall(e.output))


def test_numbers_run_from_one_by_first_citation_and_the_sources_list_them(cited_run):
    session, events, _ = cited_run
    order = list(dict.fromkeys(n for e in events if e.citations
                               for s in e.citations.sentences
                               for n in sorted(e.citations.numbers[f] for f in s.facts)))
    assert order == list(range(1, len(order) + 1))
    assert [s.number for s in session.cited_sources] == order
    cited = {f for e in events if e.citations for s in e.citations.sentences for f in s.facts}
    assert {s.fact_id for s in session.cited_sources} == cited
    document = document_of(session, events, [sq.text for sq in session.sub_queries])
    tail = document.split("## Sources\n\n", 1)[1]
    assert len(tail.strip().splitlines()) == len(order)
    trace = build_trace(session, events)
    jsonschema.validate(trace, TRACE_SCHEMA)
    assert [s["number"] for s in trace["sources"]] == order


def test_a_resumed_session_numbers_as_an_uninterrupted_one(types_ckf, cited_run):
    session, events, _ = cited_run
    again, again_events, _ = _run(types_ckf, ChunkedExtractive(), resume_each_window=True)
    assert [e.shown for e in again_events] == [e.shown for e in events]
    assert again.cited_sources == session.cited_sources
    restored = Session.from_json(again.to_json(), types_ckf.ngram_index)
    assert restored.cited_sources == again.cited_sources


def test_a_writer_citing_facts_it_was_not_given_is_corrected(types_ckf):
    _, events, streamed = _run(types_ckf, MiscitingWriter())
    written = [e for e in events if e.output.strip()]
    assert written
    for e in written:
        cit = e.citations
        assert cit.invalid >= 1  # F999 was never listed
        assert cit.dropped >= 1  # the wrong neighbour does not support the sentence
        envelope = set(e.prepared.envelope.fact_ids)
        assert all(set(s.facts) <= envelope for s in cit.sentences)
        assert "999" not in e.shown and streamed[e.number] == e.shown


def test_citations_off_leaves_text_prompt_and_trace_without_them(types_ckf):
    session, events, _ = _run(types_ckf, ExtractiveWriter(), citations="off")
    for e in events:
        assert e.citations is None and e.shown is None
        if e.prepared.messages:
            assert CITE_LINE not in e.prepared.messages[-1]["content"]
    document = document_of(session, events)
    assert "\n## Sources\n" not in document and not session.cited_sources
    assert "[F" not in document
    trace = build_trace(session, events)
    assert "sources" not in trace and all("citations" not in w for w in trace["windows"])


HOSTILE_DOC = (
    "# Widgets <script>alert(1)</script>\n\n"
    + "\n\n".join(
        f"The widget cache number {i} holds <img src=x onerror=alert({i})> entries and "
        f"[click here](javascript:alert({i})) flushes **all** of them every night to disk."
        for i in range(4)) + "\n")


def test_fact_text_with_html_or_markdown_renders_as_text(tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "widgets.md").write_text(HOSTILE_DOC, encoding="utf-8")
    with CKF.create(tmp_path / "ckf") as ckf:
        ingest(ckf, [str(docs)])
    with CKF.open(tmp_path / "ckf") as ckf:
        gen = Generator(ckf, ExtractiveWriter(),
                        GenerationConfig(profile="focused", max_windows=2, words=300))
        session = gen.start("Write a guide to the widget cache")
        events = list(gen.run(session.task, session=session))
        trace = build_trace(session, events)
    assert session.cited_sources
    document = document_of(session, events)
    from markdown_it import MarkdownIt

    sources_html = MarkdownIt("commonmark").render(document.split("## Sources", 1)[1])
    assert "<script" not in sources_html and "<img" not in sources_html
    assert 'href="javascript' not in sources_html
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(trace), encoding="utf-8")
    write_report([path], tmp_path / "report.html")
    html = (tmp_path / "report.html").read_text(encoding="utf-8")
    assert "<script>alert" not in html and "<img src=x" not in html
    assert '<sup class="cite"><a href="#src-0-1"' in html and 'id="src-0-1"' in html


def test_footnotes_mark_sentences_and_define_each_number_once(types_ckf):
    session, events, streamed = _run(types_ckf, ChunkedExtractive(), citations="footnotes")
    document = document_of(session, events, [sq.text for sq in session.sub_queries])
    used = set(re.findall(r"\[\^(\d+)\](?!:)", document))
    defined = re.findall(r"^\[\^(\d+)\]: ", document, re.MULTILINE)
    assert used and sorted(used, key=int) == defined == [str(s.number) for s in
                                                          session.cited_sources]
    assert "## Sources" not in document
    assert all(streamed[e.number] == e.shown for e in events if e.output.strip())
