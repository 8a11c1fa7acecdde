"""The LLM quality benchmark's own code, no model: measures on exact cases, checkpoints."""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

from cdr.report.quality import cumulative_repetition, cwr6
from quality_llm_metrics import (
    calibrate,
    containment,
    content_words,
    grounding,
    jaccard,
    mean_over,
    repetition_split,
    semantic_repetition,
    sentences,
    subtopic_coverage,
)
from quality_llm_runs import (
    finished,
    load_run,
    pending,
    run_path,
    save_run,
    settings_key,
    taken,
)

# ------------------------------------------------------------------------------ the text


def test_sentences_skip_headings_and_code_and_split_lists() -> None:
    text = ("## Counter objects\n\nA Counter counts hashable objects. It is a dict subclass "
            "for counting.\n\n```python\nc = Counter('abc')\nprint(c)\n```\n\n"
            "- Elements are stored as dictionary keys.\n- Counts may be zero or negative.\n"
            "Too short.\n")
    assert sentences(text) == [
        "A Counter counts hashable objects.", "It is a dict subclass for counting.",
        "Elements are stored as dictionary keys.", "Counts may be zero or negative.",
    ]  # "Too short." continues the list item, is split off and dropped (under 4 words)
    assert sentences("# Only a heading\n\n```\ncode line here now\n```") == []


def test_lexical_overlap() -> None:
    a = content_words("The deque is a thread-safe double-ended queue")
    b = content_words("A deque: a double-ended queue")
    assert a == {"deque", "thread", "safe", "double", "ended", "queue"}
    assert jaccard(a, b) == pytest.approx(4 / 6)
    assert containment(b, a) == 1.0 and containment(a, b) == pytest.approx(4 / 6)
    assert jaccard(set(), set()) == 0.0 and containment(set(), a) == 0.0


# ------------------------------------------------------------------- the 6-gram measures


def test_cwr6_and_cumulative_repetition_exact() -> None:
    w1 = "a b c d e f g"  # 6-grams: abcdef, bcdefg
    w2 = "a b c d e f x"  # abcdef (seen), bcdefx (new)
    assert cwr6([w1, w2]) == [0.0, 0.5]
    # After W2: 4 six-grams, abcdef twice → (2 − 1) / 4.
    assert cumulative_repetition([w1, w2]) == [0.0, 0.25]


def test_repetition_split_adds_up_to_the_cumulative_measure() -> None:
    w1 = "a b c d e f a b c d e f"  # 7 six-grams, abcdef twice: 1 within
    w2 = "a b c d e f g"  # abcdef (3rd time, 1 across), bcdefg (new)
    within, across = repetition_split([w1, w2])
    assert (within, across) == (1 / 9, 1 / 9)
    assert within + across == pytest.approx(cumulative_repetition([w1, w2])[-1])
    assert repetition_split([]) == (0.0, 0.0)


# -------------------------------------------------------------- the embedding measures


def test_semantic_repetition_with_given_vectors() -> None:
    w1 = np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
    w2 = np.array([[0.9, 0.1, 0.0], [0.0, 0.0, 1.0]])  # first restates W1's first
    w3 = np.array([[0.0, 0.0, 2.0], [0.0, 0.7, 0.7]])  # first restates W2's second (scaled)
    out = semantic_repetition([w1, w2, np.zeros((0, 3)), w3], threshold=0.8)
    assert out[0] == 0.0 and out[1] == 0.5 and math.isnan(out[2]) and out[3] == 0.5
    # A threshold above every cross-window cosine finds nothing.
    assert semantic_repetition([w1, w2], threshold=0.999) == [0.0, 0.0]


def test_grounding_with_given_vectors() -> None:
    s = np.array([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]])
    facts = np.array([[1.0, 0.0]])
    assert grounding(s, facts, 0.6) == pytest.approx(2 / 3)  # cosines 1, 0, 0.6
    assert grounding(s, facts, 0.61) == pytest.approx(1 / 3)
    assert grounding(s, np.zeros((0, 2)), 0.5) == 0.0
    assert math.isnan(grounding(np.zeros((0, 2)), facts, 0.5))


def test_subtopic_coverage_with_given_vectors() -> None:
    s = np.array([[1.0, 0.0, 0.0]])
    facts = np.array([[1.0, 0.0, 0.0], [0.9, 0.1, 0.0], [0.0, 1.0, 0.0]])
    assert subtopic_coverage(s, facts, ["A", "A", "B"], 4, 0.9) == 0.25
    assert subtopic_coverage(np.zeros((0, 3)), facts, ["A", "A", "B"], 4, 0.9) == 0.0


