"""The retrieval benchmark's own code: per-window measures, the man-page corpus's conversion
and its fixed task split."""

from __future__ import annotations

import hashlib
import math
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import corpus_man
from retrieval_metrics import (
    STALE_BELOW,
    pool_ran_out,
    slope,
    summarise,
    window_measures,
)

# ------------------------------------------------------------------------ window measures


def test_window_measures_exact_small_run() -> None:
    own = {"a1", "a2", "a3", "a4"}
    pool = {"a1", "a2", "a3"}
    envs = [["a1", "a2", "b1", "b2"], ["a1", "a3", "b1", "c1"], ["a1", "a3", "b1", "c1"]]
    ms = window_measures(envs, [True, True, True], own, pool)
    assert [m.on_topic for m in ms] == [0.5, 0.5, 0.5]
    assert [m.fresh for m in ms] == [1.0, 0.5, 0.0]
    assert [m.own_recall for m in ms] == [0.5, 0.75, 0.75]
    assert [m.pool_recall for m in ms] == [2 / 3, 1.0, 1.0]
    assert [m.stale for m in ms] == [False, False, True]
    assert pool_ran_out(ms) == 2


def test_unwritten_window_sends_nothing_and_is_not_stale() -> None:
    own = {"a1", "a2"}
    envs = [["a1", "b1"], ["a1", "b1"], ["a2"]]
    ms = window_measures(envs, [True, False, True], own, own)
    assert ms[1].fresh == 0.0 and not ms[1].stale  # closed unwritten: not a stale window
    assert ms[1].own_recall == 0.5  # nothing more was sent
    assert ms[2].fresh == 1.0 and ms[2].own_recall == 1.0


def test_empty_envelope_is_nan_not_zero() -> None:
    ms = window_measures([[]], [True], {"a"}, {"a"})
    assert math.isnan(ms[0].on_topic) and math.isnan(ms[0].fresh)
    assert not ms[0].stale
    assert pool_ran_out(ms) is None


def test_duplicate_ids_in_one_envelope_count_once() -> None:
    ms = window_measures([["a", "a", "b"]], [True], {"a"})
    assert ms[0].envelope == 2 and ms[0].on_topic == 0.5


def test_no_pool_means_never_ran_out() -> None:
    ms = window_measures([["a"]], [True], {"a"}, set())
    assert math.isnan(ms[0].pool_recall)
    assert pool_ran_out(ms) is None


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="written flags"):
        window_measures([["a"]], [], {"a"})
    with pytest.raises(ValueError, match="subset"):
        window_measures([["a"]], [True], {"a"}, {"z"})
    with pytest.raises(ValueError, match="statuses"):
        summarise(window_measures([["a"]], [True], {"a"}), [])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.sampled_from("abcdefgh"), max_size=6), min_size=1, max_size=8),
       st.data())
def test_measures_properties(envs: list[list[str]], data: st.DataObject) -> None:
    written = data.draw(st.lists(st.booleans(), min_size=len(envs), max_size=len(envs)))
    own = set(data.draw(st.sets(st.sampled_from("abcdefgh"), min_size=1)))
    pool = set(data.draw(st.sets(st.sampled_from(sorted(own)))))
    ms = window_measures(envs, written, own, pool)
    recalls = [m.own_recall for m in ms]
    assert recalls == sorted(recalls)  # recall never falls
    assert all(0.0 <= r <= 1.0 for r in recalls)
    # The first written window is all fresh; fresh share never exceeds 1.
    first = next((m for m in ms if m.written and m.envelope), None)
    if first is not None and all(not w for w in written[: first.window - 1]):
        assert first.fresh == 1.0
    sent = set().union(*[set(e) for e, w in zip(envs, written, strict=True) if w])
    assert ms[-1].own_recall == len(sent & own) / len(own)
    out = pool_ran_out(ms)
    assert (out is not None) == (bool(pool) and pool <= sent)


# ------------------------------------------------------------------------ run summary


def test_summary_exit_on_time() -> None:
    own = {"a1", "a2"}
    envs = [["a1", "b1"], ["a2", "b1"], ["a2", "b1"]]
    ms = window_measures(envs, [True, True, False], own, own)
    s = summarise(ms, ["in-progress", "in-progress", "ckf-exhausted"])
    assert s.w1_on_topic == 0.5 and s.later_on_topic == 0.5 and s.later_fresh == 0.5
    assert s.own_recall_end == 1.0 and s.stale_windows == 0 and s.written_windows == 2
    assert (s.exit_window, s.exit_reason, s.ran_out, s.exit_lag) == (3, "ckf-exhausted", 2, 1)
    assert s.exit_timing == "on time"


