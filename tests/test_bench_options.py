"""The quality benchmark's checkpoint (an interrupted run resumes) and the verdicts it gives
the options' preset against the targets of issue 13."""

from __future__ import annotations

import math
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

from cdr.window.loop import GenerationConfig
from quality import Arm, Checkpoint, Run, run_key
from quality_metrics import RunMetrics
from quality_options import PRESET, Summary, preset_targets
from quality_tasks import Task


def _run(arm: str, reuse: float) -> Run:
    m = RunMetrics(cwr6=[0.0, math.nan], fact_reuse=[0.0, reuse], status=["in-progress", "x"])
    return Run("library/re.html", arm, m, 2, "limit-reached", 10, 0.5, 3, [4, 5], [0.0, 0.2],
               0.1, prompt_tokens=[100, 0], completion_tokens=[50, 0], written_words=[40, 0])


def test_checkpoint_keeps_finished_runs_and_skips_a_cut_line(tmp_path):
    path = tmp_path / "runs.jsonl"
    ck = Checkpoint(path)
    ck.put("a", _run("cdr", 0.25))
    ck.put("b", _run("cdr fresh", 0.05))
    with path.open("a", encoding="utf-8") as f:
        f.write('{"key": "c", "run": {"task"')  # the line an interruption cut
    again = Checkpoint(path)
    assert set(again.runs) == {"a", "b"}
    back = again.get("b")
    assert back is not None and back.arm == "cdr fresh"
    assert back.metrics.fact_reuse == [0.0, 0.05] and math.isnan(back.metrics.cwr6[1])
    assert back.prompt_tokens == [100, 0]
    assert repr(back.to_dict()) == repr(_run("cdr fresh", 0.05).to_dict())  # NaN ≠ NaN in ==
    assert Checkpoint(path, restart=True).runs == {} and not path.exists()


def test_run_keys_change_with_what_the_run_depends_on():
    task = Task("library/re.html", "re", ("A", "B"), ("a", "b"), 10)
    arm = Arm("cdr fresh", "preset", "cdr", overrides={"profile": "fresh"})
    base = GenerationConfig()
    key = run_key("code", task, arm, base, 5, 10, 100)
    assert key == run_key("code", task, arm, base, 5, 10, 100)
    assert key != run_key("code2", task, arm, base, 5, 10, 100)
    assert key != run_key("code", task, replace(arm, overrides={"profile": "spec"}), base, 5,
                          10, 100)
    assert key != run_key("code", task, arm, replace(base, context_tokens=2048), 5, 10, 100)
    assert key != run_key("code", task, arm, base, 5, 10, 101)


def _summary(name: str, **kw: float) -> Summary:
    vals = dict(cwr6=0.0, reuse=0.5, recall=0.8, text_recall=0.6, relevance=0.5,
                completeness=0.9, envelope_facts=50, written_facts=12, prompt_tokens=10_000,
                prompt_tokens_to_exit=8_000, words_per_token=0.7, words_per_written_fact=40,
                plan_far=0.4, pull_wins=0.1, exit_window=4)
    return Summary(name, **{**vals, **kw})


def test_preset_targets_say_met_or_missed_with_the_numbers():
    s = {"relevance": _summary("relevance", relevance=0.6, text_recall=0.40),
         "xquad": _summary("xquad", recall=0.88, text_recall=0.59),
         "cdr": _summary("cdr"),
         PRESET: _summary(PRESET, reuse=0.08, recall=0.91, text_recall=0.65, relevance=0.51,
                          cwr6=0.012, prompt_tokens=4_900)}
    lines = preset_targets(s, 5)
    assert len(lines) == 6
    assert lines[0].startswith("- fact reuse at W5 ≤ 10%: 8.0%") and "**met**" in lines[0]
    assert "91.0% vs xQuAD 88.0% (needs ≥ 91.0%" in lines[1] and "**met**" in lines[1]
    assert "best baseline xquad 59.0%" in lines[2] and "**met**" in lines[2]
    assert "0.510 vs 0.600 (85.0%" in lines[3] and "**met**" in lines[3]
    assert "1.2%" in lines[4] and "**missed**" in lines[4]
    assert "4,900 vs 10,000 (49.0%" in lines[5] and "**met**" in lines[5]
    worse = {**s, PRESET: replace(s[PRESET], recall=0.90, prompt_tokens=5_100)}
    lines = preset_targets(worse, 5)
    assert "**missed**" in lines[1] and "**missed**" in lines[5]
    assert preset_targets({"cdr": s["cdr"]}, 5) == []
