"""Phase 3 packing (SPEC-003) and the Residual Task Anchor (SPEC-024 §4).

The envelope budget is E = C − S − T − G: context size minus system prompt, task and anchor,
and the generation reserve, all counted in cl100k tokens (`cdr.text.tokens`). The window loop
reads S and T as the whole prompt but its facts (docs/design.md §3.16, "The budget counts the
whole prompt"): S with the chat format's framing, T the user message rendered with no facts —
task, anchor, the plan lines and closing instructions of the sections the window may write —
and each fact costs its text plus its label line and its ref in the plan
(`cdr.window.prompt.fact_prompt_tokens`). Facts go in greedily in ranking order; a fact that
does not fit is skipped and packing continues with smaller ones. The packed facts are then
laid out strongest-first-and-last (1st, 3rd, 5th… from the front, 2nd, 4th… from the back),
because models attend least to the middle of long contexts.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import astuple, dataclass, field
from typing import Any

import numpy as np

from cdr.coverage import SubQuery
from cdr.errors import InvalidInputError
from cdr.options import DEFAULTS
from cdr.ranking import Ranking
from cdr.text.tokens import chat_framing_tokens, count_tokens

# A 4k-token window: about 2.8× the generation reserve of source material per window. Larger
# contexts work (--context-tokens); a tighter envelope makes each window's facts count.
# The user's options (cdr.options.RunOptions), under the names the envelope's callers know.
DEFAULT_CONTEXT_TOKENS = DEFAULTS.context_tokens
DEFAULT_GENERATION_TOKENS = DEFAULTS.generation_tokens
# Per-fact framing in the prompt ("[F3] (Section) " and a blank line) costs a few tokens: the
# estimate before a fact's own label is counted (`pack`'s `costs_of`), and the whole framing
# when no counter is given.
FACT_FRAMING_TOKENS = 8

DEFAULT_SYSTEM_PROMPT = (
    "You write one part of a long document. Use only the numbered facts given; do not repeat "
    "what earlier parts covered. Write the remaining sections in order, each under a Markdown "
    "'## ' heading with the section's exact title, in full paragraphs."
)


def residual_anchor(remaining: Sequence[SubQuery]) -> str:
    """§4.2: the forward-looking continuation context, constant size."""
    labels = ", ".join(sq.text for sq in remaining) if remaining else "none (finish the document)"
    return f"Remaining sections to complete: {labels}"


@dataclass(frozen=True)
class Budget:
    """E = C − S − T − G, in tokens. As the window loop makes it (`make_budget` with
    `messages`), `system` includes the chat framing of the prompt's messages and `task` is
    everything in the user message but the facts (docs/design.md §3.16)."""

    context: int
    system: int
    task: int
    generation: int

    @property
    def envelope(self) -> int:
        return self.context - self.system - self.task - self.generation


def make_budget(
    context_tokens: int, system_prompt: str, task_text: str, generation_tokens: int,
    *, messages: int = 0, reserve: int = 0,
) -> Budget:
    """E for a prompt of `system_prompt` and `task_text` (the user message without its
    facts). `messages` > 0 counts the chat framing of that many messages into S, so that the
    prompt as a writer sends it fits C − G, not only its text; `reserve` adds tokens to T
    (the loop's correction when a rendered prompt came out longer than counted, or, negative,
    shorter: T re-counted on the plan the window got)."""
    if context_tokens <= 0 or generation_tokens <= 0:
        raise InvalidInputError("context and generation token budgets must be positive")
    framing = chat_framing_tokens(messages) if messages > 0 else 0
    b = Budget(context_tokens, count_tokens(system_prompt) + framing,
               max(count_tokens(task_text) + int(reserve), 0), generation_tokens)
    if b.envelope <= 0:
        raise InvalidInputError(
            f"no room for facts: context {b.context} − system {b.system} − task, anchor and "
            f"plan {b.task} − generation {b.generation} = {b.envelope} tokens"
        )
    return b


@dataclass
class Envelope:
    """What one window's model call receives, with the numbers headers and traces report."""

    ranking: Ranking  # the packed facts, in layout order
    fact_ids: list[str]
    tokens: np.ndarray  # per packed fact (content tokens + framing)
    budget: Budget
    anchor: str
    skipped: int = 0  # ranked facts that did not fit
    messages: list[dict[str, str]] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.fact_ids)

    @property
    def used_tokens(self) -> int:
        return int(self.tokens.sum())

    @property
    def saturation(self) -> float:
        """Share of the envelope budget used."""
        return self.used_tokens / self.budget.envelope if self.budget.envelope else 0.0

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able copy without the prompt messages (they are rebuilt from the facts).
        `etag` is included for readers of the stored form; `from_dict` recomputes it."""
        return {
            "etag": self.etag,
            "fact_ids": list(self.fact_ids),
            "tokens": [int(x) for x in self.tokens],
            "ranking": self.ranking.to_dict(),
            "budget": list(astuple(self.budget)),
            "anchor": self.anchor,
            "skipped": int(self.skipped),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Envelope:
        """The `Envelope` `to_dict` saw (KeyError/TypeError/ValueError on a damaged copy)."""
        return cls(
            ranking=Ranking.from_dict(data["ranking"]),
            fact_ids=[str(x) for x in data["fact_ids"]],
            tokens=np.asarray(data["tokens"], dtype=np.int64),
            budget=Budget(*(int(x) for x in data["budget"])),
            anchor=data["anchor"], skipped=int(data["skipped"]),
        )

    @property
    def etag(self) -> str:
        """Hash of the sorted fact ids: equal envelopes have equal ETags, whatever the order."""
        h = hashlib.sha256("\n".join(sorted(self.fact_ids)).encode("utf-8"))
        return h.hexdigest()[:32]

    @property
    def min_novelty_ratio(self) -> float | None:
        """`CRP-Context-Coverage-Score` (§8.1): the least novel fact included."""
        r = self.ranking.novelty_ratio()
        return float(r.min()) if len(r) else None

    @property
    def mean_novelty_ratio(self) -> float | None:
        """Exit 3's statistic (docs/design.md §3.7 "Novelty ratio"); None for an empty envelope."""
        r = self.ranking.novelty_ratio()
        return float(r.mean()) if len(r) else None


