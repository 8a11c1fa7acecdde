"""The window loop (CRP-SPEC-024 §2–§7): select, rank, pack, write, verify, update, stop.

`Generator` holds what a run needs (CKF, embedder, writer, settings). `Generator.step` is the
one window step — prepare, empty-envelope check, write (streaming), keep partial text on an
upstream failure, verify, update, headers, exit — and everything that runs windows loops over
it: `run` (the CLI, the demo), the gateway's relay and the quality benchmark. When the writer
is outside (the gateway's sidecar API: the client's own LLM writes the window), the same step
is split in two: `prepare` (+ `close_if_empty`) hands out the envelope, `complete` takes the
text back.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

import numpy as np

from cdr.citations import Citer, WindowCitations
from cdr.coverage import SubQuery
from cdr.errors import CdrError, InvalidInputError, UpstreamError
from cdr.fact_memory import apply_memory, written_rows
from cdr.options import DEFAULTS, MAX_WINDOWS_LIMIT, SessionOptions
from cdr.ranking import ONE_PASS_MODES, Ranking, rank
from cdr.retrieval.doc_support import (
    SupportedIndex,
    content_sizes,
    document_codes,
    section_pages,
)
from cdr.retrieval.expansion import (
    expand_sub_queries,
    widened_selection,
    widened_weights,
)
from cdr.retrieval.factindex import FactIndex, RankingIndex, Selection, WindowQuery
from cdr.retrieval.gates import calibrated_gate
from cdr.retrieval.lexical import FusedIndex, lexical_index, session_terms
from cdr.retrieval.navigation import ContentIndex, content_rows, navigation_rows
from cdr.retrieval.subject import sub_query_texts, subject_of, task_topic
from cdr.rules import shards_can_rank
from cdr.session import (
    CKF_EXHAUSTED,
    EXHAUSTION_RATIO,
    IN_PROGRESS,
    UPSTREAM_ERROR,
    Session,
)
from cdr.text.kept_stream import KeptStream
from cdr.text.prompt_format import PlanSection
from cdr.text.self_repeat import REPETITION
from cdr.text.tokens import count_tokens
from cdr.vectors import normalize
from cdr.window.cite import CitedText, cite_text, record_sources, window_citer
from cdr.window.config import GenerationConfig, Ranker, SafetyCheck
from cdr.window.dpe import (
    DpeReport,
    decompose_from_facts,
    llm_outline_prompt,
    parse_outline,
    verify_text,
)
from cdr.window.envelope import (
    FACT_FRAMING_TOKENS,
    Budget,
    Envelope,
    make_budget,
    pack,
    residual_anchor,
)
from cdr.window.fit import MIN_SECTION_WORDS, WORDS_PER_TOKEN, fit_facts, planned_words
from cdr.window.headers import SAFETY_ONLY_HEADERS, crp_headers
from cdr.window.length import (
    envelope_words,
    grounded_budget,
    grounded_words,
    section_shares,
    too_thin,
    window_budget,
    words_owed,
    writer_words_per_token,
)
from cdr.window.plan import label_owners, owning_sections
from cdr.window.prompt import build_user_prompt, fact_label, fact_prompt_tokens, fit_plan
from cdr.window.repeat_guard import GuardResult, RepeatGuard
from cdr.window.resume import Resume, can_resume, resume_for, write_resumed
from cdr.window.stale import is_stale
from cdr.window.telemetry import window_span
from cdr.writers.base import Writer, WriterResult, estimate_prompt_tokens, pastes_facts

__all__ = ["EmptyKnowledgeBaseError", "FactRef", "GenerationConfig", "Generator",
           "PreparedWindow", "Ranker", "SafetyCheck", "WindowEvent", "default_min_relevance",
           "stale_envelope", "written_whole"]

DEFAULT_SUB_QUERIES = DEFAULTS.sub_queries  # the user's option (cdr.options.RunOptions)
DECOMPOSITION_POOL = 300
PHASE1_LIMIT = 4000
SHARD_RANKED_MODES = ONE_PASS_MODES  # a shard ranks these itself (cdr.ranking.MODE_RULES)
# `pool: "sections"`: Phase 1 scans for the sections at most this many times a session (the
# gateway takes outlines of up to 50 lines; a longer outline's neighbours share a scan).
MAX_SECTION_QUERIES = 64
# `pool: "sections"`: a document the run draws on (Loop._drawn_on) has at least this share of
# its content facts sent, and at least this many.
DRAWN_ON_SHARE = 0.25
DRAWN_ON_MIN = 2
# ... and a document at least this share of whose content facts were sent is the task's as a
# whole: its other facts join the pool whatever their cosine (chosen on the tuning tasks of
# bench/shapes.py: surveys 73% -> 78% of their material sent, on-topic unchanged).
DRAWN_WHOLE = 0.67
# `pool: "sections"`: a document whose support by meaning for a section (the mean cosine of
# its 3 facts nearest the section's query, cdr.retrieval.doc_support) reaches this is one of
# the section's pages, as its home page is (chosen on the tuning tasks of bench/shapes.py).
SECTION_DOC_GATE = 0.6
SHARD_TOP_K = 64  # candidates a ranking index ships per window before packing settles
# A window whose plan came out shorter than the prompt T was counted with by at least this
# many tokens (about a small fact) is packed once more with T counted on the plan it got.
WIDEN_MIN_TOKENS = 32


def stale_envelope(envelope: Envelope) -> bool:
    """Exit 3 read off a prepared envelope: its mean novelty ratio is below the floor, so a
    window written from it could only repeat (docs/design.md §3.12 "When Exit 3 is checked")."""
    ratio = envelope.mean_novelty_ratio
    return ratio is not None and ratio < EXHAUSTION_RATIO


def default_min_relevance(model_id: str, lexical: str = "off", documents: str = "off"
                          ) -> float:
    """The calibrated gate for the index's embedding identity (`cdr.retrieval.gates`)."""
    return calibrated_gate(model_id, lexical, documents)


class EmptyKnowledgeBaseError(CdrError):
    """The CKF has no active facts: CDR has nothing to ground the windows in."""

    headers: ClassVar[dict[str, str]] = SAFETY_ONLY_HEADERS


# How much of a begun section's text a continuing window is shown: one or two sentences,
# constant in size like the Residual Task Anchor (docs/design.md §3.15 "Continued sections").
SECTION_END_WORDS = 40


@dataclass(frozen=True, slots=True)
class FactRef:
    """The parts of a CKF fact that traces and headers need after the envelope went out
    (what a stored `PreparedWindow` keeps: never the fact text)."""

    id: str
    source: str
    section: str
    content: str = ""