def test_summary_late_exit_and_stale_windows() -> None:
    own = {"a1"}
    envs = [["a1", "b1"], ["a1", "b1"], ["a1", "b1"], ["a1", "b1"]]
    ms = window_measures(envs, [True] * 4, own, own)
    s = summarise(ms, ["in-progress"] * 3 + ["ckf-exhausted"])
    assert s.stale_windows == 3 and s.exit_lag == 3 and s.exit_timing == "late"
    s2 = summarise(ms, ["in-progress"] * 3 + ["limit-reached"])
    assert s2.exit_timing == "window limit after pool ran out"


def test_summary_early_exit() -> None:
    own = {"a1", "a2", "a3"}
    ms = window_measures([["a1", "b"]], [True], own, own)
    s = summarise(ms, ["ckf-exhausted"])
    assert s.ran_out is None and s.exit_timing == "before pool ran out"
    assert math.isnan(s.later_on_topic) and s.own_recall_end == pytest.approx(1 / 3)


def test_stale_threshold_is_the_issue_s() -> None:
    assert STALE_BELOW == 0.25
    # 1 fresh of 4 = 25%: not below, so not stale; 1 of 5 is.
    ms = window_measures([list("abc"), list("abcx")], [True, True], {"a"})
    ms2 = window_measures([list("abcd"), list("abcdx")], [True, True], {"a"})
    assert not ms[1].stale and ms2[1].stale


def test_slope() -> None:
    assert slope([1.0, 0.8, 0.6]) == pytest.approx(-0.2)
    assert slope([0.5, math.nan, 0.5]) == 0.0
    assert math.isnan(slope([0.3]))


# ------------------------------------------------------------------------ man-page corpus

RENDERED = """\
pipe(2)                     System Calls Manual                    pipe(2)



NAME
       pipe, pipe2 - create pipe

SYNOPSIS
       #include <unistd.h>

       int pipe(int pipefd[2]);

DESCRIPTION
       pipe() creates a pipe, a unidirectional data channel.

       O_CLOEXEC
              Set the close-on-exec flag.

       •  Writes of greater than PIPE_BUF bytes will be split.

   Program source
       int
       main(void)
       {
       }

RETURN VALUE
       On success, zero is returned.

Linux man-pages 6.03                2023-02-05                          pipe(2)
"""


def test_to_markdown_headings_title_and_blocks() -> None:
    conv = corpus_man.to_markdown(RENDERED)
    assert conv.title == "pipe, pipe2 - create pipe"
    assert conv.sections == ("Synopsis", "Description", "Return value")
    assert conv.paragraphs == 7
    md = conv.markdown
    assert md.startswith("# pipe, pipe2 - create pipe\n\n## Synopsis\n")
    assert "O_CLOEXEC: Set the close-on-exec flag." in md
    assert "- Writes of greater than PIPE_BUF bytes will be split." in md
    assert "### Program source\n\n```\nint\nmain(void)\n{\n}\n```" in md
    assert "Linux man-pages" not in md and "System Calls Manual" not in md
    assert "NAME" not in md


def test_to_markdown_refuses_non_pages() -> None:
    with pytest.raises(ValueError, match="NAME"):
        corpus_man.to_markdown("header\n\nDESCRIPTION\n       text\n\nfooter\n")
    with pytest.raises(ValueError, match="three lines"):
        corpus_man.to_markdown("\n\n")


def test_redirect_pages_and_titles() -> None:
    assert corpus_man.is_redirect('.\\" comment\n.so man2/pipe.2\n')
    assert not corpus_man.is_redirect('.\\" comment\n.TH PIPE 2\n.so x\n')
    assert corpus_man.split_title("pipe, pipe2 - create pipe") == ("pipe, pipe2", "create pipe")
    assert corpus_man.split_title("sync") == ("sync", "sync")
    assert corpus_man.heading_text("RETURN VALUE") == "Return value"
    assert corpus_man.heading_text("Program source") == "Program source"


def test_split_is_fixed_and_follows_sha1() -> None:
    pages = corpus_man.PAGES
    assert len(pages) == 60 and len(set(pages)) == 60
    assert set(corpus_man.TUNE) | set(corpus_man.REPORT) == set(pages)
    assert not set(corpus_man.TUNE) & set(corpus_man.REPORT)
    assert len(corpus_man.TUNE) == 20 and len(corpus_man.REPORT) == 40
    by_hash = sorted(pages, key=lambda n: hashlib.sha1(n.encode()).hexdigest())
    assert set(corpus_man.TUNE) == set(by_hash[:20])
    assert corpus_man.tune_names(pages) == corpus_man.TUNE
    assert corpus_man.split_names("all") == pages


def test_select_rule() -> None:
    def page(name: str, n_sec: int, paras: int) -> corpus_man.ManPage:
        return corpus_man.ManPage(name, name, name, name, tuple(f"S{i}" for i in range(n_sec)),
                                  paras, "")
    pages = [page("a", 3, 20), page("b", 9, 20), page("c", 10, 14), page("d", 10, 20),
             page("e", 12, 45), page("f", 13, 20), page("g", 9, 46), page("h", 9, 15)]
    assert [p.name for p in corpus_man.select(pages, 3)] == ["e", "d", "b"]


