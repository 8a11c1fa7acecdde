"""The window loop's behaviour, pinned: the same task on the same knowledge base gives the same
trace under every profile, window by window — the facts sent and their order, the text, the
citations, the headers and the exits — so that reorganising the loop's code cannot change what
it does unnoticed.

The traces in `tests/data/traces/` were recorded with `python -m tests.test_loop_traces`; a
deliberate change of behaviour records them again (and says so in its commit). The knowledge
base is rebuilt on each machine, and a CPU with other vector kernels embeds and multiplies
differently in the last bits, which can tip a near-tie the other way: the recording keeps a
probe of both (`probe.json`), and where this machine's differs the test is skipped with that
reason (record the traces here to use it). Scores are compared to 3 decimals.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from cdr.ckf import CKF
from cdr.trace import build_trace
from cdr.window.loop import GenerationConfig, Generator
from cdr.writers.extractive import ExtractiveWriter
from tests.conftest import BUILTIN_TYPES_OUTLINE, BUILTIN_TYPES_TASK

TRACES = Path(__file__).parent / "data" / "traces"
RUNS: dict[str, dict[str, Any]] = {
    "spec": {"profile": "spec"},
    "fresh": {"profile": "fresh"},
    "focused": {"profile": "focused"},
    "focused-footnotes-mmr": {"profile": "focused", "citations": "footnotes", "ranking": "mmr"},
    "spec-all-rules": {"profile": "spec", "repeats": "drop", "subject": "anchor",
                       "queries": "expanded", "envelope": "fit", "resume": "prefill"},
}


def run_trace(ckf: CKF, options: dict[str, Any]) -> dict[str, Any]:
    gen = Generator(ckf, ExtractiveWriter(),
                    GenerationConfig(max_windows=4, words=2400, **options))
    session = gen.start(BUILTIN_TYPES_TASK, BUILTIN_TYPES_OUTLINE)
    return build_trace(session, list(gen.run(session.task, session=session)))


def comparable(value: Any) -> Any:
    """The trace with every float at 3 decimals and every path by its file's name (the
    knowledge base is built in a temporary directory)."""
    if isinstance(value, float):
        return round(value, 3)
    if isinstance(value, str) and value.startswith("/"):
        return value.rsplit("/", 1)[-1]
    if isinstance(value, dict):
        return {comparable(k): comparable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [comparable(v) for v in value]
    return value


def probe() -> dict[str, str]:
    """Digests of what this machine's kernels make of a fixed text and a fixed product: the
    default embedder's vector, and the row products the ranking computes (einsum)."""
    from cdr.retrieval.embed import default_embedder

    vec = default_embedder().encode(["Sequence types: lists, tuples and ranges."])[0]
    rng = np.random.default_rng(0)
    rows = rng.standard_normal((257, vec.shape[0])).astype(np.float32)
    dots = np.einsum("ij,j->i", rows, vec)
    return {"embedding": hashlib.sha256(vec.tobytes()).hexdigest(),
            "row_products": hashlib.sha256(dots.tobytes()).hexdigest()}


@pytest.fixture(scope="module")
def types_ckf(types_ckf_path: Path) -> CKF:
    recorded = json.loads((TRACES / "probe.json").read_text(encoding="utf-8"))
    if probe() != recorded:
        pytest.skip("the traces were recorded on a CPU whose kernels embed or multiply "
                    "differently in the last bits; record them here (python -m "
                    "tests.test_loop_traces) to pin the loop on this machine")
    return CKF.open(types_ckf_path)


@pytest.mark.parametrize("name", sorted(RUNS))
def test_the_loop_writes_the_recorded_trace(types_ckf, name):
    recorded = json.loads((TRACES / f"{name}.json").read_text(encoding="utf-8"))
    assert comparable(run_trace(types_ckf, RUNS[name])) == comparable(recorded)


def record(ckf_path: Path) -> None:
    """Record every run's trace (a deliberate change of the loop's behaviour)."""
    (TRACES / "probe.json").write_text(json.dumps(probe(), indent=1) + "\n", encoding="utf-8")
    with CKF.open(ckf_path) as ckf:
        for name, options in RUNS.items():
            trace = run_trace(ckf, options)
            (TRACES / f"{name}.json").write_text(json.dumps(trace, indent=1, sort_keys=True)
                                                 + "\n", encoding="utf-8")
            print(name, len(trace["windows"]), "windows")


if __name__ == "__main__":  # python -m tests.test_loop_traces [CKF_PATH]
    import tempfile

    from tests.conftest import BUILTIN_TYPES_TOPICS, DISTRACTOR_TOPICS, build_topics_ckf

    if len(sys.argv) > 1:
        record(Path(sys.argv[1]))
    else:  # the knowledge base the test's fixture builds
        with tempfile.TemporaryDirectory() as tmp:
            record(build_topics_ckf(Path(tmp), BUILTIN_TYPES_TOPICS + DISTRACTOR_TOPICS))