def test_calibrate_picks_the_separating_cut() -> None:
    c = calibrate([0.8, 0.9, 0.95], [0.1, 0.3, 0.5, 0.85])
    assert c.threshold == 0.8  # TPR 1, FPR 0.25: J 0.75, the best
    assert (c.true_positive_rate, c.false_positive_rate) == (1.0, 0.25)
    assert c.positives == 3 and c.negatives == 4 and c.positive_median == 0.9
    # Perfect separation: the highest cut of the best J (fewest false repetitions).
    assert calibrate([0.7, 0.8], [0.1, 0.2]).threshold == 0.7
    with pytest.raises(ValueError, match="both kinds"):
        calibrate([], [0.1])


def test_mean_over_windows_two_to_five() -> None:
    assert mean_over([0.0, 0.2, math.nan, 0.4]) == pytest.approx(0.3)
    assert math.isnan(mean_over([0.0]))


# ---------------------------------------------------------------------- checkpoints


def _run(task: str, arm: str, key: str, complete: bool = True, pid: int | None = None) -> dict:
    return {"task": task, "arm": arm, "settings_key": key, "windows": [{"text": "x"}],
            "complete": complete, "pid": pid}


def test_settings_key_depends_on_every_setting() -> None:
    a = settings_key({"context_tokens": 2048, "windows": 5})
    assert a == settings_key({"windows": 5, "context_tokens": 2048})
    assert a != settings_key({"context_tokens": 2048, "windows": 4})


def test_checkpoints_round_trip_and_resume(tmp_path: Path) -> None:
    pairs = [("library/a.html", "cdr"), ("library/a.html", "relevance"), ("b", "cdr")]
    save_run(tmp_path, _run("library/a.html", "cdr", "k1"))
    save_run(tmp_path, _run("library/a.html", "relevance", "k1", complete=False))
    save_run(tmp_path, _run("b", "cdr", "OLD"))  # other settings: not this benchmark's
    assert run_path(tmp_path, "library/a.html", "cdr").name == "library_a.html__cdr.json"
    assert load_run(tmp_path, "library/a.html", "cdr", "k1")["windows"] == [{"text": "x"}]
    # Resume reruns the interrupted run and the one made with other settings.
    assert pending(tmp_path, pairs, "k1", resume=True) == pairs[1:]
    assert pending(tmp_path, pairs, "k1", resume=False) == pairs
    assert [r["arm"] for r in finished(tmp_path, pairs, "k1")] == ["cdr"]
    assert len(finished(tmp_path, pairs, "k1", complete_only=False)) == 2
    assert not list(tmp_path.glob("*.tmp*"))  # atomic writes leave nothing behind


def test_a_damaged_checkpoint_is_rerun(tmp_path: Path) -> None:
    run_path(tmp_path, "t", "cdr").write_text("{not json", "utf-8")
    assert load_run(tmp_path, "t", "cdr", "k") is None
    assert pending(tmp_path, [("t", "cdr")], "k", resume=True) == [("t", "cdr")]
    with pytest.raises(ValueError, match="settings_key"):
        save_run(tmp_path, {"task": "t", "arm": "cdr", "windows": []})


def test_taken_skips_complete_runs_and_runs_of_live_workers(tmp_path: Path) -> None:
    save_run(tmp_path, _run("t", "cdr", "k"))
    assert taken(tmp_path, "t", "cdr", "k")
    # In progress in this very process (pid 1 is init: alive, but a different process).
    save_run(tmp_path, _run("t", "relevance", "k", complete=False, pid=1))
    assert taken(tmp_path, "t", "relevance", "k")
    save_run(tmp_path, _run("t", "xquad", "k", complete=False, pid=os.getpid()))
    assert not taken(tmp_path, "t", "xquad", "k")
    # A dead worker's run is free to rerun; so is a run never started.
    dead = _run("t", "sections", "k", complete=False, pid=2**22 + 12345)
    save_run(tmp_path, dead)
    assert not taken(tmp_path, "t", "sections", "k")
    assert not taken(tmp_path, "u", "cdr", "k")
    assert json.loads(run_path(tmp_path, "t", "sections").read_text())["pid"] == dead["pid"]