class _WindowFacts:
    """The facts one window's packing looked at, each fetched from the index and priced once.

    A window is packed up to a few times (`Generator.prepare`: an overflow's repack, a
    widening) and `cdr.window.envelope.pack` asks `costs_of` again on every packing; the
    facts' labels and texts do not change between them, so each row's tokens are counted
    the first time it is asked for and read from here after."""

    def __init__(self, index: FactIndex) -> None:
        self.index = index
        self.seen: dict[int, Any] = {}
        self.costs: dict[int, int] = {}

    def get(self, rows: np.ndarray) -> list[Any]:
        """The facts at `rows`, in order."""
        wanted = [int(r) for r in rows]
        missing = [r for r in dict.fromkeys(wanted) if r not in self.seen]
        if missing:
            found = self.index.facts(np.asarray(missing, dtype=np.int64))
            self.seen.update(zip(missing, found, strict=True))
        return [self.seen[r] for r in wanted]

    def cost(self, rows: np.ndarray) -> np.ndarray:
        """Each fact's tokens in the prompt, its label and plan ref included."""
        wanted = [int(r) for r in rows]
        missing = [r for r in dict.fromkeys(wanted) if r not in self.costs]
        if missing:
            priced = fact_prompt_tokens([(fact_label(f), f.content)
                                         for f in self.get(np.asarray(missing, np.int64))])
            self.costs.update(zip(missing, (int(c) for c in priced), strict=True))
        return np.fromiter((self.costs[r] for r in wanted), dtype=np.int64, count=len(wanted))


@dataclass(frozen=True, slots=True)
class _WindowInputs:
    """What every packing of one window shares: computed once per window, so that a repack
    changes only its reserve."""

    plan_sqs: list[SubQuery]  # the open sections the window may plan
    section_vecs: np.ndarray | None  # ranking mode `sections`: each section's query
    words: int | None  # the length contract: the words the window carries
    max_facts: int | None
    anchor: str
    summary: str
    bare: str  # the user message for the prompt's shape, with no facts: T
    facts: _WindowFacts  # the facts its packings looked at, each fetched and priced once


@dataclass(frozen=True, slots=True)
class _Attempt:
    """One packing of a window at one reserve, planned and rendered: what `prepare` keeps,
    or reads `over` and `unplanned` off to decide the next packing."""

    reserve: int  # tokens added to T (`make_budget`'s `reserve`)
    envelope: Envelope
    rows: np.ndarray  # CKF rows of the packed facts, in layout order
    facts: list[Any]
    plan: list[PlanSection]
    grounds: int | None
    messages: list[dict[str, str]]
    over: int  # tokens the rendered prompt exceeds C − G by (≤ 0: it fits)
    unplanned: int  # tokens of T the plan left unused (sections counted that got no line)

    @property
    def overflows(self) -> bool:
        """Too long to send; an empty envelope is never packed again (nothing to take out)."""
        return self.over > 0 and len(self.envelope) > 0


