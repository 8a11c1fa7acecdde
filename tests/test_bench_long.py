"""`bench/long.py`: one run's records, the checkpoint key, and the report's arithmetic."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import long as bench_long
from cdr.ckf import CKF
from cdr.window.length import length_score
from cdr.writers import get_writer
from retrieval import RTask
from tests.conftest import BUILTIN_TYPES_TASK

TASK = RTask("pydocs", "stdtypes", BUILTIN_TYPES_TASK, ("Numeric types", "Sequence types"),
             "nowhere")


def _run(arm: str, words: int, delivered: int, windows: list[dict], status: str) -> dict:
    return {"corpus": "pydocs", "task": "t", "arm": arm, "words": words, "writer": "extractive",
            "max_windows": 20, "delivered": delivered, "ratio": round(delivered / words, 4),
            "length_score": round(length_score(words, delivered), 2),
            "within_tolerance": abs(delivered - words) <= 0.15 * words, "status": status,
            "windows": windows}


def _w(words: int, on: float | None, fresh: float | None, cwr: float | None) -> dict:
    return {"words": words, "seconds": 1.0, "status": "in-progress", "finish_reason": "stop",
            "completeness": 0.5, "on_topic": on, "fresh": fresh, "cwr6": cwr, "envelope": 4}


def test_run_one_records_every_window(types_ckf_path: Path):
    ckf = CKF.open(types_ckf_path)
    arm = bench_long.ARMS[0]
    rec = bench_long.run_one(ckf, set(), TASK, arm, 900, 3, "extractive")
    ws = rec["windows"]
    assert 1 <= len(ws) <= 3
    assert rec["delivered"] == sum(w["words"] for w in ws) > 0
    assert rec["length_score"] == round(length_score(900, rec["delivered"]), 2)
    assert rec["ratio"] == round(rec["delivered"] / 900, 4)
    assert rec["status"] == ws[-1]["status"] != "in-progress"
    for w in ws:  # no fact of the task's "own" document (empty set): on-topic 0 when sent
        assert w["on_topic"] in (0.0, None) and (w["fresh"] is None or 0 <= w["fresh"] <= 1)
    assert ws[0]["fresh"] in (1.0, None)


def test_run_key_separates_what_changes_a_run():
    arm, other = bench_long.ARMS
    k = bench_long.run_key("c", TASK, arm, 2000, 20, "extractive", 100)
    assert k == bench_long.run_key("c", TASK, arm, 2000, 20, "extractive", 100)
    for changed in (bench_long.run_key("c", TASK, other, 2000, 20, "extractive", 100),
                    bench_long.run_key("c", TASK, arm, 5000, 20, "extractive", 100),
                    bench_long.run_key("c", TASK, arm, 2000, 20, "local", 100),
                    bench_long.run_key("c", TASK, arm, 2000, 12, "extractive", 100),
                    bench_long.run_key("d", TASK, arm, 2000, 20, "extractive", 100)):
        assert changed != k


def test_report_means_and_labels():
    runs = [
        _run("focused", 2000, 2300, [_w(1000, 1.0, 1.0, 0.0), _w(1300, 0.5, 0.5, 0.1)],
             "task-complete"),
        _run("focused", 2000, 2600, [_w(1300, 1.0, 1.0, 0.0), _w(1300, 0.0, None, None)],
             "ckf-exhausted"),
        _run("relevance", 2000, 2000, [_w(2000, 0.25, 1.0, None)], "limit-reached"),
    ]
    meta = {"generated": "now", "commit": "abc", "words": (2000,), "max_windows": 20,
            "tasks": "pydocs `t`"}
    md = bench_long.render(runs, meta)
    assert "**Writer: extractive.**" in md and "`bench/results/long.md`" in md
    # focused at 2,000: mean 2,450 words; ratios 1.15–1.30; scores 95.0 and 90.0
    assert ("| focused | 2,000 | 2 | 2,450 | 1.15–1.30 | 92.5, 90.0 | 1/2 | 2.0 | "
            "ckf-exhausted 1, task-complete 1 |") in md
    assert "| relevance | 2,000 | 1 | 2,000 | 1.00–1.00 | 100.0, 100.0 | 1/1 | 1.0 |" in md
    # window 2 of focused: words (1300+1300)/2, on-topic (0.5+0)/2, fresh 0.5 (one None),
    # CWR6 10% (one None)
    assert "| 2 | focused | 2 | 1300 | 1.00 | 25.0% | 50.0% | 10.0% |" in md
    assert "| 1 | relevance | 1 | 2000 | 1.00 | 25.0% | 100.0% | – |" in md


def test_bad_arguments_are_refused():
    with pytest.raises(SystemExit) as exc:
        bench_long.main(["--words", "2000,lots", "--report-only"])
    assert exc.value.code == 2
    with pytest.raises(SystemExit) as exc:
        bench_long.main(["--max-windows", "21", "--report-only"])
    assert exc.value.code == 2


# ------------------------------------------------------------------ the reference-model bench

import long_llm  # noqa: E402


def _lw(plan: list[str], finished_before: list[str] = ()) -> dict:
    return {"plan": [[t, 100, True] for t in plan], "finished_before": list(finished_before)}


def test_replanned_separates_continuations_from_sections_written_twice():
    windows = [_lw(["A", "B"]), _lw(["B", "C"], ["A"]), _lw(["A", "D"], ["A", "B", "C"])]
    again, twice = long_llm.replanned(windows)
    # W2+ plan 4 sections: B (again, a continuation), C, A (again, written whole before), D
    assert again == 2 / 4 and twice == 1 / 4
    assert all(math.isnan(x) for x in long_llm.replanned([_lw(["A"])]))


def _run_of(values: list[float | None], arm: str = "focused", task: str = "t",
            seconds: list[float] | None = None) -> dict:
    secs = seconds or [10.0] * len(values)
    return {"arm": arm, "task": task, "windows": [
        {"semrep": v, "grounding": v, "seconds": s, "words": 100}
        for v, s in zip(values, secs, strict=True)]}


def test_last_third_delta_against_the_baseline_windows():
    run = _run_of([0.0, 0.1, 0.3, 0.2, 0.4, 0.6])
    # 6 windows: last third = windows 5–6 (mean 0.5); semrep baseline W2–3 (mean 0.2)
    assert long_llm.last_third_delta(run, "semrep") == pytest.approx(0.5 - 0.2)
    # grounding baseline W1 (0.0)
    assert long_llm.last_third_delta(run, "grounding") == pytest.approx(0.5)
    assert long_llm.last_third_delta(_run_of([0.1, 0.2]), "grounding") is None
    # 3 windows: the last third (W3) falls inside semrep's W2–3 baseline: no verdict
    assert long_llm.last_third_delta(_run_of([0.0, 0.1, 0.2]), "semrep") is None
    assert long_llm.last_third_delta(_run_of([0.5, None, 0.2]), "grounding") == pytest.approx(
        -0.3)
    # a last window closed unwritten (the stale stop's) is not part of the document
    unwritten = _run_of([0.5, 0.4, 0.0])
    unwritten["windows"][-1]["words"] = 0
    assert long_llm.last_third_delta(unwritten, "grounding") is None


def test_seconds_ratio_and_bootstrap():
    run = _run_of([0.1] * 6, seconds=[10, 12, 20, 20, 30, 30])
    assert long_llm.seconds_ratio(run) == pytest.approx(30 / 11)
    assert long_llm.seconds_ratio(_run_of([0.1, 0.1])) is None
    mean, lo, hi = long_llm.bootstrap([1.0, 2.0, 3.0])
    assert mean == 2.0 and 1.0 <= lo <= mean <= hi <= 3.0
    assert long_llm.bootstrap([4.0]) == (4.0, 4.0, 4.0)
    assert all(math.isnan(x) for x in long_llm.bootstrap([]))


def test_verdicts_average_runs_per_task_first():
    runs = [_run_of([0.0, 0.0, 0.0, 0.0, 0.0, 0.6], task="a"),
            _run_of([0.0, 0.0, 0.0, 0.0, 0.0, 0.0], task="a"),
            _run_of([0.0, 0.0, 0.0, 0.0, 0.0, 0.3], task="b"),
            _run_of([0.0, 0.0, 0.0, 0.0, 0.0, 0.9], arm="relevance", task="b")]
    v = long_llm.verdicts(runs, "focused")
    mean, lo, hi, n = v["grounding"]
    # task a: (0.3 + 0.0) / 2 = 0.15, task b: 0.15 -> mean 0.15 over 2 tasks, 3 runs
    assert n == 3 and mean == pytest.approx(0.15) and lo == pytest.approx(0.15) == hi
    assert set(v) == {*long_llm.BASELINE, "seconds_ratio", "work_ratio", "rate_ratio"}


def test_windows_spanning_a_pause_are_marked_and_left_out_of_the_seconds_ratio(
        tmp_path: Path):
    from long_llm_speed import load_pauses, mark_paused, paused_windows, without_paused

    run = _run_of([0.1] * 6, seconds=[10, 10, 10, 10, 100, 10])
    for w, end in zip(run["windows"], ["17:00:10", "17:00:20", "17:00:30", "17:00:40",
                                       "17:02:20", "17:02:30"], strict=True):
        w["ended"] = f"2026-12-03T{end}Z"
    old = _run_of([0.1] * 3)  # recorded before windows had an end time: never marked
    path = tmp_path / "pauses.json"
    path.write_text('{"intervals": [["2026-12-03T17:01:00Z", "2026-12-03T17:02:10Z"]]}')
    # W5 ran 17:00:40-17:02:20 and spans the pause; W6 starts at its end, W4 ends before it
    assert mark_paused([run, old], load_pauses(path)) == 1
    assert paused_windows(run) == [5] and paused_windows(old) == []
    assert long_llm.seconds_ratio(run) == pytest.approx(55 / 10)
    assert long_llm.seconds_ratio(without_paused(run)) == pytest.approx(1.0)
    v = long_llm.verdicts([run, old], "focused")
    assert v["seconds_ratio_unpaused"][0] == pytest.approx(1.0)
    assert load_pauses(tmp_path / "absent.json") == []


def test_a_run_resumes_from_its_window_checkpoint(types_ckf_path: Path, tmp_path: Path):
    """Interrupted after one window, the run goes on from the checkpointed session and ends
    exactly where an uninterrupted run ends (the extractive writer is deterministic)."""
    ckf = CKF.open(types_ckf_path)
    arm = long_llm.ARMS[0]
    whole, ws = long_llm.run_windows(ckf, get_writer("extractive"), TASK, arm, 1500, "a",
                                     4096, 512, tmp_path / "one")
    assert len(ws) >= 2, "the task must take more than one window to test a resume"
    _, first = long_llm.run_windows(ckf, get_writer("extractive"), TASK, arm, 1500, "b",
                                    4096, 512, tmp_path / "two", max_new_windows=1)
    assert len(first) == 1 and (tmp_path / "two" / "b.json").exists()
    # past its stop time the run starts no window and keeps its checkpoint
    stopped, same = long_llm.run_windows(ckf, get_writer("extractive"), TASK, arm, 1500, "b",
                                         4096, 512, tmp_path / "two", stop_at="00:00")
    assert len(same) == 1 and stopped.status == "in-progress"
    resumed, rest = long_llm.run_windows(ckf, get_writer("extractive"), TASK, arm, 1500, "b",
                                         4096, 512, tmp_path / "two", stop_at="99:99")
    assert [w["number"] for w in rest] == list(range(1, len(ws) + 1))
    assert [w["text"] for w in rest] == [w["text"] for w in ws]
    assert resumed.status == whole.status and resumed.finished_ids == whole.finished_ids
    rec = long_llm.finish_record(ckf, set(), TASK, arm, 1500, resumed, rest)
    assert rec["delivered"] == sum(w["words"] for w in rest)
    assert len(rec["windows"]) == len(rest) and rec["windows"][0]["semrep"] == 0.0
    assert all(w["prompt_tps"] is None for w in rec["windows"])  # no timing recorded
    # what survives load is recorded for every window: CPU seconds and the load at its end
    assert all(w["cpu_s"] >= 0 and w["load"] >= 0 for w in rec["windows"])
    # the envelope's rows are kept: the report checks what a window names against them
    assert [w["rows"] for w in rec["windows"]] == [w["rows"] for w in rest]


def test_words_per_token_counts_only_windows_with_tokens():
    runs = [{"arm": "focused", "windows": [{"words": 500, "completion_tokens": 1000},
                                           {"words": 0, "completion_tokens": None}]},
            {"arm": "focused", "windows": [{"words": 300, "completion_tokens": 600}]},
            {"arm": "relevance", "windows": [{"words": 1, "completion_tokens": 1}]}]
    assert long_llm.words_per_token(runs, "focused") == (800 / 1600, 2)
    wpt, n = long_llm.words_per_token(runs, "other")
    assert math.isnan(wpt) and n == 0


def test_page_floor_measures_the_own_document(types_ckf_path: Path):
    ckf = CKF.open(types_ckf_path)
    own = set(range(min(ckf.n_rows, 60)))
    reps = long_llm.page_floor(ckf, own, 3)
    assert len(reps) == 3 and reps[0] == 0.0
    assert all(0.0 <= x <= 1.0 for x in reps[1:] if not math.isnan(x))
    assert long_llm.page_floor(ckf, own, 1) == [] and long_llm.page_floor(ckf, set(), 3) == []


# ------------------------------------------- the recalibrated repetition, invented identifiers


def test_identifiers_are_the_names_given_as_code():
    from long_llm_identifiers import identifiers

    assert identifiers("`total_microseconds()`: Returns the microseconds.") == {
        "total_microseconds"}
    assert identifiers("The `timedelta` object, datetime.now() and MPOL_BIND or EFAULT.") == {
        "timedelta", "datetime.now", "MPOL_BIND", "EFAULT"}
    assert identifiers("mbind(2) sets it; see set_mempolicy.") == {"mbind", "set_mempolicy"}
    assert identifiers("Use `1 day, 2:30` as an example, e.g. this one.") == set()


def test_window_identifiers_against_the_page_and_the_envelope():
    from long_llm_identifiers import window_identifiers, words_of

    sents = ["It returns `td.total_seconds()` for the span.",
             "It also has `total_microseconds()`, which the page lacks.",
             "A plain sentence names nothing."]
    page = words_of(["total_seconds() returns the seconds", "days and seconds"])
    env = words_of(["days and seconds"])
    w = window_identifiers(sents, page, env)
    assert (w.named, w.not_on_page, w.not_in_envelope) == (2, 1, 2)
    assert w.flags == (True, True, False)  # against the envelope, which lacks both
    assert w.sentences_not_on_page == 1 and w.examples == ("total_microseconds",)
    unknown = window_identifiers(sents, page, None)  # envelope not recorded: the page decides
    assert unknown.not_in_envelope is None and unknown.flags == (False, True, False)


def _encoder(table):
    import numpy as np

    return lambda texts: np.asarray([table[t] for t in texts], dtype=float)


def test_repetition_takes_each_sentence_best_cosine_over_every_earlier_window():
    from long_llm_semrep import best_earlier, repetition

    enc = _encoder({"a": [1, 0], "b": [0, 1], "c": [0.8, 0.6], "d": [0.6, 0.8]})
    windows = [["a"], ["b"], ["c", "d"], []]
    assert repetition(windows, enc, 0.7)[:3] == [0.0, 0.0, 1.0]  # c ~ a (0.8), d ~ b (0.8)
    assert repetition(windows, enc, 0.9)[:3] == [0.0, 0.0, 0.0]
    assert math.isnan(repetition(windows, enc, 0.7)[3])  # a window with no sentence
    assert best_earlier([["a"], ["a", "b"]], enc, skip_verbatim=True)[1] == [-1.0, 0.0]


def test_page_windows_cut_the_text_into_equal_words():
    from long_llm_semrep import n_windows_for, page_windows

    text = " ".join(f"Sentence number {i} is here." for i in range(10))
    wins = page_windows(text, 2)
    assert len(wins) == 2 and sum(len(w) for w in wins) == 10
    assert n_windows_for("word " * 100) == 2 and n_windows_for("word " * 20000) == 20


def test_only_selects_runs_by_task_name_and_arm():
    from types import SimpleNamespace

    task = SimpleNamespace(name="library/datetime.html")
    focused, relevance = long_llm.ARMS
    assert long_llm.selected(task, focused, None)
    assert long_llm.selected(task, focused, [("datetime.html", "focused")])
    assert long_llm.selected(task, focused, [("library/datetime.html", "focused")])
    assert not long_llm.selected(task, relevance, [("datetime.html", "focused")])
    assert not long_llm.selected(task, focused, [("mbind", "focused")])


# ------------------------------------------------------------- speed at length, taken apart

import long_llm_speed  # noqa: E402


def _timed(prompt: list[int], kept: list[int], gen: list[int], ms_prompt: list[float],
           ms_gen: list[float], **extra: list) -> dict:
    ws = []
    for i, (p, k, c, mp, mg) in enumerate(zip(prompt, kept, gen, ms_prompt, ms_gen,
                                              strict=True)):
        w = {"words": 100, "prompt_tokens": p, "reused_tokens": k, "completion_tokens": c,
             "prompt_s": (p - k) * mp / 1000, "generation_s": c * mg / 1000}
        w["seconds"] = w["prompt_s"] + w["generation_s"]
        w.update({key: v[i] for key, v in extra.items()})
        ws.append(w)
    return {"arm": "focused", "task": "t", "words": 5000, "windows": ws}


def test_a_slower_machine_is_rate_and_a_growing_prompt_is_work():
    """Same tokens every window, each token 3× slower in the last third: all rate, no work.
    Same speed, the prompt carrying more every window: all work, no rate. Either way
    work × rate is the seconds ratio."""
    slow = _timed([2000] * 6, [100] * 6, [500] * 6, [30, 30, 30, 30, 90, 90],
                  [100, 100, 100, 100, 300, 300])
    d = long_llm_speed.decompose(slow)
    assert d["work"] == pytest.approx(1.0) and d["rate"] == pytest.approx(3.0)
    assert d["seconds"] == pytest.approx(long_llm.seconds_ratio(slow))
    assert d["prompt_s_tok"] == pytest.approx(3.0) and d["gen_s_tok"] == pytest.approx(3.0)
    growing = _timed([1000, 1500, 2000, 2500, 3000, 3500], [100] * 6, [500] * 6, [30] * 6,
                     [100] * 6)
    d = long_llm_speed.decompose(growing)
    assert d["rate"] == pytest.approx(1.0) and d["work"] > 1.5
    assert d["work"] * d["rate"] == pytest.approx(long_llm.seconds_ratio(growing))
    assert (d["prompt_first"], d["prompt_last"]) == (1250, 3250)
    # a lost prefix is work too: the same prompt, nothing kept in the last third
    lost = _timed([2000] * 6, [1500] * 4 + [0] * 2, [100] * 6, [30] * 6, [100] * 6)
    d = long_llm_speed.decompose(lost)
    assert d["work"] > 2 and d["rate"] == pytest.approx(1.0)
    assert long_llm_speed.decompose(_timed([2000] * 2, [0] * 2, [9] * 2, [1] * 2,
                                           [1] * 2)) is None


def test_speed_reads_old_records_and_reports_load_and_cpu():
    """Runs recorded before the seconds were kept give them back from their tokens/s;
    load and CPU seconds, where recorded, are averaged per third."""
    run = _timed([2000] * 3, [0, 100, 100], [400] * 3, [30] * 3, [100] * 3,
                 load=[1.0, 2.0, 5.0], cpu_s=[50.0, 50.0, 60.0])
    d = long_llm_speed.decompose(run)
    assert (d["load_first"], d["load_last"]) == (1.0, 5.0) and d["cpu"] == pytest.approx(1.2)
    for w in run["windows"]:
        evaluated = w["prompt_tokens"] - w["reused_tokens"]
        w["prompt_tps"] = evaluated / w.pop("prompt_s")
        w["gen_tps"] = w["completion_tokens"] / w.pop("generation_s")
    old = long_llm_speed.decompose(run)
    assert old["seconds"] == pytest.approx(d["seconds"]) and old["work"] == pytest.approx(
        d["work"])
    # a window after the first that kept no prefix: the process started afresh there
    run["windows"][2]["reused_tokens"] = 0
    assert long_llm_speed.cache_restarts(run) == [3]
    lines = long_llm_speed.render_speed([{**run, "load": [4.0, 3.0, 2.0]}], ["focused"])
    assert any(line.startswith("| t | focused | 5,000 | 3 |") for line in lines)
    assert any("(W3: 0, new process)" in line for line in lines)


def test_continued_windows_are_those_naming_a_section_planned_before() -> None:
    from long_llm_causes import continued_split, render_continued

    def w(titles: list[str], words: int = 100, cwr6: float = 0.0) -> dict:
        return {"plan": [[t, 100, False] for t in titles], "words": words, "cwr6": cwr6}

    run = {"arm": "focused", "windows": [
        w(["A"]), w(["B"]), w(["A"], cwr6=0.4), w(["C", "B"], cwr6=0.2), w(["D"], words=0),
        w(["D"], cwr6=0.1), w([])]}
    split = continued_split(run)
    # window 1 has no earlier window; window 5 wrote nothing (but its plan counts as seen);
    # window 7 planned nothing
    assert [c for c, _ in split] == [False, True, True, True]
    assert [x["cwr6"] for _, x in split] == [0.0, 0.4, 0.2, 0.1]
    table = "\n".join(render_continued([run], ["focused"]))
    assert "| focused | continues | 3 | 100 |" in table
    assert "| focused | new | 1 | 100 |" in table


def test_the_guard_estimate_filters_each_window_against_what_earlier_ones_kept() -> None:
    import numpy as np

    from long_llm_guard import guarded

    def encode(texts):  # far-apart unit vectors: only the 6-gram rule can drop here
        rows = [np.random.default_rng(abs(hash(t)) % 2**32).standard_normal(16) for t in texts]
        return np.array([r / np.linalg.norm(r) for r in rows], np.float32)

    a = "The clock module keeps time in seconds since the epoch of the system."
    b = "A timer object counts down and then calls the function it was given."
    out = guarded([a, f"{a} {b}", f"{b} {a}"], encode, 16)
    assert out[0] == (a, 0)
    assert out[1][0].strip() == b and out[1][1] == 1  # the repeated sentence is dropped
    assert out[2][0].strip() == "" and out[2][1] == 2  # both were kept before


def test_a_profile_arms_key_follows_what_the_profile_stands_for(monkeypatch):
    """A run made before the recommended profile changed is not taken for one of it; an arm
    of single options keeps its key."""
    import cdr.options as options

    focused, relevance = long_llm.ARMS
    before = (long_llm.run_key(TASK, focused, 2000, 100, 3072, 1024),
              long_llm.run_key(TASK, relevance, 2000, 100, 3072, 1024))
    changed = dict(options.PROFILES)
    changed["focused"] = options.SessionOptions(**{**options.asdict(
        options.PROFILES["focused"]), "repeats": "drop"})
    monkeypatch.setattr(options, "PROFILES", changed)
    after = (long_llm.run_key(TASK, focused, 2000, 100, 3072, 1024),
             long_llm.run_key(TASK, relevance, 2000, 100, 3072, 1024))
    assert after[0] != before[0] and after[1] == before[1]
    assert long_llm.arm_options(focused)["repeats"] == "drop"


def test_words_outside_loops_cut_a_looping_window_where_its_loop_began():
    from long_llm_resume import looping, outside_loop, words_outside_loops

    prose = " ".join(f"word{i}" for i in range(150))
    loop = "It starts here. " + "The tzinfo objects hold the zone of a datetime. " * 40
    assert not looping(prose) and outside_loop(prose) == 150
    assert looping(loop)
    # "It starts here." and one copy of the looped sentence: the loop begins at its 2nd copy
    assert outside_loop(loop) == 3 + 9
    run = {"windows": [{"text": prose}, {"text": loop}, {}]}
    assert words_outside_loops(run) == 150 + 12