def test_the_model_writer_is_not_keyed_but_the_smoke_writer_is() -> None:
    from quality_llm import Settings

    local = Settings("m.gguf", 2048, 320, 1200, 5)
    assert "writer" not in local.as_dict()
    smoke = Settings("m.gguf", 2048, 320, 1200, 5, writer="extractive")
    assert smoke.as_dict()["writer"] == "extractive"
    assert settings_key(local.as_dict()) != settings_key(smoke.as_dict())


def test_prompt_version_keys_runs_and_version_1_keeps_its_old_key() -> None:
    from quality_llm import PROMPT_VERSION, Settings

    current = Settings("m.gguf", 2048, 320, 1200, 5)
    old = Settings("m.gguf", 2048, 320, 1200, 5, prompt=1)
    assert PROMPT_VERSION > 1 and current.as_dict()["prompt"] == PROMPT_VERSION
    assert "prompt" not in old.as_dict()  # checkpoints made before the field existed
    assert settings_key(current.as_dict()) != settings_key(old.as_dict())


def test_loop_version_3_rekeys_only_the_arms_with_the_length_contract() -> None:
    """The thin-envelope cap (loop version 3) changes only windows under the length contract:
    `focused` runs made before it are rerun, the other arms keep their version-2 runs."""
    from quality_llm import LOOP_VERSION, Settings, arm_keys

    assert LOOP_VERSION == 5
    three = Settings("m.gguf", 2048, 320, 1200, 5, loop=3)
    before = Settings("m.gguf", 2048, 320, 1200, 5, loop=2)
    keys, old = arm_keys(three, ["focused", "cdr", "relevance"]), arm_keys(before, ["focused"])
    assert keys["cdr"] == keys["relevance"] == settings_key(before.as_dict())
    assert keys["focused"] == settings_key(three.as_dict()) != old["focused"]


def test_loop_version_4_rekeys_every_arm() -> None:
    """The whole-prompt budget and the fully listed envelope (loop version 4) change every
    arm's windows: no run made at 2 or 3 is resumed as if it were current."""
    from quality_llm import Settings, arm_keys

    arms = ["focused", "cdr", "relevance"]
    now = arm_keys(Settings("m.gguf", 2048, 320, 1200, 5, loop=4), arms)
    earlier = [arm_keys(Settings("m.gguf", 2048, 320, 1200, 5, loop=v), arms) for v in (2, 3)]
    for arm in arms:
        assert now[arm] == settings_key(Settings("m.gguf", 2048, 320, 1200, 5, loop=4).as_dict())
        assert all(now[arm] != e[arm] for e in earlier)


def test_loop_version_5_rekeys_only_the_arms_that_plan_by_the_packed_facts() -> None:
    """Planning by the packed facts (loop version 5, `plan: "packed"`) changes only
    `focused`'s windows: its version-4 runs are rerun, spec CDR's and relevance-only's are
    kept under their version-4 key."""
    from quality_llm import LOOP_VERSION, Settings, arm_keys

    assert LOOP_VERSION == 5
    arms = ["focused", "cdr", "relevance"]
    now = arm_keys(Settings("m.gguf", 2048, 320, 1200, 5), arms)
    four = settings_key(Settings("m.gguf", 2048, 320, 1200, 5, loop=4).as_dict())
    assert now["cdr"] == now["relevance"] == four
    assert now["focused"] == settings_key(Settings("m.gguf", 2048, 320, 1200, 5).as_dict()) != four


def test_semantic_repetition_split_separates_same_and_other_section() -> None:
    from quality_llm_metrics import section_sentences, semantic_repetition_split

    assert section_sentences("Lead sentence has words.\n\n## A\n\nOne two three four.\n\n"
                             "```\ncode here is not prose\n```\n## B\n\nFive six seven eight.") \
        == [(None, "Lead sentence has words."), ("a", "One two three four."),
            ("b", "Five six seven eight.")]
    e = np.eye(3)
    w1 = [("a", e[0]), ("b", e[1])]
    w2 = [("a", e[0]), ("c", e[1]), ("a", e[2])]  # same-section repeat, cross repeat, new
    same, cross, n = semantic_repetition_split([w1, w2], 0.9)
    assert (same, cross, n) == (1 / 3, 1 / 3, 3)
    # No later window: nothing to count.
    s1, c1, n1 = semantic_repetition_split([w1], 0.9)
    assert n1 == 0 and np.isnan(s1) and np.isnan(c1)


