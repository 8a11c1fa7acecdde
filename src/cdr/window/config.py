"""What a `Generator` runs with: the user's options, the knobs no user sets per run, the hooks.

`GenerationConfig` is flat, so `GenerationConfig(max_windows=4, ranker=my_ranker)` reads as it
always did, but its fields come from three places with three jobs:

- `cdr.options.RunOptions`: what a user chooses about one run (the CLI's flags and the
  gateway's request fields derive from it; stored sessions keep these names);
- `Tunables`: the spec's constants and the opt-in rules' tunables — library and benchmark
  knobs, never a flag or a request field, so a session from the CLI or the gateway runs with
  their defaults;
- `Hooks`: callbacks and test seams — code, not values, never stored or sent.

docs/design.md §7.5 "Seams" says why.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from cdr.citations.support import SUPPORT_THRESHOLD
from cdr.fact_memory import DEFAULT_MEMORY_RULE, MemoryRule
from cdr.options import RunOptions
from cdr.ranking import Ranking
from cdr.retrieval.doc_support import POWER as SUPPORT_POWER
from cdr.retrieval.doc_support import TOP_N as SUPPORT_TOP_N
from cdr.retrieval.expansion import (
    EXPANSION_FACTS,
    EXPANSION_TOP_UP,
    EXPANSION_WIDEN_LIMIT,
    EXPANSION_WIDENED_POWER,
    NeighbourScorer,
)
from cdr.retrieval.lexical import LEXICAL_WEIGHT
from cdr.session import DEFAULT_RESIDUAL_EXIT_DEPTH, Session
from cdr.window.dpe import DEFAULT_ATTRIBUTION_THRESHOLD
from cdr.window.envelope import DEFAULT_SYSTEM_PROMPT
from cdr.window.fit import FIT_FACTS_PER_WORD
from cdr.window.plan import PLAN_MIN_FACTS


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
class Tunables:
    """The spec's values and the rules' tunables (library and benchmark only)."""

    system_prompt: str = DEFAULT_SYSTEM_PROMPT
    residual_exit_depth: float = DEFAULT_RESIDUAL_EXIT_DEPTH
    attribution_threshold: float = DEFAULT_ATTRIBUTION_THRESHOLD
    # `citations` on: the support a cited fact must give its sentence (`cdr.citations.support`)
    citation_threshold: float = SUPPORT_THRESHOLD
    backward_summary: bool = False
    # A continued section's prompt line quotes where its text stopped (`SECTION_END_WORDS`
    # words); False gives the bare "continue it" line (the benchmark's before/after).
    show_section_ends: bool = True
    max_envelope_facts: int | None = None
    # None: every packed fact goes under its closest remaining section, however far. A value
    # keeps a fact out of the plan unless its cosine to that section reaches it.
    plan_min_similarity: float | None = None
    # `plan: "packed"` (cdr.window.plan): facts a section must own in the envelope to be planned.
    plan_min_facts: int = PLAN_MIN_FACTS
    # ... and a fact whose heading is an open section's line is that section's (False: the
    # cosine alone decides, the benchmark's ablation)
    plan_by_heading: bool = True
    lexical_weight: float = LEXICAL_WEIGHT  # cdr.retrieval.lexical: BM25's share of fused relevance
    support_power: float = SUPPORT_POWER  # cdr.retrieval.doc_support: how hard to cut
    support_top_n: int = SUPPORT_TOP_N  # cdr.retrieval.doc_support: facts its support averages
    memory_rule: MemoryRule = DEFAULT_MEMORY_RULE
    fit_facts_per_word: float = FIT_FACTS_PER_WORD
    expansion_facts: int = EXPANSION_FACTS
    # expanded sub-queries also widen Phase 1 (cdr.retrieval.expansion)
    expansion_widens: bool = True
    expansion_widen_limit: int = EXPANSION_WIDEN_LIMIT  # facts each expansion may add
    expansion_top_up: bool = EXPANSION_TOP_UP  # ... only what its section lacks in the pool
    # Facts below the query's gate (widened in) scored × (relevance / gate)^power (0 = off).
    expansion_widened_power: float = EXPANSION_WIDENED_POWER


@dataclass
class Hooks:
    """Callbacks and test seams (code, not values)."""

    safety_check: SafetyCheck | None = None
    ranker: Ranker | None = None  # replaces the built-in modes when set
    # Scores (pool × sub-queries) that pick each expansion's nearest facts instead of the
    # cosines, e.g. dense fused with BM25 (the benchmark's lexical arm); None = cosines.
    expansion_scorer: NeighbourScorer | None = None


@dataclass
class GenerationConfig(Hooks, Tunables, RunOptions):
    """Everything a `Generator` runs with: a `RunOptions` (the user's), the `Tunables` and the
    `Hooks`, as one flat set of keyword arguments (see the module doc). The opt-in rules are
    fixed into the session at its start and persisted with it; later windows follow the
    session's, whatever this config says."""
