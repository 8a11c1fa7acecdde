"""What one shard of a shard set does, as a plain object: a Ray actor wraps it (`ray_index`).

Kept free of Ray so that the per-shard arithmetic is the same code the single CKF runs
(`select_rows`, `cdr_components`) and can be read and tested without a cluster. Each server
maps its own CKF directory. `refresh()` maps a newer committed state when the shard changed
(an upload through the gateway, `cdr ingest --shards` from outside) and keeps the last few
states mapped: every call names the generation the caller's index was built on, and is
answered from that state while it is kept, so requests in flight on an older index finish
unchanged while new ones use the new state — what the local gateway's snapshots give. A
restarted actor maps only the newest state; a call for a state it does not hold gets the
generation it does serve, which the caller refuses (and reopens its index).
"""

from __future__ import annotations

import os
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from cdr.ckf.snapshot import CKFSnapshot
from cdr.cluster.shard_merge import ShardTop, ahead
from cdr.cluster.shard_view import ShardView
from cdr.ranking import MODE_RULES, check_mode, score_terms
from cdr.retrieval.factindex import Selection, WindowQuery, select_rows

_F32 = np.float32
KEEP_GENERATIONS = 4  # states kept mapped for requests still on an older index


@dataclass(frozen=True, slots=True)
class ShardRows:
    """A shard's per-row arrays, sent once when the caller opens the set (the one-process
    loop indexes them by global row)."""

    model_id: str
    dim: int
    generation: int
    active: np.ndarray
    importance: np.ndarray
    token_counts: np.ndarray
    ngram_offsets: np.ndarray
    ngram_hashes: np.ndarray

    @property
    def n_rows(self) -> int:
        return len(self.active)


