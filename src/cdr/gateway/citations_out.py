"""A citing run's citations on the OpenAI wire: annotations on the message, and its sources.

OpenAI-compatible clients already read two shapes: `message.annotations`, a list of
`{"type": "url_citation", "url_citation": {"start_index", "end_index", "url", "title"}}` over
spans of the content (OpenAI's own), and a top-level `citations` list of sources (as search
APIs answer). The gateway gives both: one annotation per cited run of sentences and fact, its
span in the document the client received (streamed or not: the same text), with the number
the text shows and the fact's id; `citations` lists each number's source; `crp.sources` the
full entries. Sources are made public as every path the gateway shows
(`cdr.gateway.paths.public_path`): the server's directories are not the client's business.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from cdr.citations.attribute import CitedSpan
from cdr.citations.sources import SourceEntry
from cdr.gateway.paths import public_path


def message_annotations(windows: Sequence[tuple[str, list[CitedSpan]]],
                sources: Sequence[SourceEntry], separator: str) -> list[dict[str, Any]]:
    """Annotations over the document the windows' shown texts assemble into (each stripped,
    joined by `separator`, as the stream delivers them)."""
    by_number = {e.number: e for e in sources}
    out: list[dict[str, Any]] = []
    at = 0
    first = True
    for text, spans in windows:
        body = text.strip()
        if not body:
            continue
        if not first:
            at += len(separator)
        first = False
        lead = len(text) - len(text.lstrip())
        for span in spans:
            for number, fact_id in zip(span.numbers, span.facts, strict=True):
                entry = by_number.get(number)
                out.append({"type": "url_citation", "url_citation": {
                    "start_index": at + span.start - lead, "end_index": at + span.end - lead,
                    "url": str(public_path(entry.source)) if entry and entry.source else "",
                    "title": entry.title if entry else "", "number": number,
                    "fact_id": fact_id}})
        at += len(body)
    return out


def public_entries(sources: Sequence[SourceEntry]) -> list[dict[str, Any]]:
    """The sources list as the client sees it: each entry with its source made public."""
    return [{**e.to_dict(), "source": str(public_path(e.source)) if e.source else ""}
            for e in sources]


def citation_list(sources: Sequence[SourceEntry]) -> list[str]:
    """The top-level `citations`: each number's source (its place + 1 is its number)."""
    return [str(public_path(e.source)) if e.source else e.title
            for e in sorted(sources, key=lambda e: e.number)]