@dataclass
class PreparedWindow:
    """A window's envelope and prompt, before anything is written."""

    number: int
    envelope: Envelope
    rows: np.ndarray  # CKF rows of the packed facts, in layout order
    facts: list[Any]  # CKF facts (or `FactRef`s), in layout order
    plan: list[PlanSection]
    messages: list[dict[str, str]]
    coverage_depth: int
    max_tokens: int
    # The length contract with a model writer: the words the envelope can ground
    # (`cdr.window.length.grounded_words`); None when no cap was computed.
    grounds_words: int | None = None
    # `resume: "prefill"` with a writer that continues a prefix: where the answer starts
    # (`cdr.window.resume`). Not stored: a window restored from `to_dict` is written unresumed.
    resume: Resume | None = None

    @property
    def too_thin(self) -> bool:
        """The envelope cannot ground even a minimal section: the window is not written."""
        return (self.grounds_words is not None and len(self.envelope) > 0
                and too_thin(self.grounds_words))

    def headers(self, session: Session) -> dict[str, str]:
        """The CRP headers of this window with `session` as it stands."""
        return crp_headers(
            window=self.number, max_windows=session.max_windows, status=session.status,
            completeness=session.completeness(), envelope=self.envelope,
            coverage_depth=self.coverage_depth,
        )

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able copy, a few KB: ids, sources, sections and the ranking's numbers, never
        the fact text or the prompt (float32 values round-trip exactly)."""
        return {
            "number": self.number,
            **self.envelope.to_dict(),
            "facts": [[f.source, f.section] for f in self.facts],
            "rows": [int(x) for x in self.rows],
            # A trimmed section (`whole` False) carries a 4th item; whole ones store as before.
            "plan": [[p.title, p.target_words, list(p.fact_refs), *([] if p.whole else [False])]
                     for p in self.plan],
            "coverage_depth": int(self.coverage_depth),
            "max_tokens": int(self.max_tokens),
            **({} if self.grounds_words is None else {"grounds_words": int(self.grounds_words)}),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PreparedWindow:
        """The window `to_dict` saw, with `FactRef`s for facts and no prompt messages."""
        try:
            envelope = Envelope.from_dict(data)
            facts = [FactRef(fid, src, sec) for fid, (src, sec) in
                     zip(envelope.fact_ids, data["facts"], strict=True)]
            plan = [PlanSection(t, int(w), tuple(refs), bool(rest[0]) if rest else True)
                    for t, w, refs, *rest in data["plan"]]
            return cls(
                number=int(data["number"]), envelope=envelope,
                rows=np.asarray(data["rows"], dtype=np.int64), facts=facts, plan=plan,
                messages=[], coverage_depth=int(data["coverage_depth"]),
                max_tokens=int(data["max_tokens"]),
                grounds_words=(None if data.get("grounds_words") is None
                               else int(data["grounds_words"])),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise InvalidInputError(f"stored envelope is damaged: {exc!r}") from None


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
    # The writer's failure itself (`error` is its message), for callers that re-raise it.
    upstream: UpstreamError | None = field(default=None, repr=False, compare=False)
    # `repeats: "drop"`: what `cdr.window.repeat_guard` took out of the writer's text (not in
    # `output`).
    dropped: list[str] = field(default_factory=list)
    # `citations` on (`cdr.window.cite`): the facts each sentence of `output` rests on, and
    # `output` as the reader sees it, with the document's citation numbers in it.
    citations: WindowCitations | None = None
    shown: str | None = None

    @property
    def done(self) -> bool:
        return self.status != IN_PROGRESS


class Generator:
    """Binds a fact index (a CKF, a shard set), its embedder, a writer and the settings; runs
    windows for a task."""

    def __init__(self, index: FactIndex, writer: Writer, config: GenerationConfig | None = None
                 ) -> None:
        self.index = index
        self.embedder = index.embedder
        self.writer = writer
        self.config = config or GenerationConfig()
        self._cheapest: tuple[int, int] | None = None  # (generation, cheapest fact cost)
        # `pool: "sections"`: (session, index generation, its pool), the last one computed
        self._section_pools: tuple[Session, int, Selection] | None = None
        cfg = self.config
        if not 1 <= cfg.max_windows <= MAX_WINDOWS_LIMIT:
            raise InvalidInputError(
                f"windows must be within 1..{MAX_WINDOWS_LIMIT}, got {cfg.max_windows}")
        if cfg.words < 1:
            raise InvalidInputError(f"words must be positive, got {cfg.words}")
        self.options = cfg.session_options()


    @property
    def min_relevance(self) -> float:
        mr = self.config.min_relevance
        if mr is not None:
            return float(mr)
        return default_min_relevance(self.index.model_id, self.options.lexical,
                                     self.options.documents)

    def cosine_gate(self) -> float:
        """The gate on plain cosine relevance (a section's home document's facts, judged by
        meaning alone): the calibrated one, or the user's gate when they set one."""
        mr = self.config.min_relevance
        return float(mr) if mr is not None else default_min_relevance(self.index.model_id)

    # -- start -----------------------------------------------------------------------------

    def decompose(self, task: str, outline: str | None = None) -> list[SubQuery]:
        """Sub-queries from an outline, else from the LLM writer, else from the CKF."""
        cfg = self.config
        if outline is not None:
            return parse_outline(outline, cfg.words)
        if not pastes_facts(self.writer):  # a model writer drafts the outline
            result = self.writer.generate(llm_outline_prompt(task, cfg.sub_queries), 300)
            lines = [x for x in result.text.splitlines() if x.strip()][: cfg.sub_queries * 2]
            if lines:
                return parse_outline("\n".join(lines), cfg.words)
        topic_vec = self.embedder.encode([task_topic(task)])[0]
        sel = self.index.select(topic_vec, self.min_relevance * 0.75, DECOMPOSITION_POOL)
        if len(sel.indices) == 0:
            raise InvalidInputError(
                f"nothing in the CKF is relevant to {task!r}; give an outline (--outline) or "
                "ingest documents about it"
            )
        sections = [f.section or f.source for f in self.index.facts(sel.indices)]
        return decompose_from_facts(sel.embeddings, sections, cfg.sub_queries, cfg.words)

    def start(
        self,
        task: str,
        outline: str | None = None,
        sub_queries: Sequence[SubQuery] | None = None,
    ) -> Session:
        if not task or not task.strip():
            raise InvalidInputError("task is empty")
        if not self.index.active.any():
            raise EmptyKnowledgeBaseError(
                f"the CKF at {self.index.path} has no active facts: nothing to ground the "
                "document in; ingest documents first (cdr ingest PATH --ckf DIR)"
            )
        sqs = list(sub_queries) if sub_queries else self.decompose(task, outline)
        # `subject: "anchor"` (cdr.retrieval.subject): each line embedded as the task's subject +
        # line
        texts = sub_query_texts(task, sqs, self.options.subject)
        vecs = self.embedder.encode([task_topic(task), *texts])
        topic, sq_emb = vecs[0], vecs[1:]
        centroid = normalize(sq_emb.mean(axis=0), "sub-query centroid")
        # docs/design.md §3.11 "The query and the gate"
        query = normalize(topic + centroid, "query")
        expanded = None
        if self.options.queries == "expanded":  # cdr.retrieval.expansion: once, from Phase 1's pool
            index = self.phase1_index(self.options, task, sqs)
            pool = index.select(query, self.min_relevance, PHASE1_LIMIT)
            near = None
            if self.config.expansion_scorer is not None and len(pool.indices):
                texts = [f.content for f in self.index.facts(pool.indices)]
                near = self.config.expansion_scorer([sq.text for sq in sqs], texts,
                                                    pool.embeddings @ sq_emb.T)
            expanded = expand_sub_queries(sq_emb, pool.embeddings, self.config.expansion_facts,
                                          near=near)
        return Session.start(
            task, sqs, sq_emb, query, self.embedder.model_id,
            max_windows=self.config.max_windows, min_relevance=self.min_relevance,
            residual_exit_depth=self.config.residual_exit_depth, ranking=self.config.ranking,
            ngram_index=self.index.ngram_index, options=self.options,
            expanded_embeddings=expanded,
        )

    # -- one window --------------------------------------------------------------------------

    def _plan_sub_queries(self, session: Session) -> list[SubQuery]:
        # cdr.window.length: a section written whole is done
        if session.options.length == "contract":
            done = set(session.finished_ids)
            open_sqs = [sq for sq in session.sub_queries if sq.id not in done]
            if open_sqs:
                return open_sqs
            # Every section written whole and words still owed: the spec's residual planning
            # (sections written again; bench/long.py counts them).
        if session.residual_ids:
            return session.residual_sub_queries
        unfinished = [sq for sq in session.sub_queries if session.cumulative_depth[sq.id] < 0.9]
        return unfinished or list(session.sub_queries)

    def phase1_index(self, options: SessionOptions, task: str,
                     sub_queries: Sequence[SubQuery]) -> Any:
        """The index Phase 1 selects from: the CKF, with (`lexical: "bm25"`, cdr.retrieval.lexical)
        relevance fused with BM25 of the task's subject and outline words (`pool:
        "sections"`: without navigation pages, cdr.retrieval.navigation), and with
        (`documents: "support"`, cdr.retrieval.doc_support) each relevance weighed by its document's
        support."""
        phase1: Any = self.index
        if options.pool == "sections":  # cdr.retrieval.navigation: content pages only
            phase1 = ContentIndex(phase1, navigation_rows(self.index))
        if options.lexical != "off":
            words = session_terms(subject_of(task), [sq.text for sq in sub_queries])
            phase1 = FusedIndex(phase1, lexical_index(self.index), words,
                                self.config.lexical_weight)
        if options.documents != "off":
            phase1 = SupportedIndex(phase1, document_codes(self.index), self.config.support_power,
                                    self.config.support_top_n)
        return phase1

    def candidates(self, session: Session) -> Any:
        """Phase 1: the facts past the gate (widened by expanded sub-queries when on; with
        `pool: "sections"`, the task's and its sections')."""
        index = self.phase1_index(session.options, session.task, session.sub_queries)
        if session.expanded_embeddings is not None and self.config.expansion_widens:
            return widened_selection(index, session.query_vector, session.expanded_embeddings,
                                     session.min_relevance, PHASE1_LIMIT,
                                     self.config.expansion_widen_limit,
                                     self.config.expansion_top_up)
        if session.options.pool == "sections":
            return self._drawn_on(session, self._section_pool(session, index))
        return index.select(session.query_vector, session.min_relevance, PHASE1_LIMIT)

    def _drawn_on(self, session: Session, pool: Selection) -> Selection:
        """`pool: "sections"`: the pool widened by the documents the run already draws on.

        A document at least DRAWN_ON_SHARE of whose content facts (and at least
        DRAWN_ON_MIN) were sent is one of the task's documents, found by the run itself;
        its facts not yet sent join the pool when their meaning serves the task or one of
        its sections (cosine to the task's query or a section's query at the cosine gate),
        so a run does not stop `ckf-exhausted` on the part of a page the fused gate missed;
        of a document at least DRAWN_WHOLE of whose content facts were sent, every other
        fact joins (the page is the task's; "Isolation level and access mode" is half a
        page of SET TRANSACTION whose last facts name neither). A sibling page that gave a
        fact or two stays out."""
        shown = session.fact_memory.shown
        if not shown or not len(pool):
            return pool
        sent = np.fromiter((f in shown for f in self.index.fact_ids(pool.indices)), bool,
                           len(pool))
        if not sent.any():
            return pool
        codes = document_codes(self.index)
        content = content_rows(self.index)
        size = content_sizes(self.index)
        n_sent = np.bincount(codes[pool.indices[sent]], minlength=len(size))
        drawn = np.flatnonzero((n_sent >= DRAWN_ON_MIN) & (n_sent >= DRAWN_ON_SHARE * size))
        if not len(drawn):
            return pool
        rows = np.flatnonzero(content & np.isin(codes, drawn))
        rows = rows[~np.isin(rows, pool.indices)]
        if not len(rows):
            return pool
        rows = rows[np.fromiter((f not in shown for f in self.index.fact_ids(rows)), bool,
                                len(rows))]
        if not len(rows):
            return pool
        vecs = np.asarray(session.sub_query_embeddings, np.float32)
        queries = np.vstack([session.query_vector[None, :],
                             vecs + session.query_vector[None, :]]).astype(np.float32)
        queries /= np.linalg.norm(queries, axis=1, keepdims=True)
        emb = np.asarray(self.index.vectors(rows), np.float32)
        # einsum, not BLAS: a row's value must not depend on the rows beside it (one CKF and
        # its shards hold these rows in other orders)
        rel = np.einsum("ij,kj->ik", emb, queries).max(axis=1).astype(np.float32)
        keep = rel >= np.float32(self.cosine_gate())
        keep |= np.isin(codes[rows], np.flatnonzero(n_sent >= DRAWN_WHOLE * size))
        if not keep.any():
            return pool
        extra = Selection(rows[keep].astype(np.int64), rel[keep], emb[keep])
        return union_selection([pool, extra], self.index.dim)

    def _section_pool(self, session: Session, task_index: Any) -> Selection:
        """`pool: "sections"` (docs/retrieval.md, "Relevance to a task with sections"): the task's
        candidates and each outline section's, a fact at its best relevance, navigation pages
        left out (`phase1_index`). The task's documents are those holding one of its own
        query's candidates and each section's best match; a section queries as itself pulled
        toward the task (the unit sum of the task query and its vector), so "Errors" means
        this task's errors, with its own BM25 words and document support, and adds the facts
        it finds in the task's documents. The pool depends on the
        session's queries and the knowledge base's state only, so it is computed once per
        session and state (the scans do not repeat each window)."""
        gen = self.index.generation
        cached = self._section_pools
        if cached is not None and cached[0] is session and cached[1] == gen:
            return cached[2]
        gate = session.min_relevance
        parts = [task_index.select(session.query_vector, gate, PHASE1_LIMIT)]
        sqs, vecs = session.sub_queries, np.asarray(session.sub_query_embeddings, np.float32)
        codes = document_codes(self.index)
        by_meaning = ContentIndex(self.index, navigation_rows(self.index))
        cos_gate = self.cosine_gate()
        home_parts: list[Selection] = []
        pages: list[np.ndarray] = []  # each section's pages by meaning
        # At most MAX_SECTION_QUERIES scans, whatever the outline's length: past it, runs of
        # neighbouring sections query together (their mean vector, their lines' words).
        for group in np.array_split(np.arange(len(sqs)), min(len(sqs), MAX_SECTION_QUERIES)):
            query = normalize(session.query_vector + vecs[group].mean(axis=0),
                              f"section query {sqs[group[0]].id}")
            group_sqs = [sqs[i] for i in group]
            index = self.phase1_index(session.options, session.task, group_sqs)
            parts.append(index.select(query, gate, PHASE1_LIMIT))
            # The section's pages by meaning: its home document (doc_support.home_document:
            # the page many of whose facts sit near the section, not the page of one fact that
            # names its words) and every page as well supported by meaning (SECTION_DOC_GATE:
            # "WAL Configuration" lives on a page whose best fact ranks below another page's,
            # "Changing and removing roles" on two small pages). Chosen at the document level,
            # their facts are judged by their meaning alone, at the cosine gate, not weighed
            # against another page's best fact.
            near = by_meaning.select(query, cos_gate, None)
            these = section_pages(codes[near.indices], near.relevances, SECTION_DOC_GATE)
            if len(these):
                home_parts.append(_head(near.where(np.isin(codes[near.indices], these)),
                                        PHASE1_LIMIT))
                pages.append(these)
        # A section adds facts of the task's documents, not others: on a single-page task a
        # section query ("Errors") also meets sibling pages' sections. The task's documents
        # are those its own query reached, each section's best match and its pages by meaning.
        reached = np.unique(np.concatenate([codes[parts[0].indices],
                                            *(codes[p.indices[:1]] for p in parts[1:]), *pages]))
        parts[1:] = [p.where(np.isin(codes[p.indices], reached)) for p in parts[1:]]
        parts += home_parts
        # The best PHASE1_LIMIT of the union, as the task's own Phase 1 is bounded: the work
        # each window ranks stays what it was, whatever the outline.
        pool = _head(union_selection(parts, self.index.dim), PHASE1_LIMIT)
        self._section_pools = (session, gen, pool)
        return pool

    def prepare(self, session: Session) -> PreparedWindow:
        """Phase 1 select, Phase 2 rank, Phase 3 pack, plan and prompt for the next window.

        The envelope's budget counts the whole prompt (docs/design.md §3.16, "The budget
        counts the whole prompt"): T is the user message rendered without facts for the
        sections the window may plan (`_prompt_shape`), and each fact costs its label line
        and plan ref besides its text. That shape is a forecast of the plan, so the prompt
        is checked as rendered and the window packed again when it missed:

        - longer than C − G (a plan the shape did not foresee): the excess is reserved, so
          no writer is sent more than its context holds. Reserving it once is what a plan
          that stays put needs; a second excess means the new packing moved the plan again,
          so the k-th repack reserves 2^(k−1) times its excess. After k repacks it is at
          least 2^k − 1 tokens, so within ⌈log2(E + 1)⌉ of them either a packing fits, or
          the envelope is empty (not repacked: nothing to take out), or the reserve has
          taken all of E and `make_budget` refuses the window. On the grid of
          tests/test_prompt_budget.py no first packing overflows at all.
        - shorter than T by `WIDEN_MIN_TOKENS` or more (a paster's sections that got no
          facts drop out of its plan): one more packing with T counted on the plan it got,
          corrected once should it overflow (the facts it adds can bring sections back), and
          kept only if it then fits; else the packing that fit stands. Once, because a
          widened packing that fits is what the window wanted, and one that does not has
          shown that the shorter plan does not hold."""
        window = self._window_inputs(session)
        got = self._attempt(session, window, 0)
        step = 1
        while got.overflows:
            got = self._attempt(session, window, got.reserve + step * got.over)
            step *= 2
        if len(got.envelope) and got.unplanned >= WIDEN_MIN_TOKENS:
            wide = self._attempt(session, window, got.reserve - got.unplanned)
            if wide.overflows:
                wide = self._attempt(session, window, wide.reserve + wide.over)
            if not wide.overflows:
                got = wide
        got.envelope.messages = got.messages
        return PreparedWindow(session.window_count + 1, got.envelope, got.rows, list(got.facts),
                              got.plan, got.messages, len(session.coverage),
                              self.config.generation_tokens, got.grounds,
                              self._resume(session, got.plan))

    def _resume(self, session: Session, plan: list[PlanSection]) -> Resume | None:
        """Where the window's answer starts, for `resume: "prefill"` and a writer that can
        be handed one (`cdr.window.resume`); None otherwise."""
        if session.options.resume != "prefill" or not can_resume(self.writer):
            return None
        return resume_for(plan, self._continued(session, plan))

    def _window_inputs(self, session: Session) -> _WindowInputs:
        """What every packing of the next window shares (`_WindowInputs`)."""
        cfg = self.config
        opts = session.options
        plan_sqs = self._plan_sub_queries(session)
        section_vecs = None
        if cfg.ranker is None and session.ranking == "sections":
            # Per-section retrieval: each section the window will write queries on its own.
            plan_sqs = self._sections_to_write(session, plan_sqs)
            section_vecs = self._sub_query_vectors(session, plan_sqs)
        anchor = residual_anchor(session.residual_sub_queries)
        summary = session.backward_summary() if cfg.backward_summary else ""
        words: int | None = None
        if opts.length == "contract":  # cdr.window.length: the owed words, what the window carries
            words = window_budget(session.words_asked, session.words_written,
                                  cfg.generation_tokens, writer_words_per_token(self.writer))
        max_facts = cfg.max_envelope_facts
        if opts.envelope == "fit":  # cdr.window.fit: as many facts as the planned words can use
            n = fit_facts(planned_words(plan_sqs, session.cumulative_depth),
                          cfg.generation_tokens, cfg.fit_facts_per_word)
            max_facts = n if max_facts is None else min(n, max_facts)
        bare = self._user_prompt(session, anchor, summary,
                                 self._prompt_shape(session, plan_sqs, words), [])
        return _WindowInputs(plan_sqs, section_vecs, words, max_facts, anchor, summary, bare,
                             _WindowFacts(self.index))

    def _attempt(self, session: Session, window: _WindowInputs, reserve: int) -> _Attempt:
        """The window packed with `reserve` tokens added to T, planned and rendered, with
        what its prompt came to against C − G: all `prepare` reads to choose the next
        packing, so that choice is written in one place."""
        cfg = self.config
        budget = make_budget(cfg.context_tokens, cfg.system_prompt, window.bare,
                             cfg.generation_tokens, messages=2, reserve=reserve)
        envelope = self._pack(session, budget, window.anchor, window.max_facts,
                              window.section_vecs, window.facts.cost)
        rows = envelope.ranking.indices
        facts = window.facts.get(rows)
        plan, grounds = self._window_plan(session, window.plan_sqs, rows, envelope, facts,
                                          window.words)
        messages = [{"role": "system", "content": cfg.system_prompt},
                    {"role": "user", "content": self._user_prompt(
                        session, window.anchor, window.summary, plan, facts)}]
        over = estimate_prompt_tokens(messages) - (cfg.context_tokens - cfg.generation_tokens)
        # T re-counted on the plan it got (its lines without refs): the shape's sections that
        # got no line are the room a widening gives back.
        unplanned = budget.task - reserve - count_tokens(self._user_prompt(
            session, window.anchor, window.summary,
            [replace(p, fact_refs=()) for p in plan], []))
        return _Attempt(reserve, envelope, rows, facts, plan, grounds, messages, over,
                        unplanned)

    def _pack(self, session: Session, budget: Budget, anchor: str, max_facts: int | None,
              section_vecs: np.ndarray | None, costs_of: Callable[[np.ndarray], np.ndarray]
              ) -> Envelope:
        """Phase 3 on the index's shards when they can rank this window themselves, else here."""
        # Which rules let the shards rank is each rule's own declaration (cdr.rules).
        if (section_vecs is None and self.config.ranker is None
                and session.ranking in SHARD_RANKED_MODES and shards_can_rank(session.options)
                and isinstance(self.index, RankingIndex)):
            return self._pack_ranked_on_index(session, budget, anchor, max_facts, costs_of)
        return self._pack_ranked_here(session, budget, anchor, max_facts, section_vecs, costs_of)

    def _window_plan(self, session: Session, plan_sqs: list[SubQuery], rows: np.ndarray,
                     envelope: Envelope, facts: Sequence[Any], words: int | None
                     ) -> tuple[list[PlanSection], int | None]:
        """The window's plan for its packed facts, and (the length contract, a model writer)
        the words its envelope grounds.

        The plan cites every packed fact, so the prompt lists the whole envelope — what
        fact memory, the stale stop and the trace count as sent (docs/design.md §3.17, "The
        envelope is what the prompt lists"). A paster plans every section it gets facts for.
        A model writer chooses the sections its words cover first (`_sections_to_write`, the
        sections T was counted with) and the packed facts are assigned among those: assigned
        over every open section and the plan then cut to the leading ones, the facts nearest
        a later section were packed and never shown (the spec profile listed 1 of 25–46
        packed facts in most windows; the length contract, 2 of 36)."""
        if pastes_facts(self.writer):  # a paster's budget is the facts', not words
            return self._plan(session, plan_sqs, rows, envelope), None
        grounds: int | None = None
        budget_words = round(self.config.generation_tokens * WORDS_PER_TOKEN)
        if words is not None:
            # A model writer is asked for no more than its envelope grounds: one fact
            # left for a full section was written from memory (cdr.window.length).
            grounds = grounded_words(envelope_words(f.content for f in facts))
            budget_words = grounded_budget(words, grounds)
        if session.options.plan == "packed" and len(rows) and plan_sqs:
            # cdr.window.plan: only sections that own enough of the packed facts, those
            # owning the most first; written in outline order
            labels = [f.section for f in facts] if self.config.plan_by_heading else None
            owning = owning_sections(self._owners(session, plan_sqs, rows, labels),
                                     len(plan_sqs), self.config.plan_min_facts)
            if owning:
                writing = self._sections_to_write(session, [plan_sqs[j] for j in owning],
                                                  budget_words)
                plan = fit_plan(self._plan(session, writing, rows, envelope, labels),
                                budget_words)
                order = {sq.text: i for i, sq in enumerate(plan_sqs)}
                return sorted(plan, key=lambda p: order[p.title]), grounds
        writing = self._sections_to_write(session, plan_sqs, budget_words)
        return fit_plan(self._plan(session, writing, rows, envelope), budget_words), grounds

    def _prompt_shape(self, session: Session, plan_sqs: list[SubQuery], words: int | None
                      ) -> list[PlanSection]:
        """The sections this window's plan may hold, at their full targets and with no facts:
        the prompt T is counted with. A paster plans every section it is given facts for; a
        model writer the leading ones its words cover (`_sections_to_write`: with the length
        contract its owed words, which the envelope's grounding only lowers). The plan is then
        those sections that get facts, their targets trimmed (`fit_plan`), so its lines are no
        longer than these (`prepare` still reserves any excess the shape did not foresee)."""
        sqs = plan_sqs if pastes_facts(self.writer) else self._sections_to_write(
            session, plan_sqs, words)
        return [PlanSection(sq.text, self._target_words(session, sq), ()) for sq in sqs]

    def _user_prompt(self, session: Session, anchor: str, summary: str,
                     plan: list[PlanSection], facts: Sequence[Any]) -> str:
        """The window's user message (`cdr.window.prompt.build_user_prompt`)."""
        refs = [(f"F{i + 1}", fact_label(f), f.content) for i, f in enumerate(facts)]
        return build_user_prompt(session.task, anchor, plan, refs, summary,
                                 continued=self._continued(session, plan),
                                 first_window=session.window_count == 0,
                                 cite=session.options.citations != "off")

    def _continued(self, session: Session, plan: list[PlanSection]) -> dict[str, str]:
        """Planned sections an earlier window began, each with where its text stopped (when
        `show_section_ends` is on): a small model told only "continue it" introduces the
        section again; shown its last words, it goes on (docs/design.md §3.15 "Continued
        sections")."""
        by_text = {sq.text: sq.id for sq in session.sub_queries}
        out: dict[str, str] = {}
        for s in plan:
            sq_id = by_text.get(s.title)
            if sq_id is not None and session.cumulative_depth[sq_id] > 0:
                shown = self.config.show_section_ends
                out[s.title] = session.section_ends.get(sq_id, "") if shown else ""
        return out

    def _sections_to_write(self, session: Session, plan_sqs: list[SubQuery],
                           budget_words: int | None = None) -> list[SubQuery]:
        """The sections this window will write: for a model writer, the leading ones its word
        budget covers in depth (`fit_plan`; `budget_words`, else ⌊0.7 · G⌋), so per-section
        retrieval queries only those and the plan gives them the packed facts."""
        if pastes_facts(self.writer):
            return plan_sqs
        drafts = [PlanSection(sq.text, self._target_words(session, sq), ()) for sq in plan_sqs]
        budget = (budget_words if budget_words is not None
                  else round(self.config.generation_tokens * WORDS_PER_TOKEN))
        kept = {p.title for p in fit_plan(drafts, budget)}
        return [sq for sq in plan_sqs if sq.text in kept] or plan_sqs[:1]

    @staticmethod
    def _sub_query_vectors(session: Session, sqs: list[SubQuery]) -> np.ndarray:
        pos = [session.sub_query_ids.index(sq.id) for sq in sqs]
        return np.asarray(session.sub_query_embeddings[pos], dtype=np.float32)

    def _select_per_section(self, vecs: np.ndarray, gate: float) -> Selection:
        """Phase 1 once per planned section, the union of the rows (each row once)."""
        parts = [self.index.select(v, gate, PHASE1_LIMIT) for v in vecs]
        parts = [p for p in parts if len(p)]
        if not parts:
            return Selection.empty(self.index.dim)
        rows = np.concatenate([p.indices for p in parts])
        rel = np.concatenate([p.relevances for p in parts])
        emb = np.concatenate([p.embeddings for p in parts])
        _, first = np.unique(rows, return_index=True)
        first = np.sort(first)
        return Selection(rows[first], rel[first], emb[first])

    @staticmethod
    def _remaining_words(session: Session, sq: SubQuery) -> int:
        done = session.cumulative_depth[sq.id]
        return round(sq.expected_words * (1.0 - min(done, 1.0)))

    def _target_words(self, session: Session, sq: SubQuery) -> int:
        """The words a window asks for `sq`: its remaining expected words; with the length
        contract, its share of the words still owed among the sections not written whole
        (`cdr.window.length.section_shares`), so shortfalls of earlier sections are carried."""
        if session.options.length == "contract":
            done = set(session.finished_ids)
            open_sqs = [q for q in session.sub_queries if q.id not in done] or [sq]
            if sq in open_sqs:
                shares = section_shares([self._remaining_words(session, q) for q in open_sqs],
                                        words_owed(session.words_asked, session.words_written))
                return max(shares[open_sqs.index(sq)], MIN_SECTION_WORDS)
        return max(self._remaining_words(session, sq), MIN_SECTION_WORDS)

    def _pack_ranked_here(self, session: Session, budget: Budget, anchor: str,
                          max_facts: int | None, section_vecs: np.ndarray | None = None,
                          costs_of: Callable[[np.ndarray], np.ndarray] | None = None
                          ) -> Envelope:
        """Select every gated candidate (vectors included), rank them here, pack
        (`section_vecs`: ranking mode `sections`, Phase 1 once per planned section)."""
        cfg = self.config
        gate = session.min_relevance
        if section_vecs is not None:
            sel = self._select_per_section(section_vecs, gate)
        else:
            sel = self.candidates(session)
            if session.expanded_embeddings is not None and cfg.expansion_widens:
                gate = -1.0  # widened Phase 1 gated already, on the query or an expansion
        counts = session.blacklist.counts
        importance = self.index.importance[sel.indices]
        sel_counts = counts[sel.indices] if len(counts) else None
        if cfg.ranker is not None:
            ranking = cfg.ranker(session, sel, importance, sel_counts)
        else:
            ranking = rank(
                sel.embeddings, sel.relevances, importance=importance, ngram_counts=sel_counts,
                coverage=session.coverage, residual=session.residual,
                mode=session.ranking, min_relevance=gate,
                mmr_lambda=cfg.mmr_lambda, rows=sel.indices, sections=section_vecs,
            )
            if gate < 0 and cfg.expansion_widened_power:  # widened-in facts: later resort
                w = widened_weights(ranking.relevance, session.min_relevance,
                                    cfg.expansion_widened_power)
                ranking.score = (ranking.score * w).astype(np.float32)
                ranking = ranking.take(np.argsort(-ranking.score, kind="stable"))
        if session.options.memory == "facts":  # cdr.fact_memory
            ranking = apply_memory(ranking, session.fact_memory, session.window_count + 1,
                                   self.index.fact_ids, cfg.memory_rule)
        envelope = pack(ranking, self.index.fact_ids, self.index.token_counts[ranking.indices],
                        budget, anchor, max_facts, costs_of)
        if session.options.stale == "stop":
            envelope = self._unsent_tail(session, ranking, envelope, budget, anchor, max_facts,
                                         costs_of)
        return envelope

    def _unsent_tail(self, session: Session, ranking: Ranking, envelope: Envelope,
                     budget: Budget, anchor: str, max_facts: int | None,
                     costs_of: Callable[[np.ndarray], np.ndarray] | None = None) -> Envelope:
        """`stale: "stop"` (cdr.window.stale): an envelope that is mostly facts sent before, while
        candidates never sent remain, is packed from those candidates alone.

        They rank below facts already sent because their sections are covered (low novelty),
        so a budget envelope fills with repeats and the stale stop would end the run with
        part of the task's material never sent. Packed alone, the rest goes out in the next
        window(s), and the stop comes in the window after the last of it: when the material
        has run out, not before. Candidates below Exit 3's novelty floor are not packed (their
        6-grams were written, or their topic is covered): with them the envelope's mean would
        condemn the few still worth sending. None left (or none that fits): the stale envelope
        stands."""
        shown = session.fact_memory.shown
        if not is_stale(envelope.fact_ids, shown) or not len(ranking):
            return envelope
        ids = self.index.fact_ids(ranking.indices)
        sendable = ranking.novelty_ratio() >= EXHAUSTION_RATIO
        unsent = np.flatnonzero([f not in shown and ok for f, ok in zip(ids, sendable,
                                                                          strict=True)])
        if not len(unsent):
            return envelope
        rest = ranking.take(unsent)
        tail = pack(rest, self.index.fact_ids, self.index.token_counts[rest.indices], budget,
                    anchor, max_facts, costs_of)
        return tail if len(tail) else envelope

    def _pack_ranked_on_index(self, session: Session, budget: Budget, anchor: str,
                              max_facts: int | None,
                              costs_of: Callable[[np.ndarray], np.ndarray] | None = None
                              ) -> Envelope:
        """Rank on the index (its shards) and ship back only the top `k` candidates.

        Greedy packing skips misfits, so a short list packs exactly like the full ranking
        once its picks are settled: the envelope is full (`max_facts`), or the
        budget left is below the cheapest active fact, or the list holds every candidate.
        Otherwise `k` doubles and the window is ranked again (rare: a budget much larger
        than what the first `k` facts fill)."""
        cheapest = self._cheapest_fact_cost()
        k = max(SHARD_TOP_K, 2 * (max_facts or 0))
        while True:
            top_k = min(k, PHASE1_LIMIT)
            ranking, _emb, tokens, ids = self.index.rank_window(WindowQuery(  # type: ignore[attr-defined]
                session.query_vector, session.min_relevance, PHASE1_LIMIT,
                session.coverage.centroid(), bool(session.coverage),
                session.residual.embeddings, session.blacklist.as_array().astype(np.uint64),
                session.ranking, top_k, vectors=False))
            envelope = pack(ranking, ids, tokens, budget, anchor, max_facts, costs_of)
            settled = (len(ranking) < top_k or top_k >= PHASE1_LIMIT
                       or (max_facts is not None and len(envelope) >= max_facts)
                       or budget.envelope - envelope.used_tokens < cheapest)
            if settled:
                break
            k *= 2
        if max_facts is None:  # what the full ranking would have left out
            envelope.skipped = ranking.n_candidates - len(envelope)
        return envelope

    def _cheapest_fact_cost(self) -> int:
        """Smallest packing cost of any active fact, cached per index generation."""
        gen = self.index.generation
        if self._cheapest is None or self._cheapest[0] != gen:
            toks = self.index.token_counts[self.index.active]
            low = int(toks.min()) if len(toks) else 0
            self._cheapest = (gen, low + FACT_FRAMING_TOKENS)
        return self._cheapest[1]

    def _plan(
        self, session: Session, plan_sqs: list[SubQuery], rows: np.ndarray, envelope: Envelope,
        labels: Sequence[str] | None = None,
    ) -> list[PlanSection]:
        """Each packed fact goes to its closest planned sub-query (`labels`: its section
        heading's, when that is one: `_owners`); sections keep the order given, facts within a
        section keep ranking order (best first)."""
        if not len(rows) or not plan_sqs:
            return []
        owner = self._owners(session, plan_sqs, rows, labels)
        by_score = np.argsort(-envelope.ranking.score, kind="stable")
        plan = []
        for j, sq in enumerate(plan_sqs):
            refs = tuple(f"F{i + 1}" for i in by_score if owner[i] == j)
            if refs:
                plan.append(PlanSection(sq.text, self._target_words(session, sq), refs))
        return plan

    def _owners(self, session: Session, sqs: list[SubQuery], rows: np.ndarray,
                labels: Sequence[str] | None = None) -> np.ndarray:
        """Each packed fact's closest sub-query among `sqs` (its position), −1 where
        `plan_min_similarity` keeps it out of the plan. With `labels` (`plan: "packed"`, the
        facts' section paths), a fact whose heading is one of the sub-queries' lines is that
        section's, whatever the cosine says (`cdr.window.plan.label_owners`)."""
        pos = [session.sub_query_ids.index(sq.id) for sq in sqs]
        sims = self.index.vectors(rows) @ session.target_embeddings[pos].T
        owner: np.ndarray = np.argmax(sims, axis=1)
        if self.config.plan_min_similarity is not None:
            owner[sims[np.arange(len(rows)), owner] < self.config.plan_min_similarity] = -1
        if labels is not None:
            named = label_owners(labels, [sq.text for sq in sqs])
            owner = np.where(named >= 0, named, owner)
        return owner

    def sections_left(self, session: Session, sent: Collection[int]
                      ) -> list[tuple[SubQuery, int]]:
        """The sections a run left open (not written whole under the length contract, else
        still in the Residual Set), each with how many Phase 1 candidates never `sent` (CKF
        rows) are closest to it: 0 means the knowledge base holds nothing more for it past the
        relevance gate; more means what is left was below Exit 3's novelty floor (its topic
        already covered). What `cdr generate` says when a run ends `ckf-exhausted`."""
        if session.options.length == "contract":
            done = set(session.finished_ids)
        else:
            done = set(session.sub_query_ids) - set(session.residual_ids)
        open_pos = [i for i, sq in enumerate(session.sub_queries) if sq.id not in done]
        if not open_pos:
            return []
        pool = self.candidates(session)
        unsent = pool.indices[~np.isin(pool.indices, np.fromiter(sent, np.int64))]
        owner = (self._owners(session, list(session.sub_queries), unsent) if len(unsent)
                 else np.zeros(0, np.int64))
        return [(session.sub_queries[i], int(np.count_nonzero(owner == i))) for i in open_pos]

    def verify(self, session: Session, text: str) -> DpeReport:
        """DPE Stage 8 on a window's text, with the CKF's embedding model."""
        return verify_text(text, session.sub_queries, session.target_embeddings,
                           self.embedder.encode, self.config.attribution_threshold,
                           session.blacklist.fresh_share)

    def citer(self, session: Session, prepared: PreparedWindow) -> Citer | None:
        """The window's citer (`citations` on, `cdr.window.cite`), else None."""
        if session.options.citations == "off" or not len(prepared.envelope):
            return None
        return window_citer(self.index, self.embedder, prepared,
                            self.config.citation_threshold)

    def repeat_guard(self, session: Session) -> RepeatGuard | None:
        """The session's output guard for its next window (`repeats: "drop"`), else None."""
        if session.options.repeats != "drop":
            return None
        earlier = session.written_vectors
        if earlier is None:
            earlier = np.zeros((0, session.dim), np.float32)
        return RepeatGuard(session.blacklist.__contains__, earlier, self.embedder.encode)

    def complete(
        self,
        session: Session,
        prepared: PreparedWindow,
        text: str,
        *,
        result: WriterResult | None = None,
        error: UpstreamError | None = None,
        seconds: float = 0.0,
        kept: GuardResult | None = None,
        cited: CitedText | None = None,
    ) -> WindowEvent:
        """Verify the window's text, update the session (§7.2), apply the exits (§6).

        `text` is whatever was written: the writer's, the sidecar client's, or the part an
        upstream failure (`error`) left, which still counts (it may have been streamed out).
        With `repeats: "drop"` the repeat guard takes its repeats out first (`kept`: what it
        already kept of `text` for a stream, so both cut the same and it runs once). With
        `citations` on, the writer's markers come out and the sentences are cited
        (`cdr.window.cite`; `cited`: what a stream already cited of the kept text)."""
        if kept is None and (guard := self.repeat_guard(session)) is not None:
            kept = guard.filter(text)
        if kept is not None:
            text = kept.text
        if cited is None and (citer := self.citer(session, prepared)) is not None:
            cited = cite_text(session, citer, text)
        if cited is not None:
            text = cited.clean
            record_sources(session, cited)
        report = self.verify(session, text)
        summary = " ".join(text.split()[:40])
        finished: list[str] = []
        if session.options.length == "contract":
            finished = written_whole(session, prepared.plan, report,
                                     result.finish_reason if result else "stop")
        session.update_after_window(report.addressed, text,
                                    embedding_model_id=self.embedder.model_id, summary=summary,
                                    section_ends=report.section_ends(SECTION_END_WORDS),
                                    finished=finished)
        if kept is not None:
            session.remember_written(kept.vectors)
        if session.remembers_facts:  # cdr.fact_memory: what was shown, what was written
            written = written_rows(prepared.rows, text, session.blacklist.index,
                                   self.config.memory_rule.written_share)
            session.fact_memory.migrate(self.index.fact_ids)
            session.fact_memory.record(prepared.envelope.fact_ids, written, prepared.number)
        if self.config.safety_check is not None:
            session.spend_safety(self.config.safety_check(prepared.number, text))
        env = prepared.envelope
        reason = session.exit_reason(env.mean_novelty_ratio)
        if reason is None and not text and (self.stale_stop(session, prepared)
                                            or prepared.too_thin):
            # cdr.window.stale: the envelope was what earlier windows got; cdr.window.length:
            # it cannot ground a minimal section (the last of the material)
            reason = CKF_EXHAUSTED
        if error is not None:
            reason = UPSTREAM_ERROR
        session.status = reason or IN_PROGRESS
        headers = prepared.headers(session)
        event = WindowEvent(
            prepared.number, prepared, text, report, session.completeness(),
            list(session.residual_ids), headers, session.status,
            result.finish_reason if result else "stop", dict(result.usage) if result else {},
            None if error is None else str(error), seconds, error,
            list(kept.dropped) if kept is not None else [],
            cited.citations if cited is not None else None,
            cited.shown if cited is not None else None,
        )
        # cdr.window.telemetry: an OpenTelemetry span where the extra is installed
        window_span(event)
        return event

    def close_if_empty(self, session: Session, prepared: PreparedWindow,
                       started: float | None = None) -> WindowEvent | None:
        """An empty envelope (nothing relevant and novel left), or one Exit 3 already condemns
        (docs/design.md §3.12 "When Exit 3 is checked"), ends the window unwritten: nobody is asked
        for ungrounded or stale text. None when there is something fresh to write from."""
        if not self.ends_unwritten(session, prepared):
            return None
        return self.complete(session, prepared, "", seconds=_since(started))

    @staticmethod
    def stale_stop(session: Session, prepared: PreparedWindow) -> bool:
        """`stale: "stop"` (cdr.window.stale): the envelope is mostly facts earlier windows got."""
        return session.options.stale == "stop" and is_stale(
            prepared.envelope.fact_ids, session.fact_memory.shown)

    def out_of_material(self, session: Session, prepared: PreparedWindow) -> bool:
        """Whether the prepared window has nothing left to be written from: its envelope is
        empty, (`stale: "stop"`) it is stale, or (the length contract, a model writer) it
        cannot ground a minimal section. The sidecar ends a session on exactly these."""
        return (not len(prepared.envelope) or self.stale_stop(session, prepared)
                or prepared.too_thin)

    def ends_unwritten(self, session: Session, prepared: PreparedWindow) -> bool:
        """Whether the prepared window ends the run without being written: it is out of
        material, or Exit 3 already condemns it."""
        return (self.out_of_material(session, prepared)
                or stale_envelope(prepared.envelope))

    def write(self, prepared: PreparedWindow, on_delta: Callable[[str], None] | None = None
              ) -> WriterResult:
        if prepared.resume is not None:
            result, kept = write_resumed(self.writer, prepared.messages, prepared.max_tokens,
                                         prepared.resume, on_delta)
            if not kept:  # written unresumed after all: the trace must not say otherwise
                prepared.resume = None
            return result
        return self.writer.generate(prepared.messages, prepared.max_tokens, on_delta=on_delta)

    def write_and_complete(
        self,
        session: Session,
        prepared: PreparedWindow,
        on_delta: Callable[[str], None] | None = None,
        started: float | None = None,
    ) -> WindowEvent:
        """The second half of `step`: write the prepared window with this generator's writer
        (streaming pieces to `on_delta`), then `complete` it. An `UpstreamError` does not
        escape: the window completes with the partial text and status `upstream-error`."""
        empty = self.close_if_empty(session, prepared, started)
        if empty is not None:
            return empty
        result: WriterResult | None = None
        error: UpstreamError | None = None
        guard = self.repeat_guard(session)
        citer = self.citer(session, prepared)
        shape = _stream_shape(session, guard, citer)
        held = KeptStream(on_delta, shape) if on_delta is not None else None
        try:
            result = self.write(prepared, held.feed if held is not None else None)
            text = held.released_at_least(result.text) if held is not None else result.text
        except UpstreamError as exc:
            error = exc
            text = getattr(exc, "partial_text", "") or ""
        kept = guard.filter(text) if guard is not None else None
        final = kept.text if kept is not None else text
        cited = cite_text(session, citer, final) if citer is not None else None
        if held is not None:
            held.finish(cited.shown if cited is not None else final)
        return self.complete(session, prepared, text, result=result, error=error,
                             seconds=_since(started), kept=kept, cited=cited)

    def step(self, session: Session,
             on_delta: Callable[[int, str], None] | None = None, *,
             max_tokens: int | None = None) -> WindowEvent:
        """One window: prepare → (empty? end) → write → verify → update → headers → exit.

        `on_delta(window_number, piece)` receives the text as the writer streams it.
        `max_tokens` lowers the window's generation budget (a caller's cap over a whole
        document, such as an OpenAI client's `max_tokens`); the prompt is planned as usual."""
        started = time.perf_counter()
        prepared = self.prepare(session)
        if max_tokens is not None and 0 < max_tokens < prepared.max_tokens:
            prepared = dataclasses.replace(prepared, max_tokens=max_tokens)
        sink = functools.partial(on_delta, prepared.number) if on_delta is not None else None
        return self.write_and_complete(session, prepared, sink, started)

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
            event = self.step(session, on_delta)
            yield event
            if event.done:
                return


