"""Length fidelity (`cdr.window.length`): LongBench-Write's length score, the window capacity, and
the words a run reports against the words asked (trace, CLI, run report)."""

from __future__ import annotations

import json
import re
from fractions import Fraction
from pathlib import Path

import jsonschema
import pytest
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from cdr.cli import app
from cdr.errors import InvalidInputError
from cdr.report.analysis import build_run, length_sentence
from cdr.trace import TRACE_SCHEMA
from cdr.window.length import (
    LengthReport,
    capacity_warning,
    count_words,
    length_score,
    run_length,
    window_capacity,
    windows_needed,
    within_tolerance,
)
from tests.conftest import BUILTIN_TYPES_TASK

runner = CliRunner()


@pytest.mark.parametrize(("asked", "delivered", "score"), [
    (1000, 1000, 100.0),
    (1000, 1600, 80.0),  # 1 − 0.6/3
    (1000, 1300, 90.0),
    (1000, 4000, 0.0),  # 1 − 3/3
    (1000, 9000, 0.0),  # clipped at 0
    (1000, 800, 87.5),  # 1 − 0.25/2
    (1000, 500, 50.0),  # 1 − 1/2
    (1000, 250, 0.0),  # 1 − 3/2 < 0
    (1200, 721, 100 * (1 - (1200 / 721 - 1) / 2)),
    (1000, 0, 0.0),
])
def test_length_score_exact_values(asked: int, delivered: int, score: float):
    assert length_score(asked, delivered) == pytest.approx(score, abs=1e-12)


def test_length_score_is_exact_not_rounded():
    # Fractions: 1,600 of 1,000 is 80.0 exactly, where floats give 79.99999999999999.
    assert length_score(1000, 1600) == 80.0
    assert length_score(3, 4) == float(Fraction(800, 9))  # 100 · (1 − (1/3)/3)


@pytest.mark.parametrize(("asked", "delivered"), [
    (0, 10), (-5, 10), (10, -1), (1.5, 10), (10, 2.0), (True, 3), ("10", 10),
])
def test_length_score_refuses_bad_input(asked, delivered):
    with pytest.raises(InvalidInputError, match="words"):
        length_score(asked, delivered)


@given(st.integers(1, 100_000), st.integers(0, 400_000))
def test_length_score_bounds(asked: int, delivered: int):
    s = length_score(asked, delivered)
    assert 0.0 <= s <= 100.0
    assert (s == 100.0) == (asked == delivered)


@given(st.integers(1, 10_000), st.integers(1, 10_000), st.integers(1, 10_000))
def test_length_score_falls_away_from_the_ask(asked: int, a: int, b: int):
    """On each side of the ask, further away never scores higher."""
    lo, hi = sorted((a, b))
    if hi <= asked:
        assert length_score(asked, lo) <= length_score(asked, hi)
    if lo >= asked:
        assert length_score(asked, hi) <= length_score(asked, lo)


@given(st.integers(2, 10_000), st.integers(1, 100))
def test_running_long_costs_less_than_running_short(asked: int, pct: int):
    """The same relative miss costs a third over the ask and a half under it."""
    over = asked * (100 + pct) // 100
    under = asked * 100 // (100 + pct)  # asked / under ≈ over / asked
    if under >= 1 and over > asked and under < asked:
        assert length_score(asked, over) >= length_score(asked, under) - 1e-9


def test_tolerance_and_capacity_arithmetic():
    assert within_tolerance(1000, 850) and within_tolerance(1000, 1150)
    assert not within_tolerance(1000, 849) and not within_tolerance(1000, 1151)
    # The quality benchmark's LLM runs: 5 windows × 320 tokens × 0.577 words a token.
    assert window_capacity(5, 320) == 923
    assert window_capacity(5, 320, 0.70) == 1120
    assert windows_needed(1200, 320) == 7  # 1200 / 184.64 = 6.5
    assert windows_needed(5000, 1024) == 9
    assert windows_needed(184, 320) == 1 and windows_needed(185, 320) == 2
    for bad in ((0, 320), (5, 0)):
        with pytest.raises(InvalidInputError):
            window_capacity(*bad)
    with pytest.raises(InvalidInputError, match="words per token"):
        windows_needed(100, 320, float("nan"))
    with pytest.raises(InvalidInputError, match="words must be positive"):
        windows_needed(0, 320)


def test_capacity_warning_names_the_windows_needed():
    assert capacity_warning(1800, 5, 1024) is None  # 2,954 words fit
    msg = capacity_warning(1200, 5, 320)
    assert msg is not None and "--windows 7" in msg and "923" in msg
    # Within the tolerance of the capacity is not warned about.
    assert capacity_warning(1061, 5, 320) is None and capacity_warning(1062, 5, 320)


