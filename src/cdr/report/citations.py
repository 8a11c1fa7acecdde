"""The report's view of a citing run: each window's text with its citation markers, the
sentences no fact supports, and the run's sources.

A marker is a link to its entry in the sources list and carries the cited fact's opening words
as its title, so hovering shows the fact and clicking finds its source. Every piece of text
comes from the trace (written text, fact excerpts, titles, paths) and is escaped; sources are
shown by file name, never by a server's directory (`cdr.report.html_text.short_source`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from cdr.citations import UNSUPPORTED, WindowCitations
from cdr.citations.attribute import cited_runs
from cdr.report.html_text import e, short_source


def _entries(trace: Mapping[str, Any]) -> dict[int, Mapping[str, Any]]:
    """The trace's sources by number; an entry without a whole number is left out."""
    out: dict[int, Mapping[str, Any]] = {}
    for s in trace.get("sources") or ():
        number = s.get("number") if isinstance(s, Mapping) else None
        if isinstance(number, int) and not isinstance(number, bool):
            out[number] = s
    return out


def _marker(run: int, number: int, entry: Mapping[str, Any] | None) -> str:
    title = str(entry.get("excerpt") or entry.get("title") or "") if entry else ""
    n = e(int(number))
    return (f'<sup class="cite"><a href="#src-{int(run)}-{n}" title="{e(title)}">'
            f"[{n}]</a></sup>")


def cited_text(trace: Mapping[str, Any], record: Mapping[str, Any], run: int) -> str:
    """The window's text with its markers and its unsupported sentences marked; "" when the
    window carries no citations."""
    data = record.get("citations")
    if not isinstance(data, Mapping):
        return ""
    output = str(record.get("output", ""))
    try:
        citations = WindowCitations.from_dict(data)
    except (KeyError, TypeError, ValueError):  # a damaged trace: its text shows without them
        return ""
    entries = _entries(trace)
    markers = {r.end: r.numbers for r in cited_runs(citations, citations.numbers)}
    out: list[str] = []
    at = 0
    for s in sorted(citations.sentences, key=lambda s: s.start):
        out.append(e(output[at:s.start]))
        cls = "sent unsupported" if s.status == UNSUPPORTED else f"sent {s.status}"
        hint = (' title="no fact given to this window supports this sentence"'
                if s.status == UNSUPPORTED else "")
        out.append(f'<span class="{cls}"{hint}>{e(output[s.start:s.end])}</span>')
        out.append("".join(_marker(run, n, entries.get(n)) for n in markers.get(s.end, ())))
        at = s.end
    out.append(e(output[at:]))
    flagged = [output[s.start:s.end] for s in citations.unsupported]
    items = "".join(f"<li>{e(t)}</li>" for t in flagged)
    listing = (f'<details><summary>Unsupported sentences ({len(flagged)}: no fact given to '
               f'this window supports them)</summary><ul class="unsupported">{items}</ul>'
               "</details>" if flagged else "")
    share = data.get("cited_share")
    stats = (f'<p class="stats">{citations.cited}/{citations.factual} factual sentences cited'
             f"{f' ({float(share):.0%})' if share is not None else ''} · "
             f"{len(flagged)} unsupported · {citations.invalid} citations to facts outside "
             f"the envelope dropped</p>")
    return (f'<details open><summary>Cited text (hover a marker to see the fact, click it for '
            f'its source)</summary>{stats}<div class="text cited"><pre class="prose">'
            f'{"".join(out)}</pre></div>{listing}</details>')


def _section_rest(section: str) -> str:
    """The section path below the document's title (its first part), as ` › a › b`."""
    rest = [p.strip() for p in section.split(" > ")[1:] if p.strip()]
    return "".join(f" › {e(p)}" for p in rest)


def sources_list(traces: Sequence[Mapping[str, Any]], labels: Sequence[str]) -> str:
    """Each citing run's sources, numbered as its markers, with the fact's opening words."""
    parts = []
    for run, (trace, label) in enumerate(zip(traces, labels, strict=True)):
        entries = _entries(trace)
        if not entries:
            continue
        rows = "".join(
            f'<li id="src-{run}-{n}" value="{n}"><b>{e(s.get("title", ""))}</b>'
            f'{_section_rest(str(s.get("section", "")))} — '
            f'{e(short_source(str(s.get("source", ""))))}'
            f'{": “" + e(s["excerpt"]) + "”" if s.get("excerpt") else ""}</li>'
            for n, s in sorted(entries.items()))
        parts.append(f"<h3>Sources — {e(label)}</h3><ol class=\"sources\">{rows}</ol>")
    return f'<section class="sources">{"".join(parts)}</section>' if parts else ""