class ShardServer:
    """Serves one shard directory: Phase 1, Phase 2 over its candidates, fact reads."""

    def __init__(self, path: str, shard: int) -> None:
        self.path = Path(path)
        self.shard = shard
        self.index = CKFSnapshot.open(self.path)
        self._kept: OrderedDict[int, Any] = OrderedDict([(self.index.generation, self.index)])
        self._last: tuple[tuple[int, bytes, float, int | None, int, bytes], Selection] | None = None

    def pid(self) -> int:
        """The serving process (tests kill it to prove restarts)."""
        return os.getpid()

    def memory(self) -> dict[str, int]:
        """Resident set of this process and the size of the shard's mapped matrix (bytes):
        the matrix pages are shared with the page cache, so RSS counts what was touched."""
        rss = 0
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) * 1024
        return {"rss": rss, "matrix": int(self.index.embeddings.nbytes)}

    def generation(self) -> int:
        return self.index.generation

    def refresh(self) -> int:
        """Map the shard's newest committed state if it changed (one meta-row read when it
        did not); returns the generation now served to new indexes."""
        if self.index.latest_generation() == self.index.generation:
            return self.index.generation
        fresh = CKFSnapshot.open(self.path)
        _ = fresh.ngram_index  # build before any caller ranks on it
        self.index = fresh
        self._kept[fresh.generation] = fresh
        self._kept.move_to_end(fresh.generation)
        while len(self._kept) > KEEP_GENERATIONS:
            _, old = self._kept.popitem(last=False)
            old.close()
        return fresh.generation

    def _at(self, generation: int | None) -> Any:
        """The kept state of `generation` (None: the newest); an unknown one gets the
        newest, whose generation the caller then refuses."""
        if generation is None:
            return self.index
        return self._kept.get(generation, self.index)

    def rows(self) -> ShardRows:
        """The newest state's per-row arrays (refreshed first: a new index starts there)."""
        self.refresh()
        s = self.index
        return ShardRows(s.model_id, s.dim, s.generation, np.asarray(s.active),
                         np.asarray(s.importance), np.asarray(s.token_counts),
                         np.asarray(s.ngram_offsets), np.asarray(s.ngram_hashes))

    def active_ids(self, generation: int | None = None) -> tuple[int, np.ndarray, np.ndarray]:
        """(generation, selectable local rows, their fact ids): what the caller needs to find
        the facts other shards also hold (`cdr.cluster.shard_view`)."""
        index = self._at(generation)
        rows = np.flatnonzero(np.asarray(index.active)).astype(np.int64)
        ids = np.array(index.fact_ids(rows), dtype="S32") if len(rows) else np.zeros(0, "S32")
        return index.generation, rows, ids

    def holders(self, local_rows: list[int], generation: int | None = None
                ) -> tuple[int, list[tuple[int, str]]]:
        """(generation, (status, primary source) of each row)."""
        index = self._at(generation)
        status = np.asarray(index.status)
        return index.generation, [(int(status[f.row]), str(f.source))
                                  for f in index.facts(local_rows)]

    def select(self, q: np.ndarray, gate: float, limit: int | None, offset: int,
               generation: int | None = None, view: ShardView | None = None
               ) -> tuple[int, Selection]:
        """(generation, Phase 1 over this shard with rows numbered from `offset`), without
        the rows `view` hides (facts another shard holds too)."""
        index = self._at(generation)
        key = (index.generation, np.asarray(q, _F32).tobytes(), float(gate), limit, offset,
               view.digest() if view is not None else b"")
        if self._last is not None and self._last[0] == key:
            return index.generation, self._last[1]
        active = view.active(index.active) if view is not None else index.active
        sel = select_rows(index.embeddings, active, q, gate, limit, offset)
        self._last = (key, sel)
        return index.generation, sel

    def rank(self, w: WindowQuery, cut: tuple[float, int] | None, offset: int,
             generation: int | None = None, view: ShardView | None = None
             ) -> tuple[int, ShardTop]:
        """(generation, this shard's best `w.top_k` candidates) ranked exactly as
        `cdr.ranking.rank` ranks them in one index (`cdr.cluster.shard_merge` proves the merge).

        `cut` None: the first round — rank the shard's whole Phase 1 selection and send its
        (row, relevance) head along, so the caller can find the global cut-off. `cut` given
        (relevance, row): rank only the rows ahead of it (asked when one round could not
        prove the merge)."""
        index = self._at(generation)
        gen, sel = self.select(w.query, w.gate, w.limit, offset, index.generation, view)
        rows, rel, emb = sel.indices, sel.relevances, sel.embeddings
        if cut is not None:
            keep = ahead(rel, rows, cut)
            rows, rel, emb = rows[keep], rel[keep], emb[keep]
        local = rows - offset
        importance = np.asarray(index.importance, _F32)
        if view is not None:
            importance = view.raise_importance(importance)
        imp = importance[local]
        m = len(rows)
        counts = None
        if MODE_RULES[check_mode(w.mode)].uses_ngrams and len(w.blacklist):
            counts = index.ngram_index.count_in(w.blacklist)[local]
        # The same terms `cdr.ranking.rank` computes in one index (one dispatch table).
        score, novelty, pull, penalty, cov = score_terms(
            w.mode, emb, rel, imp, counts, w.centroid, w.residual, w.coverage_nonempty)
        # The single index orders by score, ties by selection position, i.e. by (-rel, row).
        order = np.lexsort((rows, -rel, -score))[: w.top_k]
        lo = local[order]
        heads = cut is None and w.limit is not None
        none = np.zeros(0, np.int64)
        return gen, ShardTop(
            rows[order], np.stack([score, rel, novelty, pull, penalty, cov])[:, order],
            emb[order] if w.vectors else np.zeros((len(order), 0), _F32),
            np.asarray(index.token_counts, np.int32)[lo],
            np.array(index.fact_ids(lo), dtype="S"), m, int((penalty > 0).sum()),
            rows if heads else none, rel if heads else none.astype(_F32),
            penalty > 0 if heads else none.astype(bool))

    # Reads by local row: (generation, result), so rows are never read from another state.

    def facts(self, local_rows: list[int], generation: int | None = None
              ) -> tuple[int, list[Any]]:
        index = self._at(generation)
        return index.generation, index.facts(local_rows)

    def fact_ids(self, local_rows: list[int], generation: int | None = None
                 ) -> tuple[int, list[str]]:
        index = self._at(generation)
        return index.generation, index.fact_ids(local_rows)

    def vectors(self, local_rows: list[int], generation: int | None = None
                ) -> tuple[int, np.ndarray]:
        index = self._at(generation)
        return index.generation, index.vectors(local_rows)

    def documents(self, generation: int | None = None) -> tuple[int, list[dict[str, Any]]]:
        index = self._at(generation)
        return index.generation, index.documents()

    def stats(self, generation: int | None = None) -> tuple[int, dict[str, Any]]:
        index = self._at(generation)
        return index.generation, index.stats()