def test_length_report_and_run_length():
    r = run_length([300, 300, 400], ["## A\n\none two three", "four five", ""])
    assert r == LengthReport(1000, 7)
    assert count_words(["a  b\n c", "", " d "]) == 4
    rep = LengthReport(1200, 1020)
    assert rep.to_dict() == {"asked": 1200, "delivered": 1020, "ratio": 0.85,
                             "score": round(100 * (1 - (1200 / 1020 - 1) / 2), 2),
                             "within_tolerance": True}
    assert rep.summary() == "words 1020/1200 (85%)  length score 91.2"


def test_generate_reports_length(types_ckf_path: Path, tmp_path: Path):
    outline = tmp_path / "o.txt"
    outline.write_text("Numeric types\nSequence types\n", encoding="utf-8")
    trace, html = tmp_path / "t.json", tmp_path / "r.html"
    res = runner.invoke(app, ["generate", BUILTIN_TYPES_TASK, "--ckf", str(types_ckf_path),
                              "--outline", str(outline), "--windows", "2", "--words", "600",
                              "--trace", str(trace), "--report", str(html)])
    assert res.exit_code == 0, res.output
    data = json.loads(trace.read_text(encoding="utf-8"))
    jsonschema.validate(data, TRACE_SCHEMA)
    written = sum(len(w["output"].split()) for w in data["windows"])
    assert data["length"]["asked"] == 600 and data["length"]["delivered"] == written > 0
    assert data["length"]["score"] == round(length_score(600, written), 2)
    assert f"words {written}/600" in res.output and "length score" in res.output
    assert "warning" not in res.output
    assert f"It wrote {written} of the 600 words asked" in html.read_text(encoding="utf-8")
    assert f"It wrote {written} of the 600" in length_sentence(build_run(data, "run"))


def test_generate_warns_when_the_windows_cannot_carry_the_words(types_ckf_path: Path,
                                                                tmp_path: Path):
    outline = tmp_path / "o.txt"
    outline.write_text("Numeric types\n", encoding="utf-8")
    res = runner.invoke(app, ["generate", BUILTIN_TYPES_TASK, "--ckf", str(types_ckf_path),
                              "--outline", str(outline), "--windows", "1", "--words", "4000",
                              "--generation-tokens", "256"])
    assert res.exit_code == 0, res.output
    assert "warning" in res.output and "--windows 28" in res.output


def test_exhausted_run_says_how_many_words_it_grounded(tiny_ckf_path: Path, tmp_path: Path):
    outline = tmp_path / "o.txt"
    outline.write_text("Truth value testing\nThe pass statement\n", encoding="utf-8")
    trace = tmp_path / "t.json"
    res = runner.invoke(app, ["generate", "Write about truth values and pass", "--ckf",
                              str(tiny_ckf_path), "--outline", str(outline), "--windows", "20",
                              "--words", "20000", "--trace", str(trace)])
    assert res.exit_code == 0, res.output
    data = json.loads(trace.read_text(encoding="utf-8"))
    assert data["status"] == "ckf-exhausted"
    got = data["length"]["delivered"]
    assert data["length"]["within_tolerance"] is False
    assert f"the knowledge base grounded {got} of the 20000 words asked" in " ".join(
        res.output.split())


def test_old_traces_without_length_still_render():
    trace = {"task": "t", "embedding_model": "m", "ranking": "cdr",
             "sub_queries": [{"id": "sq-1", "text": "a", "expected_words": 10}],
             "windows": [], "status": "in-progress"}
    assert length_sentence(build_run(trace, "old")) == ""
    trace["length"] = {"asked": "x"}
    assert length_sentence(build_run(trace, "damaged")) == ""


def test_fitted_windows_raises_never_lowers_and_caps_at_twenty():
    from cdr.window.length import fitted_windows

    assert fitted_windows(600, 1024, 1) == 2  # 600 / 590.8
    assert fitted_windows(1200, 320, 5) == 7
    assert fitted_windows(600, 1024, 9) == 9  # a larger limit is kept
    assert fitted_windows(4000, 256, 1) == 20  # 28 needed, the spec's ceiling is 20
    with pytest.raises(InvalidInputError, match="generation tokens"):
        fitted_windows(600, 0, 5)


def test_generate_fit_windows(types_ckf_path: Path, tmp_path: Path):
    outline = tmp_path / "o.txt"
    outline.write_text("Numeric types\nSequence types\n", encoding="utf-8")
    res = runner.invoke(app, ["generate", BUILTIN_TYPES_TASK, "--ckf", str(types_ckf_path),
                              "--outline", str(outline), "--windows", "1", "--words", "1200",
                              "--fit-windows"])
    assert res.exit_code == 0, res.output
    status = next(line for line in res.output.splitlines() if "status:" in line)
    assert re.search(r"windows \d+/3 ", status), status  # 1200 / (1024 × 0.577) → 3
    assert "warning" not in res.output
    bad = runner.invoke(app, ["generate", BUILTIN_TYPES_TASK, "--ckf", str(types_ckf_path),
                              "--fit-windows", "--generation-tokens", "0"])
    assert bad.exit_code == 2 and "generation tokens must be positive" in bad.output
