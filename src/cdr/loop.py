"""The window loop (CRP-SPEC-024 §2–§7): select, rank, pack, write, verify, update, stop.

`Generator` holds what a run needs (CKF, embedder, writer, settings) and exposes the loop in
steps — `start`, `prepare`, `complete` — so that the CLI, the gateway's sidecar API (which lets
the client write the window itself) and `run` (which yields one `WindowEvent` per window for
progress bars, traces and SSE) all go through the same code.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

import numpy as np

from cdr.coverage import SubQuery
from cdr.dpe import (
    DEFAULT_ATTRIBUTION_THRESHOLD,
    DEFAULT_TOTAL_WORDS,
    DpeReport,
    decompose_from_facts,
    llm_outline_prompt,
    parse_outline,
    split_paragraphs,
    task_topic,
    verify_window,
)
from cdr.envelope import (
    DEFAULT_CONTEXT_TOKENS,
        DEFAULT_GENERATION_TOKENS,
    DEFAULT_SYSTEM_PROMPT,
    Envelope,
    make_budget,
    pack,
    residual_anchor,
)
from cdr.errors import CdrError, InvalidInputError, UpstreamError
from cdr.factindex import FactIndex
from cdr.headers import window_headers
from cdr.prompt import PlanSection, build_user_prompt
from cdr.ranking import DEFAULT_MMR_LAMBDA, Ranking, rank
from cdr.session import DEFAULT_MAX_WINDOWS, IN_PROGRESS, Session
from cdr.vectors import normalize
from cdr.writers.base import Writer, WriterResult

# The spec's 0.55 gate assumes a large embedding model; all-MiniLM-L6-v2's similarities run
# lower. Measured on the Python docs (README "Calibration"): 0.40 keeps on-topic material and
# sits above the 99th percentile of off-topic similarity.
MODEL_GATES = {"sentence-transformers/all-MiniLM-L6-v2": 0.40}
SPEC_GATE = 0.55
DEFAULT_SUB_QUERIES = 6
DECOMPOSITION_POOL = 300
PHASE1_LIMIT = 4000


def default_min_relevance(model_id: str) -> float:
    return MODEL_GATES.get(model_id, SPEC_GATE)


class EmptyKnowledgeBaseError(CdrError):
    """The CKF has no active facts: CDR has nothing to ground the windows in."""

    headers: ClassVar[dict[str, str]] = {
        "CRP-Context-Mode": "safety-only",
        "CRP-Onboarding-Hint": "ingest-documents-for-context-grounding",
    }


class Ranker(Protocol):
    """A Phase 2 replacement (e.g. a benchmark's baseline): ranks Phase 1's selection.

    It receives the gated selection (`indices`, `relevances`, `embeddings`) and the per-row
    importance and n-gram counts, and returns a `Ranking` whose `indices` are CKF rows.
    """

    def __call__(
        self, session: Session, selection: Any, importance: np.ndarray,
        ngram_counts: np.ndarray | None,
    ) -> Ranking: ...


class SafetyCheck(Protocol):
    """SPEC-012 §2.3 hook: how much safety budget a window's text spends (0 = nothing)."""

    def __call__(self, window_number: int, text: str) -> float: ...


@dataclass
class GenerationConfig:
    max_windows: int = DEFAULT_MAX_WINDOWS
    words: int = DEFAULT_TOTAL_WORDS
    sub_queries: int = DEFAULT_SUB_QUERIES  # for automatic decomposition
    ranking: str = "cdr"
    min_relevance: float | None = None  # None: the embedding model's calibrated gate
    mmr_lambda: float = DEFAULT_MMR_LAMBDA
    context_tokens: int = DEFAULT_CONTEXT_TOKENS
    generation_tokens: int = DEFAULT_GENERATION_TOKENS
    system_prompt: str = DEFAULT_SYSTEM_PROMPT
    residual_exit_depth: float = 0.70
    attribution_threshold: float = DEFAULT_ATTRIBUTION_THRESHOLD
    backward_summary: bool = False
    max_envelope_facts: int | None = None
    # None: every packed fact goes under its closest remaining section, however far. A value
    # keeps a fact out of the plan unless its cosine to that section reaches it.
    plan_min_similarity: float | None = None
    safety_check: SafetyCheck | None = None
    ranker: Ranker | None = None  # replaces the built-in modes when set


@dataclass
class PreparedWindow:
    """A window's envelope and prompt, before anything is written."""

    number: int
    envelope: Envelope
    rows: np.ndarray  # CKF rows of the packed facts, in layout order
    facts: list[Any]  # CKF facts, in layout order
    plan: list[PlanSection]
    messages: list[dict[str, str]]
    coverage_depth: int
    max_tokens: int


@dataclass
class WindowEvent:
    """One finished window: what went in, what came out, what changed, what the headers say."""

    number: int
    prepared: PreparedWindow
    output: str
    report: DpeReport
    completeness: float
    residual: list[str]
    headers: dict[str, str]
    status: str
    finish_reason: str = "stop"
    usage: dict[str, int] = field(default_factory=dict)
    error: str | None = None
    seconds: float = 0.0

    @property
    def done(self) -> bool:
        return self.status != IN_PROGRESS


class Generator:
    """Binds a CKF, its embedder, a writer and the settings; runs windows for a task."""

    def __init__(self, ckf: FactIndex, writer: Writer, config: GenerationConfig | None = None
                 ) -> None:
        self.ckf = ckf
        self.embedder = ckf.embedder
        self.writer = writer
        self.config = config or GenerationConfig()
        cfg = self.config
        if not 1 <= cfg.max_windows <= 20:
            raise InvalidInputError(f"windows must be within 1..20, got {cfg.max_windows}")
        if cfg.words < 1:
            raise InvalidInputError(f"words must be positive, got {cfg.words}")

    @property
    def min_relevance(self) -> float:
        mr = self.config.min_relevance
        return default_min_relevance(self.ckf.model_id) if mr is None else float(mr)

    # -- start -----------------------------------------------------------------------------

    def decompose(self, task: str, outline: str | None = None) -> list[SubQuery]:
        """Sub-queries from an outline, else from the LLM writer, else from the CKF."""
        cfg = self.config
        if outline is not None:
            return parse_outline(outline, cfg.words)
        if self.writer.name != "extractive":
            result = self.writer.generate(llm_outline_prompt(task, cfg.sub_queries), 300)
            lines = [x for x in result.text.splitlines() if x.strip()][: cfg.sub_queries * 2]
            if lines:
                return parse_outline("\n".join(lines), cfg.words)
        topic_vec = self.embedder.encode([task_topic(task)])[0]
        sel = self.ckf.select(topic_vec, self.min_relevance * 0.75, DECOMPOSITION_POOL)
        if len(sel.indices) == 0:
            raise InvalidInputError(
                f"nothing in the CKF is relevant to {task!r}; give an outline (--outline) or "
                "ingest documents about it"
            )
        sections = [f.section or f.source for f in self.ckf.facts(sel.indices)]
        return decompose_from_facts(sel.embeddings, sections, cfg.sub_queries, cfg.words)

    def start(
        self,
        task: str,
        outline: str | None = None,
        sub_queries: Sequence[SubQuery] | None = None,
    ) -> Session:
        if not task or not task.strip():
            raise InvalidInputError("task is empty")
        if not self.ckf.active.any():
            raise EmptyKnowledgeBaseError(
                f"the CKF at {self.ckf.path} has no active facts: nothing to ground the "
                "document in; ingest documents first (cdr ingest PATH --ckf DIR)"
            )
        sqs = list(sub_queries) if sub_queries else self.decompose(task, outline)
        vecs = self.embedder.encode([task_topic(task)] + [sq.text for sq in sqs])
        topic, sq_emb = vecs[0], vecs[1:]
        centroid = normalize(sq_emb.mean(axis=0), "sub-query centroid")
        query = normalize(topic + centroid, "query")  # DESIGN.md §3.11
        return Session.start(
            task, sqs, sq_emb, query, self.embedder.model_id,
            max_windows=self.config.max_windows, min_relevance=self.min_relevance,
            residual_exit_depth=self.config.residual_exit_depth, ranking=self.config.ranking,
            ngram_index=self.ckf.ngram_index,
        )

    # -- one window --------------------------------------------------------------------------

    def _plan_sub_queries(self, session: Session) -> list[SubQuery]:
        if session.residual_ids:
            return session.residual_sub_queries
        unfinished = [sq for sq in session.sub_queries if session.cumulative_depth[sq.id] < 0.9]
        return unfinished or list(session.sub_queries)

    def prepare(self, session: Session) -> PreparedWindow:
        """Phase 1 select, Phase 2 rank, Phase 3 pack, plan and prompt for the next window."""
        cfg = self.config
        sel = self.ckf.select(session.query_vector, session.min_relevance, PHASE1_LIMIT)
        counts = session.blacklist.counts
        importance = self.ckf.importance[sel.indices]
        sel_counts = counts[sel.indices] if len(counts) else None
        if cfg.ranker is not None:
            ranking = cfg.ranker(session, sel, importance, sel_counts)
        else:
            ranking = rank(
                sel.embeddings, sel.relevances, importance=importance, ngram_counts=sel_counts,
                coverage=session.coverage, residual=session.residual,
                mode=session.ranking, min_relevance=session.min_relevance,
                mmr_lambda=cfg.mmr_lambda, rows=sel.indices,
            )
        plan_sqs = self._plan_sub_queries(session)
        anchor = residual_anchor(session.residual_sub_queries)
        task_text = f"Task: {session.task}\n{anchor}"
        if cfg.backward_summary:
            task_text += "\n" + session.backward_summary()
        budget = make_budget(cfg.context_tokens, cfg.system_prompt, task_text,
                             cfg.generation_tokens)
        envelope = pack(ranking, self.ckf.fact_ids, self.ckf.token_counts[ranking.indices],
                        budget, anchor, cfg.max_envelope_facts)
        packed_rows = envelope.ranking.indices
        facts = self.ckf.facts(packed_rows)
        plan = self._plan(session, plan_sqs, packed_rows, envelope)
        refs = [(f"F{i + 1}", f.section or f.source, f.content) for i, f in enumerate(facts)]
        user = build_user_prompt(session.task, anchor, plan, refs,
                                 session.backward_summary() if cfg.backward_summary else "")
        messages = [{"role": "system", "content": cfg.system_prompt},
                    {"role": "user", "content": user}]
        envelope.messages = messages
        return PreparedWindow(session.window_count + 1, envelope, packed_rows, facts, plan,
                              messages, len(session.coverage), cfg.generation_tokens)

    def _plan(
        self, session: Session, plan_sqs: list[SubQuery], rows: np.ndarray, envelope: Envelope
    ) -> list[PlanSection]:
        """Each packed fact goes to its closest planned sub-query; sections keep the residual
        order, facts within a section keep ranking order (best first)."""
        if not len(rows) or not plan_sqs:
            return []
        pos = [session.sub_query_ids.index(sq.id) for sq in plan_sqs]
        sims = self.ckf.vectors(rows) @ session.sub_query_embeddings[pos].T
        owner = np.argmax(sims, axis=1)
        if self.config.plan_min_similarity is not None:
            owner[sims[np.arange(len(rows)), owner] < self.config.plan_min_similarity] = -1
        by_score = np.argsort(-envelope.ranking.score, kind="stable")
        plan = []
        for j, sq in enumerate(plan_sqs):
            refs = tuple(f"F{i + 1}" for i in by_score if owner[i] == j)
            if refs:
                done = session.cumulative_depth[sq.id]
                target = max(round(sq.expected_words * (1.0 - min(done, 1.0))), 40)
                plan.append(PlanSection(sq.text, target, refs))
        return plan

    def verify(self, session: Session, text: str) -> DpeReport:
        """DPE Stage 8 on a window's text, with the CKF's embedding model."""
        paragraphs = split_paragraphs(text)
        emb = (
            self.embedder.encode([p for _, p in paragraphs])
            if paragraphs
            else np.zeros((0, session.dim), np.float32)
        )
        fresh = [session.blacklist.fresh_share(p) for _, p in paragraphs]
        return verify_window(text, session.sub_queries, session.sub_query_embeddings, emb,
                             paragraphs, self.config.attribution_threshold, fresh)

    def complete(
        self,
        session: Session,
        prepared: PreparedWindow,
        text: str,
        *,
        result: WriterResult | None = None,
        error: str | None = None,
        seconds: float = 0.0,
    ) -> WindowEvent:
        """Verify the window's text, update the session (§7.2), apply the exits (§6)."""
        report = self.verify(session, text)
        summary = " ".join(text.split()[:40])
        session.update_after_window(report.addressed, text,
                                    embedding_model_id=self.embedder.model_id, summary=summary)
        if self.config.safety_check is not None:
            session.spend_safety(self.config.safety_check(prepared.number, text))
        env = prepared.envelope
        reason = session.exit_reason(env.mean_novelty_ratio)
        if error is not None:
            reason = "upstream-error"
        session.status = reason or IN_PROGRESS
        headers = window_headers(session, prepared, env)
        return WindowEvent(
            prepared.number, prepared, text, report, session.completeness(),
            list(session.residual_ids), headers, session.status,
            result.finish_reason if result else "stop", dict(result.usage) if result else {},
            error, seconds,
        )

    def write(self, prepared: PreparedWindow, on_delta: Callable[[str], None] | None = None
              ) -> WriterResult:
        return self.writer.generate(prepared.messages, prepared.max_tokens, on_delta=on_delta)

    # -- the whole loop ----------------------------------------------------------------------

    def run(
        self,
        task: str,
        outline: str | None = None,
        *,
        session: Session | None = None,
        on_delta: Callable[[int, str], None] | None = None,
    ) -> Iterator[WindowEvent]:
        """Windows until an exit rule fires; one event per window."""
        session = session or self.start(task, outline)
        while True:
            t0 = time.perf_counter()
            prepared = self.prepare(session)
            if len(prepared.envelope) == 0:
                # Nothing relevant and novel is left: do not ask for ungrounded text.
                event = self.complete(session, prepared, "", seconds=time.perf_counter() - t0)
                yield event
                return
            delta = (lambda piece, n=prepared.number: on_delta(n, piece)) if on_delta else None
            try:
                result = self.write(prepared, delta)
                text, error = result.text, None
            except UpstreamError as exc:
                result, error = None, str(exc)
                text = getattr(exc, "partial_text", "") or ""
            event = self.complete(session, prepared, text, result=result, error=error,
                                  seconds=time.perf_counter() - t0)
            yield event
            if event.done:
                return
