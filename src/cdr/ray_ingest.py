"""Ingest on a Ray cluster: the embedding step (the one that costs) runs as parallel Ray tasks.

`RayEmbedder` is an ordinary `Embedder`, so ingest itself is unchanged — parse and chunk in the
driver, embed the new texts of each commit batch across the cluster, then each shard's writer
commits its own facts in the same atomic batches as a local ingest (crash-safe as today: a
killed job keeps every committed batch and the next run resumes). Each task runs in a worker
pinned to one BLAS thread, so W workers use W cores rather than fighting over them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from cdr.embed import Progress, validate_texts
from cdr.errors import InvalidInputError

ONE_THREAD = {k: "1" for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}
TASK_TEXTS = 256  # texts per task: large enough to amortise a task (~ms), small for progress


def _encode(spec: str | None, texts: list[str], batch_size: int) -> np.ndarray:
    """Runs in a Ray worker: the process-wide model (loaded once per worker), one batch."""
    from cdr.embed import get_embedder

    return get_embedder(spec).encode(texts, batch_size=batch_size)


def _describe(spec: str | None) -> tuple[str, int]:
    from cdr.embed import get_embedder

    e = get_embedder(spec)
    return e.model_id, int(e.dim)


class RayEmbedder:
    """Embeds on a Ray cluster with at most `workers` tasks in flight (one core each)."""

    def __init__(self, address: str | None = None, *, workers: int = 2,
                 spec: str | None = None, task_texts: int = TASK_TEXTS) -> None:
        import ray

        from cdr.ray_index import connect

        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise InvalidInputError(f"workers must be a positive integer, got {workers!r}")
        connect(address)
        self.workers = workers
        self.spec = spec
        self.task_texts = task_texts
        opts = {"num_cpus": 1, "runtime_env": {"env_vars": dict(ONE_THREAD)}, "max_retries": 3}
        self._encode = ray.remote(_encode).options(**opts)
        self.model_id, self.dim = ray.get(ray.remote(_describe).options(**opts).remote(spec))

    def encode(self, texts: Sequence[str], *, batch_size: int = 32,
               progress: Progress | None = None) -> np.ndarray:
        """float32 (len(texts), dim) unit rows, in order; `progress(k)` as batches finish."""
        import ray

        items = validate_texts(texts)
        if not items:
            return np.zeros((0, self.dim), np.float32)
        spans = [(s, min(s + self.task_texts, len(items)))
                 for s in range(0, len(items), self.task_texts)]
        out = np.empty((len(items), self.dim), np.float32)
        waiting: dict[Any, tuple[int, int]] = {}
        todo = list(spans)
        while todo or waiting:
            while todo and len(waiting) < self.workers:
                s, e = todo.pop(0)
                waiting[self._encode.remote(self.spec, items[s:e], batch_size)] = (s, e)
            done, _ = ray.wait(list(waiting), num_returns=1)
            for ref in done:
                s, e = waiting.pop(ref)
                out[s:e] = ray.get(ref)
                if progress:
                    progress(e - s)
        return out
