"""A citing session's window (`citations` on, `cdr.citations`): its citer, its shown text.

The loop keeps each window's text as clean prose (what Stage 8, the n-gram guard, fact memory
and the length contract read) and its citations beside it; the reader — the document, the
stream, the gateway's response — sees the text with the document's numbers in it. The numbers
run on from the session's (`Session.cited_sources`): the text of a window, shown before and
after it completes, carries the same numbers, and so does every replica that resumes it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from cdr.citations import Citer, GivenFact, WindowCitations, number_facts, rendered
from cdr.citations.attribute import CitedSpan, rendered_spans
from cdr.citations.sources import SourceEntry, excerpt

if TYPE_CHECKING:
    from cdr.retrieval.embed import Embedder
    from cdr.retrieval.factindex import FactIndex
    from cdr.session import Session
    from cdr.window.loop import PreparedWindow


@dataclass(frozen=True, slots=True)
class CitedText:
    """A window's text cited: the clean prose, its citations, and the text a reader sees."""

    clean: str
    citations: WindowCitations
    shown: str
    new_sources: tuple[SourceEntry, ...]  # the facts it cites first, for the sources list


def given_facts(index: FactIndex, prepared: PreparedWindow) -> list[GivenFact]:
    """The facts the window's prompt listed, by their refs there: those its plan names (the
    prompt lists no other), every packed fact when there is no plan. A window restored from
    its stored form has no fact text: it is read back from the index, and a row that no longer
    holds the fact the envelope named (the knowledge base changed since) is not given, so no
    citation pairs one fact's id with another's source."""
    planned = {r for s in prepared.plan for r in s.fact_refs}
    keep = [i for i in range(len(prepared.facts)) if not planned or f"F{i + 1}" in planned]
    ids = prepared.envelope.fact_ids
    facts = [prepared.facts[i] for i in keep]
    if any(not getattr(f, "content", "") for f in facts):
        rows = np.asarray([int(prepared.rows[i]) for i in keep], np.int64)
        now = index.fact_ids(rows) if len(rows) else []
        pairs = [(i, f) for i, f, fid in zip(keep, index.facts(rows), now, strict=True)
                 if fid == ids[i]]
    else:
        pairs = list(zip(keep, facts, strict=True))
    return [GivenFact(f"F{i + 1}", ids[i], str(f.source), str(f.section), str(f.content))
            for i, f in pairs]


def window_citer(index: FactIndex, embedder: Embedder, prepared: PreparedWindow,
                 threshold: float) -> Citer:
    """The citer of one window: its given facts, their vectors from the index."""
    given = given_facts(index, prepared)
    pos = [int(g.ref[1:]) - 1 for g in given]
    vectors = (index.vectors(np.asarray([int(prepared.rows[p]) for p in pos], np.int64))
               if pos else np.zeros((0, index.dim), np.float32))
    return Citer(given, vectors, embedder.encode, threshold)


def cite_text(session: Session, citer: Citer, text: str, style: str | None = None
              ) -> CitedText:
    """`text` (the writer's, markers and all) cited, numbered on from the session's, shown
    in `style` (default: the session's `citations` option)."""
    clean, citations = citer.cite(text)
    known = session.citation_numbers
    numbers = number_facts(known, citations.fact_order())
    citations.numbers = {f: numbers[f] for f in citations.fact_order()}
    by_id = {g.fact_id: g for g in citer.given}
    new = tuple(SourceEntry(numbers[f], f, by_id[f].source, by_id[f].section,
                            excerpt(by_id[f].content))
                for f in citations.fact_order() if f not in known)
    return CitedText(clean, citations,
                     rendered(clean, citations, numbers, style or session.options.citations),
                     new)


def record_sources(session: Session, cited: CitedText) -> None:
    """Give the window's newly cited facts their entries in the session's sources list."""
    session.cited_sources.extend(cited.new_sources)


def shown_outputs(events: Sequence[Any]) -> list[str]:
    """Each window's text as the reader sees it (with its markers when the run cites)."""
    return [getattr(e, "shown", None) or e.output for e in events]


def document_of(session: Session, events: Sequence[Any], outline: Sequence[str] = ()) -> str:
    """The run's document: its windows as the reader sees them, each section once
    (`cdr.window.assemble`), then its sources list when the run cites."""
    from cdr.citations.sources import sources_markdown
    from cdr.window.assemble import assemble_document

    text = assemble_document(session.task, shown_outputs(events), outline)
    closing = sources_markdown(session.cited_sources, session.options.citations)
    return text + ("\n" + closing if closing else "")


def stored_citations(window: Mapping[str, Any]) -> WindowCitations | None:
    """The citations of a stored window record (`cdr.trace.window_record`), if it has any."""
    data = window.get("citations")
    return WindowCitations.from_dict(data) if isinstance(data, Mapping) else None


def shown_from_record(window: Mapping[str, Any], style: str) -> str:
    """A stored window's text as the reader saw it: its output with its markers put back,
    exactly as `cite_text` showed it when the window was written."""
    return window_spans(str(window.get("output", "")), stored_citations(window), style)[0]


def window_spans(output: str, citations: WindowCitations | None, style: str
                 ) -> tuple[str, list[CitedSpan]]:
    """A window's shown text and its cited runs (none for a run that does not cite)."""
    if citations is None or style == "off":
        return output, []
    return rendered_spans(output, citations, citations.numbers, style)
