"""Session state across windows: Coverage Set, Residual Set, n-gram blacklist, exits (§3, §6, §7.2).

Readings of the spec (docs/design.md §3 "Answers to the spec's open questions") live here:
- depth of a sub-query in one window = min(words / expected_words, 0.90) (§3.2);
- cumulative depth = sum over windows, capped at 1; a sub-query leaves the Residual Set when its
  cumulative depth reaches `residual_exit_depth` (default 0.70) — 0.0 gives §7.2 literally;
- completeness = mean over sub-queries of min(cumulative / 0.90, 1);
- the four exits in the spec's priority order, with an empty envelope counting as exhaustion.

Sub-query embeddings are computed once, when the session starts, with the CKF's model; every
update states which model produced its vectors and a different id is refused (§2.5).
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import numpy as np

from cdr.citations.sources import SourceEntry
from cdr.coverage import CoverageSet, ResidualSet, SubQuery, check_depth
from cdr.errors import EmbeddingModelMismatchError, InvalidInputError, parse_json_object
from cdr.fact_memory import FactMemory
from cdr.ngrams import NgramBlacklist, NgramIndex
from cdr.options import DEFAULTS, MAX_WINDOWS_LIMIT, SessionOptions
from cdr.ranking import CDR_MIN_RELEVANCE, DEFAULT_RANKING, check_mode
from cdr.vectors import from_b64, to_b64, unit_matrix, unit_vector

COMPLETION_THRESHOLD = 0.92
THOROUGH_DEPTH = 0.90
DEFAULT_RESIDUAL_EXIT_DEPTH = 0.70
DEFAULT_MAX_WINDOWS = DEFAULTS.max_windows  # the user's option (cdr.options.RunOptions)
SAFETY_BUDGET_FLOOR = 0.10
# The length contract's tolerance (`length: "contract"`, cdr.window.length): a document within
# ±15% of the words asked keeps it.
LENGTH_TOLERANCE = 0.15
EXHAUSTION_RATIO = 0.15
SCHEMA_VERSION = 1

# Run statuses: a session is in progress until one of the four exits of §6 fires (in this
# priority order); a run can also stop on its writer's upstream failure, or (CLI) on another
# error. Traces, headers and the gateway all use these names.
IN_PROGRESS = "in-progress"
TASK_COMPLETE = "task-complete"
LIMIT_REACHED = "limit-reached"
CKF_EXHAUSTED = "ckf-exhausted"
SAFETY_BUDGET_DEPLETED = "safety-budget-depleted"
UPSTREAM_ERROR = "upstream-error"
RUN_FAILED = "error"
CANCELLED = "cancelled"  # the gateway's client disconnected from a non-streamed run
EXIT_REASONS = (TASK_COMPLETE, LIMIT_REACHED, CKF_EXHAUSTED, SAFETY_BUDGET_DEPLETED)
RUN_STATUSES = (IN_PROGRESS, *EXIT_REASONS, UPSTREAM_ERROR, RUN_FAILED, CANCELLED)


def depth_from_words(words: int, expected_words: int) -> float:
    """§3.2 by word-count ratio: 280/300 → 0.90, 60/300 → 0.20."""
    if expected_words <= 0:
        raise InvalidInputError(f"expected_words must be positive, got {expected_words}")
    return min(max(words, 0) / expected_words, THOROUGH_DEPTH)



def contract_met(asked: int, delivered: int, tolerance: float = LENGTH_TOLERANCE) -> bool:
    """Whether a run under the length contract has delivered enough to stop: at least
    (1 − tolerance) of the words asked (it cannot un-write a window that ran long, so above the
    band also stops). Exact: ⌈asked · (1 − tolerance)⌉ in rationals, so 1,700 of 2,000 stops."""
    if asked < 1:
        raise InvalidInputError(f"words asked must be positive, got {asked}")
    floor = math.ceil(asked * (1 - Fraction(tolerance).limit_denominator(10**6)))
    return delivered >= floor


def exit_reason(
    *,
    completeness: float,
    residual_empty: bool,
    window_count: int,
    max_windows: int,
    mean_novelty_ratio: float | None,
    safety_budget: float,
    completion_threshold: float = COMPLETION_THRESHOLD,
) -> str | None:
    """The four exits of §6 in priority order; None while the loop should go on.

    `mean_novelty_ratio` is None when the window's envelope was empty: nothing novel was left,
    which is CKF exhaustion (docs/design.md §3.7 "Novelty ratio").
    """
    if completeness >= completion_threshold and residual_empty:
        return TASK_COMPLETE
    if window_count >= max_windows:
        return LIMIT_REACHED
    if mean_novelty_ratio is None or mean_novelty_ratio < EXHAUSTION_RATIO:
        return CKF_EXHAUSTED
    if safety_budget <= SAFETY_BUDGET_FLOOR:
        return SAFETY_BUDGET_DEPLETED
    return None


@dataclass
class WindowRecord:
    """What one window did to the session (kept for traces and the optional backward summary)."""

    number: int
    addressed: dict[str, float]
    completeness: float
    residual: list[str]
    summary: str = ""


@dataclass
class Session:
    """All state CDR needs between windows. Build with `Session.start`."""

    task: str
    model_id: str
    dim: int
    sub_queries: list[SubQuery]
    sub_query_embeddings: np.ndarray
    query_vector: np.ndarray
    coverage: CoverageSet
    blacklist: NgramBlacklist
    cumulative_depth: dict[str, float]
    residual_ids: list[str]
    window_count: int = 0
    max_windows: int = DEFAULT_MAX_WINDOWS
    safety_budget: float = 1.0
    min_relevance: float = CDR_MIN_RELEVANCE
    residual_exit_depth: float = DEFAULT_RESIDUAL_EXIT_DEPTH
    ranking: str = DEFAULT_RANKING
    status: str = IN_PROGRESS
    history: list[WindowRecord] = field(default_factory=list)
    # Opt-in rules beyond the spec (`cdr.options`); the defaults are the spec.
    options: SessionOptions = field(default_factory=SessionOptions)
    fact_memory: FactMemory = field(default_factory=FactMemory)
    expanded_embeddings: np.ndarray | None = None  # `queries: "expanded"` (cdr.retrieval.expansion)
    # Sub-query id → the last words written for it (`DpeReport.section_ends`): a window that
    # continues a begun section is shown where it stopped (docs/design.md §3.15 "Continued
    # sections").
    section_ends: dict[str, str] = field(default_factory=dict)
    # `repeats: "drop"` (cdr.window.repeat_guard): unit vectors of the sentences earlier windows
    # kept, which a later window's sentences are compared with. Stored as float16: a cosine ≥ 0.70
    # decision does not need float32's digits, and the session stays small.
    written_vectors: np.ndarray | None = None
    # `length: "contract"` (cdr.window.length): the words the windows delivered, and the sub-queries
    # a window wrote whole (planned in full, written, not cut off), which are not planned again.
    words_written: int = 0
    finished_ids: list[str] = field(default_factory=list)
    # `citations` on (cdr.citations): each cited fact's entry in the sources list, in number
    # order (its number is its place + 1), so a resumed session or another replica numbers
    # the next window's citations on from the same point.
    cited_sources: list[SourceEntry] = field(default_factory=list)
    _residual_cache: ResidualSet | None = field(default=None, repr=False, compare=False)

    @classmethod
    def start(
        cls,
        task: str,
        sub_queries: list[SubQuery],
        sub_query_embeddings: object,
        query_vector: object,
        model_id: str,
        *,
        max_windows: int = DEFAULT_MAX_WINDOWS,
        min_relevance: float = CDR_MIN_RELEVANCE,
        residual_exit_depth: float = DEFAULT_RESIDUAL_EXIT_DEPTH,
        ranking: str = DEFAULT_RANKING,
        ngram_index: NgramIndex | None = None,
        options: SessionOptions | None = None,
        expanded_embeddings: object | None = None,
    ) -> Session:
        if not task or not task.strip():
            raise InvalidInputError("task is empty")
        if not sub_queries:
            raise InvalidInputError("the task decomposition has no sub-queries")
        ids = [sq.id for sq in sub_queries]
        if len(set(ids)) != len(ids):
            raise InvalidInputError(f"sub-query ids are not unique: {ids}")
        if not 1 <= max_windows <= MAX_WINDOWS_LIMIT:
            raise InvalidInputError(
                f"max_windows must be within 1..{MAX_WINDOWS_LIMIT}, got {max_windows}"
            )
        check_mode(ranking)
        check_depth(residual_exit_depth)
        q = unit_vector(query_vector, "query vector")
        emb = unit_matrix(sub_query_embeddings, "sub-query embeddings", q.shape[0])
        if emb.shape[0] != len(sub_queries):
            raise InvalidInputError(
                f"{len(sub_queries)} sub-queries but {emb.shape[0]} sub-query embeddings"
            )
        expanded = (None if expanded_embeddings is None else
                    unit_matrix(expanded_embeddings, "expanded sub-query embeddings", q.shape[0]))
        if expanded is not None and expanded.shape != emb.shape:
            raise InvalidInputError(
                f"{emb.shape[0]} sub-queries but {expanded.shape[0]} expanded embeddings")
        return cls(
            task=task.strip(),
            model_id=model_id,
            dim=q.shape[0],
            sub_queries=list(sub_queries),
            sub_query_embeddings=emb,
            query_vector=q,
            coverage=CoverageSet(q.shape[0]),
            blacklist=NgramBlacklist(ngram_index),
            cumulative_depth=dict.fromkeys(ids, 0.0),
            residual_ids=ids,
            max_windows=max_windows,
            min_relevance=float(min_relevance),
            residual_exit_depth=float(residual_exit_depth),
            ranking=ranking,
            options=options or SessionOptions(),
            expanded_embeddings=expanded,
        )

    # -- views -------------------------------------------------------------------------------

    def sub_query(self, sq_id: str) -> SubQuery:
        for sq in self.sub_queries:
            if sq.id == sq_id:
                return sq
        raise InvalidInputError(f"unknown sub-query id {sq_id!r}; known: {self.sub_query_ids}")

    @property
    def sub_query_ids(self) -> list[str]:
        return [sq.id for sq in self.sub_queries]

    @property
    def target_embeddings(self) -> np.ndarray:
        """The sub-queries' vectors for residual pull, the plan and Stage 8: the expansion
        when the session has one (`queries: "expanded"`), else the titles' (the spec)."""
        if self.expanded_embeddings is not None:
            return self.expanded_embeddings
        return self.sub_query_embeddings

    @property
    def residual(self) -> ResidualSet:
        """The Residual Set with its embeddings stacked (cached until the next update)."""
        if self._residual_cache is None or self._residual_cache.ids != self.residual_ids:
            pos = [self.sub_query_ids.index(i) for i in self.residual_ids]
            self._residual_cache = ResidualSet(
                [self.sub_queries[p] for p in pos],
                self.target_embeddings[pos] if pos else np.zeros((0, self.dim), np.float32),
                self.dim,
            )
        return self._residual_cache

    @property
    def residual_sub_queries(self) -> list[SubQuery]:
        return self.residual.sub_queries

    @property
    def citation_numbers(self) -> dict[str, int]:
        """Each cited fact's number in the document (`cited_sources`)."""
        return {e.fact_id: e.number for e in self.cited_sources}

    def completeness(self) -> float:
        """Mean over sub-queries of min(cumulative depth / 0.90, 1) (docs/design.md §3.6
        "Completeness")."""
        vals = [min(self.cumulative_depth[i] / THOROUGH_DEPTH, 1.0) for i in self.sub_query_ids]
        return float(np.mean(vals))

    # -- the update of §7.2 ------------------------------------------------------------------

    def update_after_window(
        self,
        addressed: Mapping[str, float],
        window_output: str,
        *,
        embedding_model_id: str,
        summary: str = "",
        section_ends: Mapping[str, str] | None = None,
        finished: Sequence[str] = (),
    ) -> WindowRecord:
        """Coverage entries, cumulative residual, blacklist and window count, after a window.

        `addressed` maps sub-query ids to this window's depth. The coverage entry uses the
        sub-query embedding made at session start (same text, same model: re-embedding would
        give the same vector at a model call's cost); `embedding_model_id` must still match.
        `finished` (the length contract) names sub-queries this window wrote whole.
        """
        if embedding_model_id != self.model_id:
            raise EmbeddingModelMismatchError(self.model_id, embedding_model_id, "coverage update")
        depths = {sq_id: check_depth(d) for sq_id, d in addressed.items()}
        ends = dict(section_ends or {})
        for sq_id in [*depths, *ends, *finished]:
            self.sub_query(sq_id)  # unknown ids are an error, before anything changes
        number = self.window_count + 1
        for sq_id, depth in depths.items():
            pos = self.sub_query_ids.index(sq_id)
            self.coverage.add(self.sub_query_embeddings[pos], depth, number)
            self.cumulative_depth[sq_id] = min(self.cumulative_depth[sq_id] + depth, 1.0)
        self.residual_ids = [
            i for i in self.residual_ids
            if not (i in depths and self.cumulative_depth[i] >= self.residual_exit_depth)
        ]
        self.blacklist.add_text(window_output)
        self.section_ends.update(ends)
        if self.options.length == "contract":
            self.words_written += len(window_output.split())
            self.finished_ids += [i for i in dict.fromkeys(finished) if i not in self.finished_ids]
        self.window_count = number
        record = WindowRecord(number, depths, self.completeness(), list(self.residual_ids), summary)
        self.history.append(record)
        return record

    def remember_written(self, vectors: np.ndarray | None) -> None:
        """Add a window's kept sentences (`repeats: "drop"`) at the precision they are stored
        in, so a session resumed from storage decides exactly as the one kept in memory."""
        if vectors is None or not len(vectors):
            return
        rows = np.asarray(vectors, np.float32).astype(np.float16).astype(np.float32)
        before = self.written_vectors
        self.written_vectors = rows if before is None else np.concatenate([before, rows])

    def spend_safety(self, amount: float) -> None:
        """A SafetyCheck's verdict for one window (SPEC-012 §2.3): budget never below 0."""
        if not np.isfinite(amount) or amount < 0:
            raise InvalidInputError(f"safety spend must be a non-negative number, got {amount}")
        self.safety_budget = max(0.0, self.safety_budget - float(amount))

    @property
    def words_asked(self) -> int:
        """The words asked: the sub-queries' expected words, which split `words` exactly."""
        return int(sum(sq.expected_words for sq in self.sub_queries))

    def exit_reason(self, mean_novelty_ratio: float | None) -> str | None:
        """The spec's exits; with the length contract (`contract_met`) the run is
        also complete once the words delivered reach the band of the words asked."""
        if self.options.length == "contract" and contract_met(self.words_asked,
                                                                self.words_written):
            return TASK_COMPLETE
        return exit_reason(
            completeness=self.completeness(),
            residual_empty=not self.residual_ids,
            window_count=self.window_count,
            max_windows=self.max_windows,
            mean_novelty_ratio=mean_novelty_ratio,
            safety_budget=self.safety_budget,
        )

    @property
    def remembers_facts(self) -> bool:
        """Whether the session keeps which facts it sent (`cdr.fact_memory`): for fact memory's
        weights, or for the stop on stale envelopes (`cdr.window.stale`)."""
        return self.options.memory == "facts" or self.options.stale == "stop"

    def backward_summary(self) -> str:
        """SPEC-004's backward-looking summary, kept available but off by default (§4.3)."""
        return " ".join(f"Window {r.number}: {r.summary}" for r in self.history if r.summary)

    # -- (de)serialisation -------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """The stored form. Option keys appear only when an option is on, so a spec session
        stores exactly what it did before the options existed."""
        extra: dict[str, Any] = {}
        if not self.options.is_default:
            extra["options"] = self.options.to_dict()
        if self.remembers_facts:
            extra["fact_memory"] = self.fact_memory.to_dict()
        if self.section_ends:
            extra["section_ends"] = dict(self.section_ends)
        if self.expanded_embeddings is not None:
            extra["expanded_embeddings"] = to_b64(self.expanded_embeddings.astype(np.float32))
        if self.options.length == "contract":
            extra["words_written"] = self.words_written
            extra["finished_ids"] = list(self.finished_ids)
        if self.cited_sources:
            extra["cited_sources"] = [e.to_dict() for e in self.cited_sources]
        if self.written_vectors is not None and len(self.written_vectors):
            extra["written_vectors"] = to_b64(self.written_vectors.astype(np.float16))
        return {
            **extra,
            "schema": SCHEMA_VERSION,
            "task": self.task,
            "model_id": self.model_id,
            "dim": self.dim,
            "sub_queries": [sq.to_dict() for sq in self.sub_queries],
            "sub_query_embeddings": to_b64(self.sub_query_embeddings.astype(np.float32)),
            "query_vector": to_b64(self.query_vector.astype(np.float32)),
            "coverage": self.coverage.to_dict(),
            "blacklist": to_b64(self.blacklist.as_array()),
            "cumulative_depth": dict(self.cumulative_depth),
            "residual_ids": list(self.residual_ids),
            "window_count": self.window_count,
            "max_windows": self.max_windows,
            "safety_budget": self.safety_budget,
            "min_relevance": self.min_relevance,
            "residual_exit_depth": self.residual_exit_depth,
            "ranking": self.ranking,
            "status": self.status,
            "history": [
                {"number": r.number, "addressed": r.addressed, "completeness": r.completeness,
                 "residual": r.residual, "summary": r.summary}
                for r in self.history
            ],
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], ngram_index: NgramIndex | None = None) -> Session:
        if data.get("schema") != SCHEMA_VERSION:
            raise InvalidInputError(f"unsupported session schema {data.get('schema')!r}")
        dim = int(data["dim"])
        sqs = [SubQuery.from_dict(s) for s in data["sub_queries"]]
        coverage = CoverageSet.from_dict(dim, data["coverage"])
        blacklist = NgramBlacklist(ngram_index, from_b64(data["blacklist"], np.uint64))
        return cls(
            task=data["task"],
            model_id=data["model_id"],
            dim=dim,
            sub_queries=sqs,
            sub_query_embeddings=from_b64(data["sub_query_embeddings"], np.float32,
                                          (len(sqs), dim)),
            query_vector=from_b64(data["query_vector"], np.float32, (dim,)),
            coverage=coverage,
            blacklist=blacklist,
            cumulative_depth={k: float(v) for k, v in data["cumulative_depth"].items()},
            residual_ids=list(data["residual_ids"]),
            window_count=int(data["window_count"]),
            max_windows=int(data["max_windows"]),
            safety_budget=float(data["safety_budget"]),
            min_relevance=float(data["min_relevance"]),
            residual_exit_depth=float(data["residual_exit_depth"]),
            ranking=data["ranking"],
            status=data["status"],
            history=[WindowRecord(**r) for r in data["history"]],
            options=SessionOptions.from_dict(data.get("options")),
            fact_memory=FactMemory.from_dict(data.get("fact_memory")),
            expanded_embeddings=(
                from_b64(data["expanded_embeddings"], np.float32, (len(sqs), dim))
                if "expanded_embeddings" in data else None),
            section_ends=_section_ends(data.get("section_ends"), {sq.id for sq in sqs}),
            written_vectors=_written_vectors(data.get("written_vectors"), dim),
            words_written=_non_negative(data.get("words_written", 0), "words_written"),
            finished_ids=_known_ids(data.get("finished_ids", []), {sq.id for sq in sqs}),
            cited_sources=_cited_sources(data.get("cited_sources", [])),
        )

    @classmethod
    def from_json(cls, text: str, ngram_index: NgramIndex | None = None) -> Session:
        return cls.from_dict(parse_json_object(text, "session JSON"), ngram_index)


def _non_negative(raw: Any, name: str) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < 0:
        raise InvalidInputError(f"session {name} must be a non-negative integer, got {raw!r}")
    return raw


def _cited_sources(raw: Any) -> list[SourceEntry]:
    """The stored `cited_sources`, checked: numbered 1…N in order."""
    if not isinstance(raw, list) or not all(isinstance(e, Mapping) for e in raw):
        raise InvalidInputError("session cited_sources must be a list of objects")
    try:
        entries = [SourceEntry.from_dict(e) for e in raw]
    except (KeyError, TypeError, ValueError) as exc:
        raise InvalidInputError(f"session cited_sources are damaged: {exc!r}") from None
    if [e.number for e in entries] != list(range(1, len(entries) + 1)):
        raise InvalidInputError("session cited_sources must be numbered 1…N in order")
    return entries


def _known_ids(raw: Any, ids: set[str]) -> list[str]:
    """The stored `finished_ids`, checked: known sub-query ids only."""
    if not isinstance(raw, list) or not all(isinstance(i, str) for i in raw):
        raise InvalidInputError("session finished_ids must be a list of sub-query ids")
    unknown = sorted(set(raw) - ids)
    if unknown:
        raise InvalidInputError(f"session finished_ids name unknown sub-queries {unknown}")
    return list(raw)


def _written_vectors(raw: Any, dim: int) -> np.ndarray | None:
    """The stored `written_vectors` (float16 rows of `dim`), checked."""
    if raw is None:
        return None
    if not isinstance(raw, str):
        raise InvalidInputError("session written_vectors must be a base64 string")
    try:
        flat = np.frombuffer(base64.b64decode(raw, validate=True), np.float16)
    except (ValueError, binascii.Error) as exc:
        raise InvalidInputError(f"session written_vectors are damaged: {exc}") from None
    if flat.size % dim:
        raise InvalidInputError(f"session written_vectors hold {flat.size} values, "
                                f"not a multiple of the dimension {dim}")
    return flat.reshape(-1, dim).astype(np.float32)


def _section_ends(raw: Any, ids: set[str]) -> dict[str, str]:
    """The stored `section_ends`, checked: text for known sub-queries only."""
    if raw is None:
        return {}
    if not isinstance(raw, Mapping) or not all(
            isinstance(k, str) and k in ids and isinstance(v, str) for k, v in raw.items()):
        raise InvalidInputError("session section_ends must map known sub-query ids to text")
    return dict(raw)
