"""`cdr report` against hostile traces and labels: run labels and every trace field that
reaches the page are escaped, and a trace's `ranking` must be a known ranking mode."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from cdr.cli import app
from cdr.errors import InvalidInputError
from cdr.ranking import RANKING_MODES
from cdr.report import render_report, render_trace_body

runner = CliRunner()
MARK = ('<meta http-equiv="refresh" content="0;url=https://evil.example">'
        "<img src=x onerror=alert(1)>")


def trace(**top: Any) -> dict[str, Any]:
    w = {"number": 1, "envelope": [{"fact_id": "f1", "source": "docs/a.md",
                                    "section": "A", "relevance": 0.8, "novelty": 1.0,
                                    "residual_pull": 0.0, "ngram_penalty": 0.0, "score": 0.8,
                                    "tokens": 10}],
         "output": "Some text about a.", "addressed": [{"id": "sq-1", "depth": 0.2}],
         "completeness": 0.22, "residual": ["sq-1"],
         "headers": {"CRP-Context-Coverage-Score": "1.00", "CRP-Context-Coverage-Depth": "0",
                     "CRP-Context-NGram-Guard-Activations": "0",
                     "CRP-Context-Continuation-Status": "limit-reached"}}
    out = {"task": "T", "embedding_model": "m", "ranking": "cdr",
           "sub_queries": [{"id": "sq-1", "text": "A", "expected_words": 100}],
           "windows": [w], "status": "limit-reached"}
    out.update(top)
    return out


def no_markup(html: str, benign: str | None = None) -> None:
    assert "<meta http-equiv=\"refresh\"" not in html
    assert "<img" not in html
    benign = render_report([trace()]) if benign is None else benign
    assert html.count("<meta ") == benign.count("<meta ")  # none planted


def test_labels_are_escaped_everywhere_they_appear() -> None:
    html = render_report([trace(), trace()], labels=[MARK, "b" + MARK])
    no_markup(html)
    assert "&lt;meta http-equiv=&quot;refresh&quot;" in html


def test_cdr_report_label_option_is_escaped(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    path.write_text(json.dumps(trace()), encoding="utf-8")
    out = tmp_path / "r.html"
    res = runner.invoke(app, ["report", str(path), "--label", MARK, "--out", str(out)])
    assert res.exit_code == 0, res.output
    no_markup(out.read_text(encoding="utf-8"))


@pytest.mark.parametrize("ranking", [MARK, "CDR", "", 3, None, ["cdr"]])
def test_an_unknown_ranking_is_refused(tmp_path: Path, ranking: Any) -> None:
    path = tmp_path / "t.json"
    path.write_text(json.dumps(trace(ranking=ranking)), encoding="utf-8")
    out = tmp_path / "r.html"
    res = runner.invoke(app, ["report", str(path), "--out", str(out)])
    assert res.exit_code == 2, res.output
    message = " ".join(res.output.split())
    assert "ranking" in message and "cdr" in message and "relevance" in message
    assert "<img" not in message
    assert not out.exists()
    with pytest.raises(InvalidInputError, match="ranking"):
        render_trace_body(trace(ranking=ranking))


@pytest.mark.parametrize("mode", RANKING_MODES)
def test_every_known_ranking_renders(mode: str) -> None:
    assert "<section" in render_report([trace(ranking=mode)])


# Every string a trace carries that the page shows.
FIELDS = [("task",), ("sub_queries", 0, "text"), ("sub_queries", 0, "id"),
          ("windows", 0, "output"), ("windows", 0, "envelope", 0, "source"),
          ("windows", 0, "envelope", 0, "section"), ("windows", 0, "envelope", 0, "fact_id"),
          ("windows", 0, "headers", "CRP-Context-Coverage-Score"),
          ("windows", 0, "addressed", 0, "id"), ("windows", 0, "residual", 0),
          ("embedding_model",)]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(FIELDS), min_size=1, max_size=4, unique=True),
       st.text(max_size=20))
def test_every_trace_field_reaching_html_is_escaped(fields: list[tuple[Any, ...]],
                                                    noise: str) -> None:
    t = copy.deepcopy(trace())
    for path in fields:
        node: Any = t
        for part in path[:-1]:
            node = node[part]
        node[path[-1]] = noise + MARK
    try:
        html = render_report([t])
    except InvalidInputError:
        return  # a refused trace writes no page
    no_markup(html)
    no_markup(render_trace_body(t), render_trace_body(trace()))
