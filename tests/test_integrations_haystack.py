"""The Haystack component (`cdr.integrations.haystack.CDRRetriever`) in a real Haystack
pipeline: the next window's facts on each run, what was written recorded so the next run
moves on, the session's exit reported."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cdr.ckf import CKF
from tests.conftest import BUILTIN_TYPES_OUTLINE, BUILTIN_TYPES_TASK

os.environ.setdefault("HAYSTACK_TELEMETRY_ENABLED", "False")  # no network from the tests
haystack = pytest.importorskip("haystack", reason="the haystack extra is not installed")

from cdr.integrations.haystack import CDRRetriever  # noqa: E402


@pytest.fixture(scope="module")
def types_ckf(types_ckf_path: Path) -> CKF:
    return CKF.open(types_ckf_path)


def test_a_pipeline_hands_out_window_after_window(types_ckf: CKF) -> None:
    retriever = CDRRetriever(types_ckf, task=BUILTIN_TYPES_TASK, outline=BUILTIN_TYPES_OUTLINE,
                             max_windows=4, words=4000)
    pipe = haystack.Pipeline()
    pipe.add_component("cdr", retriever)
    first = pipe.run({"cdr": {}})["cdr"]
    docs = first["documents"]
    assert docs and not first["done"] and "F1" in first["prompt"]
    assert [d.meta["ref"] for d in docs] == [f"F{i + 1}" for i in range(len(docs))]
    assert all(d.score == d.meta["score"] and d.meta["window"] == 1 for d in docs)
    again = pipe.run({"cdr": {}})["cdr"]  # not recorded yet: the same envelope
    assert [d.id for d in again["documents"]] == [d.id for d in docs]
    written = "\n\n".join(d.content for d in docs)
    second = pipe.run({"cdr": {"written": written}})["cdr"]
    assert second["documents"] and {d.id for d in second["documents"]} != {d.id for d in docs}
    assert second["documents"][0].meta["window"] == 2
    runs = 2
    while not (out := pipe.run({"cdr": {"written": "\n\n".join(
            d.content for d in second["documents"])}})["cdr"])["done"]:
        second, runs = out, runs + 1
        assert runs < 10
    assert out["documents"] == [] and retriever.done
    trace = retriever.trace()
    assert trace["status"] in ("limit-reached", "task-complete", "ckf-exhausted")
    assert len(trace["windows"]) >= 2


def test_the_query_starts_a_session_without_a_task(types_ckf: CKF) -> None:
    out = CDRRetriever(types_ckf).run(query=BUILTIN_TYPES_TASK)
    assert out["documents"] and not out["done"]
    with pytest.raises(Exception, match="no task"):
        CDRRetriever(types_ckf).run()
    with pytest.raises(Exception, match="no envelope is out"):
        CDRRetriever(types_ckf, task=BUILTIN_TYPES_TASK).handout.record("text")
