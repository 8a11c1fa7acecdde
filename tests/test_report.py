"""The HTML run report without a browser: what it derives from a trace, how it escapes, the
CSP that guards it, the exit sentences, and `cdr report` / `generate --report` end to end."""

from __future__ import annotations

import base64
import copy
import hashlib
import json
import re
from html import escape
from pathlib import Path

import jsonschema
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from cdr.cli import app
from cdr.ngrams import tokenize
from cdr.report import build_run, explain_exit, mark_repeats, render_report
from cdr.report.page import asset
from cdr.report.svg import Series, line_chart, nice_max
from cdr.trace import TRACE_SCHEMA
from cdr.window.dpe import split_paragraphs
from tests.ui_fixtures import HOSTILE_HEADING, MARKUP, OUTLINE, TASK

pytest_plugins = ["tests.ui_fixtures"]
runner = CliRunner()


def _six(text: str) -> set[tuple[str, ...]]:
    t = tokenize(text)
    return {tuple(t[i:i + 6]) for i in range(len(t) - 5)}


@given(st.lists(st.sampled_from(["alpha", "beta", "gamma", "delta", "Eps", "zeta", ",", "\n",
                                 " ", ". "]), max_size=60),
       st.lists(st.sampled_from(["alpha", "beta", "gamma", "delta", "eps", "zeta"]),
                max_size=30))
def test_mark_repeats_round_trips_and_marks_exactly_the_seen_6grams(words, earlier):
    text = " ".join(words)
    seen = _six(" ".join(earlier))
    segments, n_marked = mark_repeats(text, seen)
    assert "".join(s for s, _ in segments) == text
    tokens = tokenize(text)
    expect = [False] * len(tokens)
    for i in range(len(tokens) - 5):
        if tuple(tokens[i:i + 6]) in seen:
            expect[i:i + 6] = [True] * 6
    assert n_marked == sum(expect)
    marked_tokens = [t for s, rep in segments if rep for t in tokenize(s)]
    assert marked_tokens == [t for t, m in zip(tokens, expect, strict=True) if m]


def test_mark_repeats_examples():
    seen = _six("one two three four five six seven")
    segs, n = mark_repeats("Zero One two three four five six! eight", seen)
    assert segs == [("Zero ", False), ("One two three four five six", True),
                    ("! eight", False)]
    assert n == 6
    assert mark_repeats("", seen) == ([], 0)


def test_trace_carries_attribution_per_paragraph(hostile_traces):
    for path in hostile_traces.values():
        trace = json.loads(path.read_text())
        jsonschema.validate(trace, TRACE_SCHEMA)
        for w in trace["windows"]:
            assert len(w["attribution"]) == len(split_paragraphs(w["output"]))
            ids = {s["id"] for s in trace["sub_queries"]}
            assert set(a for a in w["attribution"] if a) <= ids
            # Stage 8 credits depth only to sub-queries it attributed paragraphs to.
            assert {a["id"] for a in w["addressed"]} <= set(w["attribution"])


def test_report_escapes_every_piece_of_document_text(hostile_traces):
    traces = [json.loads(p.read_text()) for p in hostile_traces.values()]
    written = "".join(w["output"] for t in traces for w in t["windows"])
    found = [m for m in MARKUP if m in written]
    assert found, "precondition: a hostile fact was written"
    hostile = copy.deepcopy(traces[0])
    hostile["task"] = "Guide <script>window.__pwned = 4</script>"
    hostile["sub_queries"][0]["text"] = '"><img src=x onerror="window.__pwned=5">'
    hostile["windows"][0]["envelope"][0]["source"] = "x<td><script>window.__pwned=6"
    hostile["windows"][0]["headers"]["X-Evil"] = "<b onmouseover=alert(1)>"
    hostile["windows"][0]["dropped"] = ["Said before <script>window.__pwned = 7</script>"]
    jsonschema.validate(hostile, TRACE_SCHEMA)
    html = render_report([hostile, traces[1]])
    scripts = re.findall(r"<script\b[^>]*>", html)
    assert scripts == ["<script>"], scripts  # the report's own script, nothing else
    assert "<img" not in html and "<b onmouseover" not in html
    assert all(escape(m) in html for m in found)
    assert "&lt;script&gt;window.__pwned = 4&lt;/script&gt;" in html
    assert "x&lt;td&gt;&lt;script&gt;window.__pwned=6" in html
    # What the repeat guard took out is shown, escaped, under the window it was taken from.
    assert "Taken out by the repeat guard (1: said by an earlier window)" in html
    assert "<li>Said before &lt;script&gt;window.__pwned = 7&lt;/script&gt;</li>" in html


def test_csp_allows_exactly_the_inline_style_and_script():
    html = render_report([_minimal_trace()])
    csp = re.search(r'http-equiv="Content-Security-Policy" content="([^"]+)"', html).group(1)
    csp = csp.replace("&#x27;", "'")

    def sha(text: str) -> str:
        return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode()

    assert f"script-src {sha(asset('report.js'))}'" in csp
    assert f"style-src {sha(asset('report.css'))}'" in csp
    assert "default-src 'none'" in csp and "connect-src 'none'" in csp
    assert f"<script>{asset('report.js')}</script>" in html
    assert f"<style>{asset('report.css')}</style>" in html
    assert "http://" not in html.replace('xmlns="http://www.w3.org/2000/svg"', "")
    assert "https://" not in html and " style=" not in html