# ------------------------------------------------------------------------ arms


def test_arm_plan_skips_what_the_library_lacks_and_duplicates() -> None:
    from retrieval_arms import RetrievalArm, plan_arms, unavailable

    a = RetrievalArm("spec", "spec", "plain", {"ranking": "cdr", "profile": "spec"})
    same = RetrievalArm("cdr", "cdr", "plain", {"ranking": "cdr"})
    other_recipe = RetrievalArm("spec ts", "spec", "title-section", {"ranking": "cdr"})
    no_field = RetrievalArm("x", "x", "plain", {"no_such_option": "on"})
    no_profile = RetrievalArm("y", "y", "plain", {"profile": "no-such-profile"})
    bad_value = RetrievalArm("z", "z", "plain", {"memory": "sometimes"})
    assert unavailable(a) is None
    assert "no_such_option" in (unavailable(no_field) or "")
    assert "no-such-profile" in (unavailable(no_profile) or "")
    assert "memory" in (unavailable(bad_value) or "")
    plan = plan_arms([a, same, other_recipe, no_field, no_profile, bad_value])
    assert [x.name for x in plan.run] == ["spec", "spec ts"]
    why = dict((x.name, w) for x, w in plan.skipped)
    assert why["cdr"] == "runs exactly as 'spec'"
    assert set(why) == {"cdr", "x", "y", "z"}


def test_every_arm_has_a_unique_name_and_a_known_recipe() -> None:
    from retrieval_arms import RECIPES, all_arms

    arms = all_arms()
    assert len({a.name for a in arms}) == len(arms)
    assert {a.recipe for a in arms} == set(RECIPES)


def test_markdown_reads_back_as_the_page() -> None:
    conv = corpus_man.to_markdown(RENDERED)
    page = corpus_man.from_markdown("pipe", conv.markdown)
    assert (page.title, page.sections, page.paragraphs) == (conv.title, conv.sections,
                                                             conv.paragraphs)
    assert page.task == "Write a reference page about pipe, pipe2: create pipe"


def test_report_keeps_the_latest_run_per_arm_and_task(tmp_path: Path) -> None:
    import json

    import retrieval_report

    def rec(key: str, arm: str, seconds: float) -> str:
        return json.dumps({"key": key, "corpus": "man", "split": "tune", "arm": arm,
                           "task": "pipe", "seconds": seconds})

    path = tmp_path / "runs.jsonl"
    path.write_text("\n".join([rec("k1", "spec ts", 1.0), rec("k2", "fresh ts", 2.0),
                               '{"cut by a kill', rec("k3", "spec ts", 3.0)]) + "\n")
    runs = retrieval_report.load(path)
    assert sorted((r["arm"], r["seconds"]) for r in runs) == [("fresh ts", 2.0),
                                                             ("spec ts", 3.0)]
    assert retrieval_report.compact(path) == 2
    assert sorted(r["key"] for r in retrieval_report.load(path)) == ["k2", "k3"]
    assert len(path.read_text().splitlines()) == 2


# ------------------------------------------------------------------ the bench's CKF build


def test_a_bench_ckf_with_superseded_rows_is_built_again(tmp_path: Path) -> None:
    """A page re-cut by a re-ingest leaves superseded rows; run keys name the row count, so
    the bench's build must equal a fresh one (what a clean checkout makes)."""
    import retrieval
    from cdr.ckf import CKF, ingest

    docs = tmp_path / "docs"
    docs.mkdir()
    page = docs / "a.md"
    paras = [f"Paragraph {i} says fact number {i} about topic {i % 3}, in a sentence of its own "
             "long enough to stand as one fact of the page." for i in range(6)]
    page.write_text("# A\n\n" + "\n\n".join(paras) + "\n", encoding="utf-8")
    (docs / "b.md").write_text("# B\n\nA second page that stays as it is, one fact long.\n",
                               encoding="utf-8")
    plain = CKF.open_or_create(tmp_path / "plain.ckf", recipe="plain")
    ingest(plain, [docs], include=["*.md"])
    bench, _, _ = retrieval._ingest(tmp_path / "bench.ckf", "plain", docs, ["*.md"])
    bench.close()
    page.write_text("# A\n\n" + "\n\n".join(["The page now opens otherwise.", *paras[1:]])
                    + "\n", encoding="utf-8")
    ingest(plain, [docs], include=["*.md"])
    plain.refresh()
    assert int(plain.active.sum()) < plain.n_rows  # the library keeps superseded rows
    bench, _, _ = retrieval._ingest(tmp_path / "bench.ckf", "plain", docs, ["*.md"])
    assert int(bench.active.sum()) == bench.n_rows
    fresh, _, _ = retrieval._ingest(tmp_path / "fresh.ckf", "plain", docs, ["*.md"])
    assert [f.content for f in bench.facts(range(bench.n_rows))] == \
        [f.content for f in fresh.facts(range(fresh.n_rows))]