def test_lexical_restating_counts_sentences_sharing_content_words_with_earlier_windows() -> None:
    from quality_llm_metrics import lexical_restating

    w1 = ["A deque is a double-ended queue.", "Counters count hashable objects."]
    w2 = ["The deque: a double-ended queue indeed.", "Timers run functions later."]
    w3: list[str] = []
    w4 = ["Counters count hashable objects quickly."]
    got = lexical_restating([w1, w2, w3, w4], 0.5)
    # w2[0] shares {deque, double, ended, queue} of 5 words with w1[0] (Jaccard 4/5); w2[1]
    # nothing. w4's sentence: {counters, count, hashable, objects} of 5 (Jaccard 4/5).
    assert got[0] == 0.0 and got[1] == 0.5 and math.isnan(got[2]) and got[3] == 1.0
    assert lexical_restating([w1, w2], 0.9) == [0.0, 0.0]


def test_the_man_corpus_arms_are_the_recommended_profile_spec_cdr_and_relevance_only() -> None:
    from cdr.options import PROFILES
    from quality_llm import MAN_ARMS, Settings, make_config
    from quality_tasks import Task

    task = Task("mbind", "Write a reference page about mbind", ("Errors",), ("m > Errors",), 3)
    settings = Settings("m.gguf", 2048, 320, 1200, 5)
    assert MAN_ARMS == ("focused", "cdr", "relevance")
    focused = make_config(settings, "focused", None, task)
    assert focused.ranking == "cdr" and focused.session_options() == PROFILES["focused"]
    cdr = make_config(settings, "cdr", None, task)
    assert cdr.ranking == "cdr" and cdr.session_options() == PROFILES["spec"]
    relevance = make_config(settings, "relevance", None, task)
    assert relevance.ranking == "relevance" and relevance.session_options() == PROFILES["spec"]
    for cfg in (focused, cdr, relevance):  # the Python-docs run's window settings
        assert (cfg.max_windows, cfg.words, cfg.context_tokens, cfg.generation_tokens) == (
            5, 1200, 2048, 320)


def test_a_window_is_scored_against_its_facts_texts_not_the_rows_of_todays_ckf() -> None:
    """A report written against a CKF built again (another recipe, other row numbers) scores
    an old run against the facts it was sent, by their text; rows serve only checkpoints
    without texts."""
    from quality_llm_report import Embeddings, envelope_vectors

    table = {"a deque": [1.0, 0.0], "a counter": [0.0, 1.0]}
    emb = Embeddings(lambda texts: np.asarray([table[t] for t in texts]))
    rows_asked: list[list[int]] = []

    def by_rows(rows: list[int]) -> np.ndarray:
        rows_asked.append(rows)
        return np.full((len(rows), 2), 7.0)

    window = {"fact_rows": [5, 9], "fact_texts": ["a counter", "a deque"]}
    got = envelope_vectors(window, emb=emb, dim=2, by_rows=by_rows)
    assert got.tolist() == [[0.0, 1.0], [1.0, 0.0]] and rows_asked == []
    old = envelope_vectors({"fact_rows": [5]}, emb=emb, dim=2, by_rows=by_rows)
    assert old.tolist() == [[7.0, 7.0]] and rows_asked == [[5]]
    empty = envelope_vectors({"fact_rows": [], "fact_texts": []}, emb=emb, dim=2,
                             by_rows=by_rows)
    assert empty.shape == (0, 2) and rows_asked == [[5]]


def test_the_report_names_each_arms_knowledge_base() -> None:
    from quality_llm_report import kb_by_arm

    kb = {"path": "/k/pydocs-related.ckf", "recipe": "title-section-short", "facts": 7097}
    runs = [{"arm": "cdr"}, {"arm": "relevance"}, {"arm": "focused", "kb": kb},
            {"arm": "focused", "kb": kb}]
    got = kb_by_arm(runs, ["relevance", "cdr", "focused"], "the old plain CKF")
    assert got == ("`relevance`, `cdr`: the old plain CKF; `focused`: "
                   "`/k/pydocs-related.ckf`, recipe `title-section-short`, 7,097 facts")


def test_the_python_docs_arms_include_the_recommended_profile_and_fixed_thresholds() -> None:
    from quality_llm import DEFAULT_ARMS, MAN_ARMS, PYDOCS_THRESHOLDS

    assert set(MAN_ARMS) <= set(DEFAULT_ARMS)
    assert DEFAULT_ARMS[:3] == ("relevance", "cdr", "focused")
    assert PYDOCS_THRESHOLDS == (0.607, 0.508)  # the calibration of 2026-12-01's outputs