def _minimal_trace(status: str = "limit-reached", **window) -> dict:
    w = {"number": 1, "envelope": [{"fact_id": "f1", "source": "/srv/docs/a.md",
                                    "section": "A", "relevance": 0.8, "novelty": 1.0,
                                    "residual_pull": 0.0, "ngram_penalty": 0.0, "score": 0.8,
                                    "tokens": 10}],
         "output": "Some text about a.", "addressed": [{"id": "sq-1", "depth": 0.2}],
         "completeness": 0.22, "residual": ["sq-1"],
         "headers": {"CRP-Context-Coverage-Score": "1.00", "CRP-Context-Coverage-Depth": "0",
                     "CRP-Context-NGram-Guard-Activations": "0",
                     "CRP-Context-Continuation-Status": status}}
    w.update(window)
    return {"task": "T", "embedding_model": "m", "ranking": "cdr",
            "sub_queries": [{"id": "sq-1", "text": "A", "expected_words": 100}],
            "windows": [w], "status": status}


def test_exit_reasons_are_explained_in_a_sentence():
    def say(status: str, **window) -> str:
        return explain_exit(build_run(_minimal_trace(status, **window), "x"))

    assert say("task-complete").startswith("Stopped after window 1 because the task was done")
    assert say("limit-reached") == ("Stopped after window 1 because the window limit (1) was "
                                    "reached (Exit 2) with completeness 0.22; still open: A.")
    assert "mean novelty ratio 1.00, below 0.15" in say("ckf-exhausted")
    assert "no fact left that is both relevant" in say("ckf-exhausted", envelope=[])
    # the options' own ends (optional trace fields): a window too thin to write, a stale one
    thin = say("ckf-exhausted", output="", grounds_words=37)
    assert "could ground about 37 words" in thin and "(1 fact)" in thin
    assert "mean novelty" in say("ckf-exhausted", grounds_words=37)  # it was written
    assert "mean novelty" in say("ckf-exhausted", output="", grounds_words=40)
    assert "80% of its envelope" in say("ckf-exhausted", output="", sent_before=0.8)
    assert say("upstream-error", error="HTTP 503: overloaded") == (
        "Stopped in window 1 because the writer failed: HTTP 503: overloaded. The text "
        "received before the failure was kept.")
    assert "Exit 4" in say("safety-budget-depleted")
    assert say("in-progress") == "Still running: 1 window so far."


def test_report_hides_server_paths_and_old_traces_still_render():
    html = render_report([_minimal_trace()])
    assert "/srv/docs" not in html and "a.md › A" in html
    assert "no per-paragraph attribution" in html  # the minimal trace predates the field


def test_charts_have_fixed_sizes_and_nice_axes():
    svg = line_chart("t", [Series("a", [0.1, None, 0.5], "#000")])
    assert svg.startswith('<svg class="chart" xmlns="http://www.w3.org/2000/svg" width="400" '
                          'height="220" viewBox="0 0 400 220"')
    assert svg.count("<circle") == 2
    assert [nice_max(x) for x in (0, 3, 5, 39, 78)] == [1.0, 4.0, 8.0, 40.0, 80.0]


def test_cdr_report_cli_side_by_side(hostile_traces, tmp_path):
    out = tmp_path / "run.html"
    res = runner.invoke(app, ["report", str(hostile_traces["cdr"]),
                              str(hostile_traces["relevance"]), "--out", str(out)])
    assert res.exit_code == 0, res.output
    html = out.read_text()
    assert html.count('class="card s0"') == html.count('class="card s1"') >= 2
    assert "cdr (solid), relevance (dashed)" in html
    assert html.count("<svg") >= 5 + 3  # 5 overlaid charts + one per sub-query


def test_cdr_report_cli_errors(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json", encoding="utf-8")
    notrace = tmp_path / "other.json"
    notrace.write_text('{"hello": 1}', encoding="utf-8")
    for args, words in (([str(tmp_path / "missing.json")], "cannot read trace"),
                        ([str(bad)], "is not JSON"),
                        ([str(notrace)], "has no 'task' field: not a cdr trace")):
        res = runner.invoke(app, ["report", *args, "--out", str(tmp_path / "o.html")])
        assert res.exit_code == 2 and words in " ".join(res.output.split()), res.output
    assert not (tmp_path / "o.html").exists()


def test_generate_writes_a_report(hostile_ckf: Path, tmp_path: Path):
    outline = tmp_path / "outline.txt"
    outline.write_text(OUTLINE, encoding="utf-8")
    report = tmp_path / "run.html"
    res = runner.invoke(app, ["generate", TASK, "--ckf", str(hostile_ckf), "--outline",
                              str(outline), "--windows", "2", "--words", "3000",
                              "--report", str(report), "--out", str(tmp_path / "doc.md")])
    assert res.exit_code == 0, res.output
    html = report.read_text()
    assert html.startswith("<!DOCTYPE html>") and 'id="w2"' in html
    assert HOSTILE_HEADING not in html
