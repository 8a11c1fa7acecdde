"""Ingest on a Ray cluster: the embedding step (the one that costs) runs on parallel Ray actors.

`RayEmbedder` is an ordinary `Embedder`, so ingest itself is unchanged — parse and chunk in the
driver, embed the new texts of each commit batch across the cluster, then each shard's writer
commits its own facts in the same atomic batches as a local ingest (crash-safe as today: a
killed job keeps every committed batch and the next run resumes).

Why actors, and why this dispatch (2 workers reached only 1.41–1.60× one worker's facts/s
with stateless tasks):

- One long-lived actor per worker, pinned to one BLAS thread and one CPU, loads the model once
  in its constructor; `RayEmbedder` waits for every actor to be ready before it returns. A
  task pool loaded the model in whichever worker process a task first landed on, so a second
  worker could pay the load in the middle of a timed job.
- Each `encode` call is cut into equal pieces, a few per worker, not fixed-size spans: with
  fixed spans the last span of every commit batch (and every shard) ran alone while the other
  worker idled.
- Every piece is queued at once, round robin: an actor starts its next piece as soon as it
  finishes one, without waiting for the driver's round trip.
- `prefetch(texts)` queues texts the caller will ask for later (ingest announces each shard's
  new texts before committing them batch by batch), so actors keep embedding while the driver
  parses, counts tokens and commits.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from cdr.errors import CdrError, InvalidInputError
from cdr.retrieval.embed import EMBED_THREADS_ENV, Progress, validate_texts

# A worker holds one Ray CPU, so everything in it runs on one thread: BLAS, the tokenizer's
# pool, and the embedder's own batch threads (which default to every CPU of the machine:
# measured at 1M-fact scale, one worker alone then used 1.6 cores and two could not add much).
ONE_THREAD = {k: "1" for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                               "RAYON_NUM_THREADS", EMBED_THREADS_ENV)}
TASK_TEXTS = 256  # most texts per piece: large enough to amortise a call (~ms)
PIECES_PER_WORKER = 4  # pieces per worker and call: small tails, few calls


class EmbedWorker:
    """A Ray actor's state: one loaded model (the constructor loads it)."""

    def __init__(self, spec: str | None) -> None:
        from cdr.retrieval.embed import get_embedder

        self.model = get_embedder(spec)

    def describe(self) -> tuple[str, int]:
        return self.model.model_id, int(self.model.dim)

    def cpu_seconds(self) -> float:
        """CPU time this actor's process has used (benchmarks: busy share of a worker)."""
        return time.process_time()

    def encode(self, texts: list[str], batch_size: int) -> np.ndarray:
        return self.model.encode(texts, batch_size=batch_size)


class RayEmbedder:
    """Embeds on a Ray cluster with `workers` actors (one core each); see the module doc."""

    def __init__(self, address: str | None = None, *, workers: int = 2,
                 spec: str | None = None, task_texts: int = TASK_TEXTS,
                 start_seconds: float = 300.0) -> None:
        import ray

        from cdr.cluster.ray_index import connect

        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise InvalidInputError(f"workers must be a positive integer, got {workers!r}")
        if isinstance(task_texts, bool) or not isinstance(task_texts, int) or task_texts < 1:
            raise InvalidInputError(f"task_texts must be a positive integer, got {task_texts!r}")
        connect(address)
        self.workers = workers
        self.spec = spec
        self.task_texts = task_texts
        cls = ray.remote(EmbedWorker).options(
            num_cpus=1, runtime_env={"env_vars": dict(ONE_THREAD)}, max_restarts=3,
            max_task_retries=3)  # encode is a pure function of its input: safe to rerun
        self._actors = [cls.remote(spec) for _ in range(workers)]
        try:  # every model loaded before the job starts
            described = ray.get([a.describe.remote() for a in self._actors],
                                timeout=start_seconds)
        except ray.exceptions.GetTimeoutError:
            self.close()
            free = ray.available_resources().get("CPU", 0)
            raise CdrError(
                f"{workers} embedding worker(s) did not start within {start_seconds:g} s: each "
                f"needs one free CPU in the Ray cluster ({free:g} free now)") from None
        self.model_id, self.dim = described[0]
        self._lock = threading.Lock()
        self._next = 0  # the actor the next piece goes to
        self._prefetched: dict[str, tuple[Any, int]] = {}  # text → (piece, row in it)

    # ------------------------------------------------------------------ dispatch

    def _pieces(self, n: int) -> list[tuple[int, int]]:
        """Equal (start, stop) pieces of n texts: a few per worker, each ≤ task_texts."""
        count = max(-(-n // self.task_texts), min(n, self.workers * PIECES_PER_WORKER))
        edges = np.linspace(0, n, count + 1).round().astype(int)
        return [(int(a), int(b)) for a, b in itertools.pairwise(edges.tolist()) if b > a]

    def _submit(self, texts: list[str], batch_size: int) -> Any:
        """Queue one piece on the next actor (round robin: pieces are equal, so the queues
        stay level; an actor runs its queue back to back, no driver round trip between)."""
        with self._lock:
            k = self._next
            self._next = (k + 1) % len(self._actors)
        return self._actors[k].encode.remote(texts, batch_size)

    def prefetch(self, texts: Sequence[str], *, batch_size: int = 32) -> None:
        """Start embedding `texts` now; a later `encode` of any of them takes the result."""
        items = [t for t in dict.fromkeys(texts) if t not in self._prefetched]
        for s, e in self._pieces(len(items)):
            ref = self._submit(items[s:e], batch_size)
            for j, t in enumerate(items[s:e]):
                self._prefetched[t] = (ref, j)

    def encode(self, texts: Sequence[str], *, batch_size: int = 32,
               progress: Progress | None = None) -> np.ndarray:
        """float32 (len(texts), dim) unit rows, in order; `progress(k)` as pieces finish."""
        import ray

        items = validate_texts(texts)
        out = np.empty((len(items), self.dim), np.float32)
        if not items:
            return out
        where: dict[Any, list[tuple[int, int]]] = {}  # piece → [(row of out, row of piece)]
        rest: list[int] = []
        for i, t in enumerate(items):
            hit = self._prefetched.pop(t, None)
            if hit is None:
                rest.append(i)
            else:
                where.setdefault(hit[0], []).append((i, hit[1]))
        for s, e in self._pieces(len(rest)):
            ref = self._submit([items[i] for i in rest[s:e]], batch_size)
            where[ref] = [(rest[s + j], j) for j in range(e - s)]
        waiting = list(where)
        while waiting:
            done, waiting = ray.wait(waiting, num_returns=1)
            for ref in done:
                rows = where[ref]
                vecs = ray.get(ref)
                out[[i for i, _ in rows]] = vecs[[j for _, j in rows]]
                if progress:
                    progress(len(rows))
        return out

    def cpu_seconds(self) -> list[float]:
        """CPU seconds each worker has used so far (a benchmark's busy share)."""
        import ray

        out: list[float] = ray.get([a.cpu_seconds.remote() for a in self._actors])
        return out

    def forget(self) -> None:
        """Drop prefetched texts nobody asked for (their results are released)."""
        self._prefetched.clear()

    def close(self) -> None:
        """End the actors (they hold a model each)."""
        import ray

        for a in self._actors:
            ray.kill(a)
        self._actors = []
