"""The report's HTML body, built from `RunView`s on the server side: every piece of document
text (task, sub-queries, sources, sections, written text, headers) goes through
`html.escape`, so a fact containing `<script>` shows as text. The same body serves the static
report (`cdr report`) and the gateway's live inspector, which swaps it in as windows arrive."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from cdr.report.analysis import RunView, WindowView, explain_exit, length_sentence
from cdr.report.citations import cited_text, sources_list
from cdr.report.html_text import e, short_source
from cdr.report.svg import Series, bar_chart, line_chart

RUN_COLORS = ("#2563eb", "#ea580c", "#16a34a", "#9333ea")
SQ_COLORS = ("#0ea5e9", "#f59e0b", "#10b981", "#ef4444", "#8b5cf6", "#ec4899", "#84cc16",
             "#14b8a6", "#f97316", "#6366f1")
_COLUMNS = (("#", "num"), ("source › section", "text"), ("relevance", "num"),
            ("novelty", "num"), ("residual pull", "num"), ("n-gram penalty", "num"),
            ("score", "num"), ("tokens", "num"))


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{x:.0%}"


def sq_class(run: RunView, sq_id: str | None) -> str:
    """A CSS class per sub-query (q0..q9): colours come from the stylesheet, because a strict
    CSP forbids inline style attributes."""
    ids = [str(s["id"]) for s in run.sub_queries]
    return f"q{ids.index(sq_id) % len(SQ_COLORS)}" if sq_id in ids else "qn"


def _series(runs: Sequence[RunView], value: Any) -> list[Series]:
    return [Series(r.label, [value(w) for w in r.windows], RUN_COLORS[i % len(RUN_COLORS)],
                   dashed=i > 0) for i, r in enumerate(runs)]


def charts(runs: Sequence[RunView]) -> str:
    """Completeness, coverage score, guard activations, repetition; then per-sub-query depth
    as small multiples (runs overlaid on each, matched by sub-query text)."""
    parts = [
        line_chart("Completeness after each window", _series(runs, lambda w: w.completeness)),
        line_chart("Coverage score (CRP-Context-Coverage-Score)",
                   _series(runs, lambda w: w.coverage_score)),
        bar_chart("N-gram guard activations per window",
                  _series(runs, lambda w: w.guard_activations)),
        line_chart("Repeated text: share of 6-grams already written (CWR6)",
                   _series(runs, lambda w: w.cwr6)),
        line_chart("Facts reused from earlier windows", _series(runs, lambda w: w.reuse)),
    ]
    main = "".join(f'<figure class="fig">{p}</figure>' for p in parts)
    texts: list[str] = []
    for r in runs:
        for sq in r.sub_queries:
            if str(sq["text"]) not in texts:
                texts.append(str(sq["text"]))
    small = []
    for text in texts:
        series = []
        for i, r in enumerate(runs):
            sq_id = next((str(s["id"]) for s in r.sub_queries if str(s["text"]) == text), None)
            if sq_id is None:
                continue
            series.append(Series(r.label, [w.depth.get(sq_id, 0.0) for w in r.windows],
                                 RUN_COLORS[i % len(RUN_COLORS)], dashed=i > 0))
        chart = line_chart(text, series, 1.0, 240, 150, legend=len(runs) > 1)
        small.append(f'<figure class="fig small">{chart}</figure>')
    return (f'<section class="charts"><h2>Over the windows</h2><div class="grid">{main}</div>'
            f'<h3>Depth of each sub-query (cumulative, capped at 1)</h3>'
            f'<div class="grid">{"".join(small)}</div></section>')


def summary(runs: Sequence[RunView]) -> str:
    rows = []
    for i, r in enumerate(runs):
        last = r.windows[-1] if r.windows else None
        rows.append(
            f'<tr><td><span class="swatch s{i}"></span>{e(r.label)}</td>'
            f'<td>{e(r.trace.get("ranking", "?"))}</td><td>{len(r.windows)}</td>'
            f"<td>{e(r.status)}</td><td>{last.completeness if last else 0:.2f}</td>"
            f"<td>{_pct(r.later_mean('cwr6'))}</td><td>{_pct(r.later_mean('reuse'))}</td>"
            f"<td>{r.distinct_facts}</td></tr>")
    exits = "".join(f'<p class="exit"><b>{e(r.label)}:</b> {e(explain_exit(r))}'
                    f'{e(length_sentence(r))}</p>' for r in runs)
    return (
        '<section class="summary"><table class="kv"><thead><tr><th>run</th><th>ranking</th>'
        "<th>windows</th><th>status</th><th>completeness</th>"
        '<th title="mean over windows 2+">repeated 6-grams</th>'
        '<th title="mean over windows 2+">facts reused</th><th>distinct facts</th></tr>'
        f'</thead><tbody>{"".join(rows)}</tbody></table>{exits}</section>')


def sub_query_table(runs: Sequence[RunView]) -> str:
    head = "".join(f"<th>depth: {e(r.label)}</th>" for r in runs)
    base = runs[0]
    rows = []
    for sq in base.sub_queries:
        cells = []
        for r in runs:
            sq_id = next((str(s["id"]) for s in r.sub_queries if s["text"] == sq["text"]), None)
            d = r.windows[-1].depth.get(sq_id, 0.0) if (sq_id and r.windows) else None
            cells.append(f"<td>{'–' if d is None else f'{d:.2f}'}</td>")
        rows.append(f'<tr><td><span class="tag {sq_class(base, str(sq["id"]))}">'
                    f'{e(sq["id"])}</span></td><td>{e(sq["text"])}</td>'
                    f'<td>{e(sq.get("expected_words", ""))}</td>{"".join(cells)}</tr>')
    return ('<section><h2>Sub-queries</h2><table class="kv"><thead><tr><th>id</th>'
            f"<th>sub-query</th><th>expected words</th>{head}</tr></thead>"
            f'<tbody>{"".join(rows)}</tbody></table></section>')


def envelope_table(w: WindowView) -> str:
    head = "".join(f'<th data-sort="{kind}" tabindex="0">{e(name)}</th>'
                   for name, kind in _COLUMNS)
    rows = []
    for i, f in enumerate(w.record["envelope"]):
        where = short_source(str(f["source"])) + (f" › {f['section']}" if f.get("section")
                                                  else "")
        seen = w.seen_before.get(f["fact_id"])
        badge = f' <span class="seen">also in window {seen}</span>' if seen else ""
        nums = "".join(f'<td data-v="{float(f[k])}">{float(f[k]):.2f}</td>'
                       for k in ("relevance", "novelty", "residual_pull", "ngram_penalty",
                                 "score"))
        rows.append(f'<tr><td data-v="{i + 1}">F{i + 1}</td>'
                    f'<td data-v="{e(where)}" title="{e(f["fact_id"])}">{e(where)}{badge}</td>'
                    f'{nums}<td data-v="{int(f["tokens"])}">{int(f["tokens"])}</td></tr>')
    if not rows:
        return '<p class="muted">Empty envelope: no fact was both relevant and novel.</p>'
    return (f'<div class="scroll"><table class="env sortable"><thead><tr>{head}</tr></thead>'
            f'<tbody>{"".join(rows)}</tbody></table></div>')


def window_text(run: RunView, w: WindowView) -> str:
    names = {str(s["id"]): str(s["text"]) for s in run.sub_queries}
    out = []
    if not w.has_attribution and w.paragraphs:
        out.append('<p class="muted">This trace has no per-paragraph attribution (written '
                   "before traces carried it); paragraphs are untagged.</p>")
    heading = None
    for p in w.paragraphs:
        if p.heading and p.heading != heading:
            out.append(f"<h5>{e(p.heading)}</h5>")
            heading = p.heading
        body = "".join(f"<mark>{e(t)}</mark>" if rep else e(t) for t, rep in p.segments)
        if p.sub_query is not None:
            depth = w.added.get(p.sub_query, 0.0)
            d = f" · depth {depth:.2f} this window"
            tag = (f'<span class="tag {sq_class(run, p.sub_query)}" '
                   f'title="{e(names.get(p.sub_query, ""))}">{e(p.sub_query)}{d}</span>')
        elif w.has_attribution:
            tag = '<span class="tag none">no sub-query</span>'
        else:
            tag = ""
        rep = (f'<span class="rep">{p.repeated_words}/{p.words} words repeat earlier '
               "windows</span>" if p.repeated_words else "")
        out.append(f'<div class="para">{tag}{rep}<p>{body}</p></div>')
    if not w.paragraphs:
        out.append('<p class="muted">No text was written in this window.</p>')
    return "".join(out)


def headers_table(w: WindowView) -> str:
    rows = "".join(f"<tr><th>{e(k)}</th><td>{e(v)}</td></tr>"
                   for k, v in w.record["headers"].items())
    return f'<table class="kv hdr">{rows}</table>'


def window_card(run: RunView, w: WindowView | None, index: int) -> str:
    if w is None:
        return (f'<div class="card s{index} empty"><p class="muted">{e(run.label)}: '
                "no such window</p></div>")
    r = w.record
    error = f'<p class="error">writer error: {e(r["error"])}</p>' if r.get("error") else ""
    addressed = ", ".join(f"{e(k)} +{v:.2f}" for k, v in w.added.items()) or "none"
    return (
        f'<div class="card s{index}"><h4><span class="swatch s{index}"></span>{e(run.label)}'
        f" — window {w.number}</h4>"
        f'<p class="stats">completeness {w.completeness:.2f} · addressed: {addressed} · '
        f"repeated 6-grams {w.cwr6:.0%} · facts reused {w.reuse:.0%}</p>"
        f"{documents_line(r)}{error}"
        f"<details><summary>CRP headers</summary>{headers_table(w)}</details>"
        f'<details open><summary>Envelope ({len(r["envelope"])} facts; click a column '
        f"to sort)</summary>{envelope_table(w)}</details>"
        f'<details open><summary>Written text (paragraph tags: the sub-query Stage 8 '
        f"credited; <mark>highlight</mark>: 6-grams already written)</summary>"
        f'<div class="text">{window_text(run, w)}</div></details>'
        f"{cited_text(run.trace, r, index)}{dropped_text(r)}</div>")


# The documents a window card names by their share of the facts sent so far; the rest are
# counted.
SHOWN_DOCUMENTS = 5


def documents_line(record: Mapping[str, Any]) -> str:
    """The documents sent so far and the largest shares of the facts sent so far (the trace's
    optional `documents`, `cdr.window.spread`); nothing for a trace without it."""
    docs = record.get("documents")
    if not isinstance(docs, Mapping) or not isinstance(docs.get("shares"), Mapping):
        return ""
    shares = list(docs["shares"].items())
    named = ", ".join(f"{e(short_source(str(src)))} {float(v):.0%}"
                      for src, v in shares[:SHOWN_DOCUMENTS])
    rest = len(shares) - SHOWN_DOCUMENTS
    more = f", {rest} more" if rest > 0 else ""
    return (f'<p class="stats docs">documents sent so far: {int(docs.get("sent", 0))} '
            f'(+{int(docs.get("new", 0))} in this window){": " + named if named else ""}'
            f"{more}</p>")


def dropped_text(record: Mapping[str, Any]) -> str:
    """What the repeat guard (`repeats: "drop"`) took out of the window, if anything."""
    units = record.get("dropped") or []
    if not units:
        return ""
    items = "".join(f"<li>{e(str(u))}</li>" for u in units)
    return (f"<details><summary>Taken out by the repeat guard ({len(units)}: said by an "
            f"earlier window)</summary><ul class=\"dropped\">{items}</ul></details>")


def windows(runs: Sequence[RunView]) -> str:
    n = max((len(r.windows) for r in runs), default=0)
    rows = []
    for k in range(n):
        cards = "".join(window_card(r, r.windows[k] if k < len(r.windows) else None, i)
                        for i, r in enumerate(runs))
        rows.append(f'<section class="window cols{len(runs)}" id="w{k + 1}">'
                    f"<h3>Window {k + 1}</h3><div class=\"row\">{cards}</div></section>")
    return "".join(rows)


def render_body(runs: Sequence[RunView]) -> str:
    """Everything below the page title, for one run or several side by side."""
    task = runs[0].trace["task"]
    also = "".join(f"<p class='muted'>{e(r.label)} task: {e(r.trace['task'])}</p>"
                   for r in runs[1:] if r.trace["task"] != task)
    return (f'<header><h1>{e(task)}</h1>{also}<p class="muted">embedding model '
            f'{e(runs[0].trace.get("embedding_model", "?"))}</p></header>'
            f"{summary(runs)}{HOW_TO_READ}{charts(runs)}{sub_query_table(runs)}{windows(runs)}"
            f"{sources_list([r.trace for r in runs], [r.label for r in runs])}")


HOW_TO_READ = (
    '<details class="howto"><summary>How to read this report</summary><p>Each window is one '
    "LLM call. Before it, cdr picks facts for its <b>envelope</b>: with CDR ranking, a fact's "
    "score is its <i>relevance</i> to the task × its <i>novelty</i> (1 − how much of its "
    "topic earlier windows already covered, never below 0.20) × (1 − its <i>n-gram "
    "penalty</i>: 0.15 per 6-gram of it already written) + a <i>residual pull</i> toward "
    "sub-queries not yet written. Relevance-only ranking uses relevance alone, so it tends to "
    "send the same top facts every window. After each window, Stage 8 credits each paragraph "
    "to a sub-query (the tags) and turns words into <i>depth</i>; <i>completeness</i> is the "
    "mean depth. <mark>Highlighted</mark> text repeats a 6-word sequence an earlier window "
    "already wrote. The loop stops when the task is complete, the window limit is hit, the "
    "knowledge base has nothing new left, or the writer fails.</p></details>")
