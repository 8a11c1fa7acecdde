"""`FactIndex`: the narrow interface the window loop needs from a knowledge base (docs/design.md §5
"Real parts, and how they start").

The loop, the gateway and the benchmarks read facts through this protocol only, so a backend
other than the local CKF directory (e.g. shards served by Ray actors) slots in
without touching them. Everything here is per *row*: a row is an integer naming one fact in
the index's current state, stable until the index says otherwise (its `generation` changes).

Two pure functions carry Phase 1 itself, so that every backend (and every shard of one) runs
the same arithmetic: `select_rows` gates and orders one matrix of unit rows, and
`merge_selections` merges per-shard results into exactly the selection one index holding all
the rows would return — same rows, same relevances, same order (ties broken by row). Since a
fact's CDR score depends only on the fact and values the caller can broadcast (query,
coverage centroid and weight, residual matrix, gate, blacklisted 6-grams), ranking a merged
selection equals ranking the single-index selection.

For a backend whose shards should also rank (to send back k candidates instead of `limit`),
`cdr.cluster.shard_merge` holds the exact recipe: each shard ranks its own top-`limit` and returns
its best with its (relevance, row) head; the caller finds the global cut-off (the `limit`-th
(relevance, row) pair) from the heads, merges, and asks a shard again with the cut-off only
when its answer cannot prove the merge.
The per-row arrays below (`importance`, `token_counts`, the 6-gram CSR) are whole-index
arrays because the one-process loop indexes them by row; a backend too large for that can
serve them lazily.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

from cdr.errors import InvalidInputError
from cdr.retrieval.scan import QuantisedRows, gated_rows

if TYPE_CHECKING:
    from cdr.ngrams import NgramIndex
    from cdr.ranking import Ranking
    from cdr.retrieval.embed import Embedder



@dataclass(frozen=True, slots=True)
class Selection:
    """Phase 1 output: rows that pass the relevance gate, best first, with their vectors.

    Arrays rather than objects because Phase 2 touches every candidate each window as a
    handful of numpy operations (docs/design.md §1 "What flows where")."""

    indices: np.ndarray  # int64 (k,): rows of the index
    relevances: np.ndarray  # float32 (k,): cosine(query, fact), descending
    embeddings: np.ndarray  # float32 (k, dim): the facts' unit vectors

    def __len__(self) -> int:
        return int(self.indices.shape[0])

    def where(self, keep: np.ndarray) -> Selection:
        """The rows where `keep` (a boolean mask, or positions, over them), in this order."""
        return Selection(self.indices[keep], self.relevances[keep], self.embeddings[keep])

    @classmethod
    def empty(cls, dim: int) -> Selection:
        return cls(np.zeros(0, np.int64), np.zeros(0, np.float32), np.zeros((0, dim), np.float32))


@runtime_checkable
class FactView(Protocol):
    """What readers of a fact use: envelopes, prompts, traces and plans need these fields."""

    @property
    def row(self) -> int: ...
    @property
    def id(self) -> str: ...
    @property
    def content(self) -> str: ...
    @property
    def source(self) -> str: ...
    @property
    def section(self) -> str: ...
    @property
    def tokens(self) -> int: ...
    @property
    def importance(self) -> float: ...


@dataclass(frozen=True, slots=True)
class WindowQuery:
    """The request of `RankingIndex.rank_window`: what ranking needs, broadcast to every shard
    once per window (a few KB): the query, the gate and Phase 1 limit, the Coverage Set's
    weighted centroid (None: weight 0) and whether it has entries, the residual sub-query
    matrix, the session's blacklisted 6-gram hashes, the mode and how many ranked candidates
    each shard returns. It belongs to the interface, not to a backend: the window loop builds
    it and every `RankingIndex` (local or sharded) answers it."""

    query: np.ndarray  # float32 (d,) unit
    gate: float
    limit: int | None
    centroid: np.ndarray | None
    coverage_nonempty: bool
    residual: np.ndarray  # float32 (R, d)
    blacklist: np.ndarray  # uint64 (B,)
    mode: str
    top_k: int | None
    vectors: bool = True  # send the ranked rows' vectors back (the window loop needs none)


@runtime_checkable
class FactIndex(Protocol):
    """A read-only, consistent view of facts, their unit embeddings and 6-gram hashes.

    One object is one committed state: per-row arrays and row numbers agree with each other
    for its whole life, which is why a request takes one index and uses only it."""

    @property
    def model_id(self) -> str:
        """The embedding model every vector came from. Sessions record it and are refused by
        an index of another model: cosine across models is meaningless (spec §2.5)."""
        ...

    @property
    def dim(self) -> int:
        """Vector dimension, to check query vectors before any arithmetic."""
        ...

    @property
    def embedder(self) -> Embedder:
        """The model itself (loaded on first use), so queries, sub-queries and DPE paragraphs
        are embedded exactly as the facts were."""
        ...

    @property
    def path(self) -> Path | str:
        """Where the index lives (a directory, or an address), for messages and logs."""
        ...

    @property
    def generation(self) -> int:
        """Identity of the committed state: equal generations mean equal contents. Caches
        keyed by index (parsed sessions, n-gram counts) compare it instead of the data."""
        ...

    @property
    def n_rows(self) -> int:
        """Size of the row space: per-row arrays (importance, n-gram counts) have this length."""
        ...

    @property
    def active(self) -> np.ndarray:
        """bool (n_rows,): selectable rows. `active.any()` says whether CDR has anything to
        ground a document in (else `safety-only`, docs/design.md §3.10 "Headers")."""
        ...

    @property
    def importance(self) -> np.ndarray:
        """float32 (n_rows,): importance weight per row, the first factor of every score."""
        ...

    @property
    def token_counts(self) -> np.ndarray:
        """int32 (n_rows,): tokens per fact, for packing an envelope into its budget."""
        ...

    @property
    def ngram_offsets(self) -> np.ndarray:
        """int64 (n_rows + 1,): CSR offsets; row i's 6-gram hashes are
        `ngram_hashes[ngram_offsets[i]:ngram_offsets[i + 1]]`. Computed once at ingest, so
        the n-gram guard never re-tokenises facts (docs/design.md §2 "The math, and why it is
        cheap")."""
        ...

    @property
    def ngram_hashes(self) -> np.ndarray:
        """uint64: every row's distinct 6-gram hashes, concatenated in row order."""
        ...

    @property
    def ngram_index(self) -> NgramIndex:
        """The CSR above plus its inverted index (hash → rows), built once per state; a
        session's blacklist counts are bound to it."""
        ...

    def select(self, query_vector: Any, min_relevance: float,
               limit: int | None = None) -> Selection:
        """Phase 1: active rows with cosine(query, fact) ≥ `min_relevance`, best first, ties
        by row, at most `limit`. Must equal `select_rows` over the index's matrix."""
        ...

    def facts(self, rows: Iterable[int] | np.ndarray) -> Sequence[FactView]:
        """Text and metadata of `rows`, in the order given: only the few facts an envelope
        packs are ever read as objects."""
        ...

    def fact_ids(self, rows: Iterable[int] | np.ndarray) -> list[str]:
        """Stable fact ids of `rows` (content hashes): what sessions and traces keep, since
        rows may be renumbered by compaction."""
        ...

    def vectors(self, rows: Iterable[int] | np.ndarray) -> np.ndarray:
        """float32 (k, dim) unit vectors of `rows` (plans assign packed facts to sections)."""
        ...

    def stats(self) -> dict[str, Any]:
        """Counts and sizes for people and dashboards (`cdr ckf stats`, `/v1/ckf/stats`);
        at least `model_id`, `dim`, `generation`, `rows` and `active_facts`."""
        ...

    def close(self) -> None:
        """Release files and connections; the object is unusable afterwards."""
        ...


@runtime_checkable
class RankingIndex(Protocol):
    """Optional capability of a `FactIndex`: Phase 1 + Phase 2 ranked where the rows live.

    A sharded backend ranks on its shards and ships back only the best `top_k` candidates
    (rows, score components, vectors, token counts, ids) instead of every gated candidate's
    vector; the window loop uses it for the built-in cdr/relevance modes. The result must
    equal `rank()` over `select()` of one index holding all rows, truncated to `top_k`."""

    def rank_window(self, w: WindowQuery) -> tuple[Ranking, np.ndarray, np.ndarray, list[str]]:
        """(ranking of the best `w.top_k`, their float32 vectors — (k, 0) when `w.vectors` is
        false —, token counts, fact ids)."""
        ...


# ---------------------------------------------------------------------- Phase 1, shared


def check_gate(min_relevance: Any, limit: Any) -> tuple[float, int | None]:
    """The gate as a finite float and the limit as a non-negative int (or None)."""
    try:
        gate = float(min_relevance)
    except (TypeError, ValueError):
        raise InvalidInputError(f"min_relevance must be a number, got {min_relevance!r}") \
            from None
    if not np.isfinite(gate):
        raise InvalidInputError(f"min_relevance must be finite, got {min_relevance!r}")
    if limit is not None and (isinstance(limit, bool) or int(limit) != limit or limit < 0):
        raise InvalidInputError(f"limit must be a non-negative integer, got {limit!r}")
    return gate, None if limit is None else int(limit)


def select_rows(emb: np.ndarray, active: np.ndarray, q: np.ndarray, gate: float,
                limit: int | None, row_offset: int = 0,
                quantised: QuantisedRows | None = None) -> Selection:
    """Phase 1 over one matrix of unit rows (`q` a unit vector, checked by the caller).

    `row_offset` numbers the result's rows for a shard whose first row is not row 0.
    The scan itself is `cdr.retrieval.scan.gated_rows`: exact float32 BLAS, the float16 kernel, or
    `quantised` (an int8 copy of the first rows) + exact rescoring — the same gated set."""

    dim = int(q.shape[0])
    if len(emb) == 0 or limit == 0:
        return Selection.empty(dim)
    idx, rel = gated_rows(emb, q, gate, active, quantised)
    if limit is not None and len(idx) > limit:
        # Keep everything at or above the limit-th best relevance: rows tied with it must
        # compete by row number, not by where a partition happened to put them.
        kth = np.partition(rel, len(rel) - limit)[len(rel) - limit]
        near = rel >= kth
        idx, rel = idx[near], rel[near]
    order = np.lexsort((idx, -rel))[:limit]
    idx, rel = idx[order].astype(np.int64), rel[order].astype(np.float32)
    return Selection(idx + row_offset, rel, np.asarray(emb[idx], dtype=np.float32))


def merge_selections(parts: Sequence[Selection], limit: int | None, dim: int) -> Selection:
    """One selection from per-shard ones (rows already global and distinct): the best
    `limit` by relevance, ties by row — what one index over all the rows returns."""
    parts = [p for p in parts if len(p)]
    if not parts:
        return Selection.empty(dim)
    idx = np.concatenate([p.indices for p in parts])
    rel = np.concatenate([p.relevances for p in parts])
    order = np.lexsort((idx, -rel))
    if limit is not None:
        order = order[:limit]
    emb = np.concatenate([p.embeddings for p in parts])
    return Selection(idx[order], rel[order], emb[order])