def written_whole(session: Session, plan: Sequence[PlanSection], report: DpeReport,
                  finish_reason: str) -> list[str]:
    """The sub-queries a window wrote whole (the length contract): planned in full (not
    trimmed to the window's budget by `fit_plan`), given words by Stage 8, and not the
    section the window was writing when its token limit or the model's loop cut it
    (`finish_reason` "length" or `REPETITION`: the last section its text was attributed to)
    unless that one already has the words it was planned for (a small model often spends a
    whole window on its first section: cut at twice its target, it is written, not
    unfinished). Those are not planned again; a
    trimmed or cut section is continued where it stopped."""
    by_title = {sq.text: sq.id for sq in session.sub_queries}
    cut = None
    if finish_reason in ("length", REPETITION):
        cut = next((a for a in reversed(report.attribution) if a is not None), None)
    out = []
    for p in plan:
        sq_id = by_title.get(p.title)
        words = report.words.get(sq_id, 0) if sq_id is not None else 0
        if sq_id is not None and p.whole and words > 0 and (
                sq_id != cut or words >= p.target_words):
            out.append(sq_id)
    return out


def _stream_shape(session: Session, guard: RepeatGuard | None, citer: Citer | None
                  ) -> Callable[[str], str] | None:
    """What a stream releases of the writer's complete blocks: the repeat guard's kept text,
    cited (`cdr.window.cite`), as the window will keep and show it. Both keep a prefix's
    blocks as they keep them in a longer text, so a released text stays a prefix."""
    if guard is None and citer is None:
        return None

    def shape(text: str) -> str:
        kept = guard.filter(text).text if guard is not None else text
        return cite_text(session, citer, kept).shown if citer is not None else kept

    return shape


def _head(sel: Selection, limit: int) -> Selection:
    """The first `limit` rows of a selection (best first)."""
    return sel.where(np.arange(len(sel)) < limit)


def union_selection(parts: Sequence[Selection], dim: int) -> Selection:
    """The rows of several Phase 1 selections, each once with its best relevance, best first
    (ties by row)."""
    parts = [p for p in parts if len(p)]
    if not parts:
        return Selection.empty(dim)
    rows = np.concatenate([p.indices for p in parts])
    rel = np.concatenate([p.relevances for p in parts]).astype(np.float32)
    emb = np.concatenate([p.embeddings for p in parts])
    best = Selection(rows, rel, emb).where(np.lexsort((rows, -rel)))
    _, first = np.unique(best.indices, return_index=True)
    return best.where(np.sort(first))


def _since(started: float | None) -> float:
    return 0.0 if started is None else time.perf_counter() - started
