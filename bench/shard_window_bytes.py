"""Bytes the window loop receives from Ray shards per window: ranking on the shards
(`RankingIndex.rank_window`, top candidates without vectors) against `select` fan-out +
central ranking, on the built-in types topics (479 MiniLM facts, 3 shards), 3 cdr windows.

Counts the pickled size of every shard reply (`rank`, `select`): what crosses
the object store. Usage: `CDR_RAY_ADDRESS=127.0.0.1:PORT python bench/shard_window_bytes.py`
(a Ray head with token auth, as `.ci/run` starts; the shard actors are stopped at the end).
"""

from __future__ import annotations

import os
import pickle
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.conftest import (
    BUILTIN_TYPES_OUTLINE,
    BUILTIN_TYPES_TASK,
    BUILTIN_TYPES_TOPICS,
    DISTRACTOR_TOPICS,
    build_topics_ckf,
)
from tests.test_ray_index import _docs_of, build_pair

from cdr.ckf.snapshot import CKFSnapshot
from cdr.cluster.ray_index import RayShardedIndex, connect
from cdr.window.loop import GenerationConfig, Generator
from cdr.writers import get_writer


class SelectOnly:
    """The index without `rank_window`: the loop falls back to select + central rank."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        if name == "rank_window":
            raise AttributeError(name)
        return getattr(self._inner, name)


def main() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="cdr-bytes-"))
    base = build_topics_ckf(tmp / "types", BUILTIN_TYPES_TOPICS + DISTRACTOR_TOPICS)
    with CKFSnapshot.open(base) as b:
        docs, model, dim = _docs_of(b), b.model_id, b.dim
    _, shards = build_pair(tmp / "pair", docs, 3, model, dim)
    connect(os.environ["CDR_RAY_ADDRESS"])
    index = RayShardedIndex(shards)
    replies: list[int] = []
    gather = RayShardedIndex._gather

    def counting(self: RayShardedIndex, method: str, args: Any, **kw: Any) -> Any:
        out = gather(self, method, args, **kw)
        if method in ("rank", "select"):
            replies.append(len(pickle.dumps(out)))
        return out

    RayShardedIndex._gather = counting  # type: ignore[method-assign]
    try:
        for name, ckf in (("rank on shards", index), ("select + rank here", SelectOnly(index))):
            for extra in ({}, {"context_tokens": 60000}):
                replies.clear()
                gen = Generator(ckf, get_writer("extractive"), GenerationConfig(
                    ranking="cdr", max_windows=3, words=2000, **extra))
                session = gen.start(BUILTIN_TYPES_TASK, BUILTIN_TYPES_OUTLINE)
                n = sum(1 for _ in gen.run(BUILTIN_TYPES_TASK, session=session))
                total = sum(replies)
                print(f"{name:18s} {extra or 'default envelope'}: {n} windows, "
                      f"{len(replies)} fan-outs, {total // n} bytes received per window "
                      f"({index.n_rows} facts, {index.n_shards} shards)")
    finally:
        RayShardedIndex._gather = gather  # type: ignore[method-assign]
        index.close(stop_actors=True)


if __name__ == "__main__":
    main()
