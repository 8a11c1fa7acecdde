"""The documents a run's windows sent (`cdr.window.spread`, the trace's optional `documents`):
exact on a small case, a property against a brute force (hypothesis), and the report's line."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from cdr.report.render import SHOWN_DOCUMENTS, documents_line
from cdr.window.spread import documents_per_window


def _window(output: str, *facts: tuple[str, str]) -> dict[str, Any]:
    return {"output": output, "envelope": [{"fact_id": f, "source": s} for f, s in facts]}


def test_exact_on_a_small_run() -> None:
    got = documents_per_window([
        _window("text", ("a1", "/kb/a.md"), ("a2", "/kb/a.md"), ("b1", "/kb/b.md")),
        _window("", ("c1", "/kb/c.md")),  # not written: nothing was sent
        _window("more", ("a1", "/kb/a.md"), ("c1", "/kb/c.md"), ("c2", "/kb/c.md")),
    ])
    assert got[0] == {"sent": 2, "new": 2, "shares": {"/kb/a.md": 0.6667, "/kb/b.md": 0.3333}}
    assert got[1] == {**got[0], "new": 0}
    # a1 counts once; c's two facts tie with a's two: ties by source
    assert got[2] == {"sent": 3, "new": 1,
                      "shares": {"/kb/a.md": 0.4, "/kb/c.md": 0.4, "/kb/b.md": 0.2}}
    assert documents_per_window([]) == []


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.lists(st.tuples(st.integers(0, 12),
                                                            st.integers(0, 4)), max_size=8)),
                max_size=6))
def test_shares_count_each_fact_once_by_its_source(run: list[tuple[bool, list[tuple[int, int]]]]
                                                   ) -> None:
    """Each fact id has one source (as in a CKF): fact i lives in document i % 5's."""
    windows = [_window("x" if w else "", *((f"f{i}", f"d{i % 5}") for i, _ in facts))
               for w, facts in run]
    got = documents_per_window(windows)
    sent: set[int] = set()
    for (w, facts), g in zip(run, got, strict=True):
        before = {i % 5 for i in sent}
        if w:
            sent |= {i for i, _ in facts}
        docs = {i % 5 for i in sent}
        assert g["sent"] == len(docs) and g["new"] == len(docs - before)
        for d in docs:
            share = sum(1 for i in sent if i % 5 == d) / len(sent)
            assert abs(g["shares"][f"d{d}"] - share) <= 5e-5
        assert list(g["shares"].values()) == sorted(g["shares"].values(), reverse=True)


def test_the_report_line_names_the_largest_shares_by_file_name() -> None:
    shares = {f"/srv/kb/doc{i}.md": round(0.3 - i * 0.02, 2) for i in range(8)}
    line = documents_line({"documents": {"sent": 8, "new": 3, "shares": shares}})
    assert "documents sent so far: 8 (+3 in this window)" in line
    assert "doc0.md 30%" in line and f"doc{SHOWN_DOCUMENTS - 1}.md" in line
    assert f"doc{SHOWN_DOCUMENTS}.md" not in line and "3 more" in line
    assert "/srv/kb" not in line  # no server path in a shared report
    assert documents_line({"output": ""}) == ""  # a trace from before the field
    assert "&lt;b&gt;" in documents_line({"documents": {"sent": 1, "new": 1,
                                                        "shares": {"<b>.md": 1.0}}})