def greedy_pack(token_costs: np.ndarray, budget: int) -> np.ndarray:
    """Positions (in ranking order) of the facts that fit when taken greedily, skipping misfits.

    Vectorised over runs: a cumulative sum finds how far the next facts fit as they are; only
    a fact that overflows needs a decision, and at most one per remaining-budget change.
    """
    costs = np.asarray(token_costs, dtype=np.int64)
    if budget <= 0 or costs.size == 0:
        return np.zeros(0, dtype=np.int64)
    chosen: list[np.ndarray] = []
    start, left = 0, int(budget)
    while start < costs.size:
        fitting = np.flatnonzero(costs[start:] <= left)
        if fitting.size == 0:
            break
        start += int(fitting[0])  # skip the facts that cannot fit any more
        run = np.cumsum(costs[start:])
        fit = int(np.searchsorted(run, left, side="right"))  # >= 1: costs[start] fits
        chosen.append(np.arange(start, start + fit))
        left -= int(run[fit - 1])
        start += fit
    return np.concatenate(chosen) if chosen else np.zeros(0, dtype=np.int64)


def first_and_last_layout(n: int) -> np.ndarray:
    """Order of positions 0..n-1 (best first) laid out so the best sit at both ends."""
    order = np.empty(n, dtype=np.int64)
    front = np.arange(0, n, 2)
    back = np.arange(1, n, 2)
    order[: len(front)] = front
    order[len(front):] = back[::-1]
    return order


def pack(
    ranking: Ranking,
    fact_ids: Sequence[str] | Callable[[np.ndarray], Sequence[str]],
    content_tokens: np.ndarray,
    budget: Budget,
    anchor: str,
    max_facts: int | None = None,
    costs_of: Callable[[np.ndarray], np.ndarray] | None = None,
) -> Envelope:
    """Greedy packing of ranked facts into the budget. `content_tokens` is aligned with
    `ranking.indices`; `fact_ids` is too, or is a lookup from `ranking.indices` values to ids,
    called for the packed facts only (ids of facts left out are never fetched).

    Each fact costs its `content_tokens` plus `FACT_FRAMING_TOKENS`, or, with `costs_of`
    (`ranking.indices` values → each fact's whole cost in the prompt, its label included),
    what `costs_of` says: asked only for the facts a packing takes, and the packing redone
    with those costs until every fact it takes has been counted. So the result is the greedy
    packing of the counted costs (a fact not counted was skipped at a cost no higher than
    its own), without counting the labels of every candidate."""
    costs = np.asarray(content_tokens, dtype=np.int64) + FACT_FRAMING_TOKENS
    if costs.shape[0] != len(ranking):
        raise InvalidInputError("content_tokens must be aligned with the ranking")
    counted = np.zeros(costs.shape[0], dtype=bool)
    while True:
        taken = greedy_pack(costs, budget.envelope)
        if max_facts is not None:
            taken = taken[:max_facts]
        if costs_of is None:
            break
        new = taken[~counted[taken]]
        if not new.size:
            break
        costs[new] = np.asarray(costs_of(ranking.indices[new]), dtype=np.int64)
        counted[new] = True
    layout = taken[first_and_last_layout(len(taken))]
    return Envelope(
        ranking=ranking.take(layout),
        fact_ids=(
            list(fact_ids(ranking.indices[layout]))
            if callable(fact_ids)
            else [fact_ids[i] for i in layout]
        ),
        tokens=costs[layout],
        budget=budget,
        anchor=anchor,
        skipped=int(len(ranking) - len(taken)) if max_facts is None else 0,
    )
