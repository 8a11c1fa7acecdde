"""Length fidelity: the words a run was asked for against the words it delivered.

`--words N` is what a user asked for. Two things are measured against it:

- LongBench-Write's length score (Bai et al., 2024, "LongWriter"), x words asked, y delivered:

      S_l = 100 · max(0, 1 − (y/x − 1)/3)   when y > x
      S_l = 100 · max(0, 1 − (x/y − 1)/2)   otherwise

  It forgives running long more than running short (a third against a half); 0 words score 0.
  It is computed with exact fractions, so 1,600 of 1,000 is 80.0, not 79.99…
- the window capacity: a run of W windows of G generated tokens can carry at most about
  W · G · w words, w being the writer's words per token. When N is beyond it the run cannot
  keep the contract whatever the knowledge base holds, and the CLI says so before it starts.

Words are counted as LongBench-Write counts English output (and the quality benchmarks count
"words/run"): whitespace-separated tokens of the windows' text, headings included.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from cdr.errors import InvalidInputError

# The stop rule is one of the session's exits, so it lives with them in `cdr.session`; it is
# importable from here too, beside the rest of the length contract.
from cdr.options import MAX_WINDOWS_LIMIT
from cdr.session import LENGTH_TOLERANCE
from cdr.session import contract_met as contract_met
from cdr.text.tokens import LLM_WORDS_PER_TOKEN
from cdr.window.fit import MIN_SECTION_WORDS, WORDS_PER_TOKEN


def writer_words_per_token(writer: Any) -> float:
    """The words a `writer` writes per completion token: its own `words_per_token` when it
    declares one (measured for that writer), else the extractive writer's for a writer that
    pastes facts and the reference model's for any other (a language model)."""
    declared = getattr(writer, "words_per_token", None)
    if isinstance(declared, int | float) and not isinstance(declared, bool):
        if not math.isfinite(declared) or declared <= 0:
            raise InvalidInputError(f"words per token must be positive, got {declared}")
        return float(declared)
    from cdr.writers.base import pastes_facts

    return WORDS_PER_TOKEN if pastes_facts(writer) else LLM_WORDS_PER_TOKEN


# ---------------------------------------------------------------------- the length contract
#
# `length: "contract"` (cdr.options). With N words asked and D delivered so far:
#
#   owed            = max(0, N − D)
#   window budget   = min(owed, ⌊G · w⌋)            G generation tokens, w the writer's words/token
#                     (and, for a model writer, at most what the envelope grounds: below)
#   section share   = owed · r_s / Σ r              r_s the section's remaining expected words
#                                                  (sections not written whole yet)
#   met             = D ≥ ⌈(1 − 0.15) · N⌉          the run ends task-complete
#
# So the words asked are spread over the windows by what each can carry, a section's share
# grows when earlier sections came out shorter than asked (and shrinks when longer), and the
# run stops on the band instead of running to its window limit.


def words_owed(asked: int, delivered: int) -> int:
    """The words the run still owes: never negative."""
    return max(0, int(asked) - int(delivered))


def window_budget(asked: int, delivered: int, generation_tokens: int,
                  words_per_token: float) -> int:
    """Words this window is planned for: what is still owed, at most what its generation
    budget carries (⌊G · w⌋); at least 1, so a window is never planned for nothing."""
    _check_budget(generation_tokens, words_per_token)
    carry = math.floor(generation_tokens * words_per_token)
    return max(1, min(words_owed(asked, delivered), carry))


# ------------------------------------------------------------------ what the envelope grounds
#
# A window is asked for its share of the owed words, but a model writer can only ground what
# its envelope carries: the stale stop of `focused` packs the candidates never sent, and the
# last of them may be one fact. Asked for a full section from one fact, the reference model
# wrote it from memory (listxattr, Window 2: 1 fact of 93 words, 122 words asked, 245 written,
# grounding 44.4%; docs/retrieval.md). So, for a writer that does not paste facts:
#
#   grounds        = ⌊GROUNDED_WORDS_PER_FACT_WORD · words of the envelope's facts⌋
#   window budget  = min(owed, ⌊G · w⌋, grounds)
#   grounds < MIN_SECTION_WORDS  →  the window is not written: ckf-exhausted
#
# The ratio was read on the TUNE split (`bench/thin_envelope.py`,
# bench/results/thin_envelope.md): the largest words-asked-per-envelope-fact-word of a
# well-grounded TUNE window (0.328), rounded up, so the cap never binds on a full envelope of
# the kind those windows had. No TUNE window was thin: it is the edge of what was seen
# grounded, not a measured failure point.
GROUNDED_WORDS_PER_FACT_WORD = 0.4


def envelope_words(contents: Iterable[str]) -> int:
    """Words of the facts an envelope carries (whitespace-separated, as output is counted)."""
    return sum(len(c.split()) for c in contents)


def grounded_words(fact_words: int, ratio: float = GROUNDED_WORDS_PER_FACT_WORD) -> int:
    """The most words a window may be asked for from an envelope of `fact_words` words."""
    if fact_words < 0:
        raise InvalidInputError(f"fact words must be non-negative, got {fact_words}")
    if not math.isfinite(ratio) or ratio <= 0:
        raise InvalidInputError(f"grounded words per fact word must be positive, got {ratio}")
    return math.floor(ratio * fact_words)


def too_thin(grounds: int) -> bool:
    """Whether an envelope that grounds `grounds` words cannot ground even a minimal section
    (`cdr.window.fit.MIN_SECTION_WORDS`, the plan's smallest ask): the window is not written."""
    return grounds < MIN_SECTION_WORDS


def grounded_budget(budget: int, grounds: int) -> int:
    """The window budget capped by what the envelope grounds (at least 1, as `window_budget`)."""
    return max(1, min(int(budget), int(grounds)))


def section_shares(remaining: Sequence[int], owed: int) -> list[int]:
    """The owed words split over the open sections in proportion to their remaining expected
    words (largest remainders, so the shares sum to `owed` exactly). All-zero remainders
    split evenly."""
    if owed < 0:
        raise InvalidInputError(f"owed words must be non-negative, got {owed}")
    if not remaining:
        return []
    if any(r < 0 for r in remaining):
        raise InvalidInputError(f"remaining words must be non-negative, got {list(remaining)}")
    weights = [Fraction(r) for r in remaining] if sum(remaining) else [Fraction(1)] * len(
        remaining)
    total = sum(weights)
    exact = [owed * w / total for w in weights]
    shares = [math.floor(x) for x in exact]
    order = sorted(range(len(exact)), key=lambda i: (-(exact[i] - shares[i]), i))
    for i in order[: owed - sum(shares)]:
        shares[i] += 1
    return shares


def length_score(asked: int, delivered: int) -> float:
    """LongBench-Write's S_l for `delivered` words against `asked` (0–100)."""
    if isinstance(asked, bool) or not isinstance(asked, int) or asked < 1:
        raise InvalidInputError(f"words asked must be a positive integer, got {asked!r}")
    if isinstance(delivered, bool) or not isinstance(delivered, int) or delivered < 0:
        raise InvalidInputError(
            f"words delivered must be a non-negative integer, got {delivered!r}")
    if delivered == 0:
        return 0.0
    x, y = Fraction(asked), Fraction(delivered)
    s = 1 - (y / x - 1) / 3 if y > x else 1 - (x / y - 1) / 2
    return float(100 * max(Fraction(0), s))


def count_words(texts: Iterable[str]) -> int:
    """Whitespace-separated words over `texts` (the windows' outputs)."""
    return sum(len(t.split()) for t in texts)


def within_tolerance(asked: int, delivered: int, tolerance: float = LENGTH_TOLERANCE) -> bool:
    """Whether `delivered` is within ±`tolerance` of `asked` (the length contract)."""
    if asked < 1:
        raise InvalidInputError(f"words asked must be positive, got {asked}")
    return abs(delivered - asked) <= tolerance * asked


def window_capacity(max_windows: int, generation_tokens: int,
                    words_per_token: float = LLM_WORDS_PER_TOKEN) -> int:
    """The most words `max_windows` windows of `generation_tokens` tokens can carry."""
    _check_budget(generation_tokens, words_per_token)
    if max_windows < 1:
        raise InvalidInputError(f"windows must be positive, got {max_windows}")
    return math.floor(max_windows * generation_tokens * words_per_token)


def windows_needed(words: int, generation_tokens: int,
                   words_per_token: float = LLM_WORDS_PER_TOKEN) -> int:
    """The fewest windows of `generation_tokens` tokens that can carry `words` words."""
    _check_budget(generation_tokens, words_per_token)
    if words < 1:
        raise InvalidInputError(f"words must be positive, got {words}")
    return math.ceil(words / (generation_tokens * words_per_token))


def fitted_windows(words: int, generation_tokens: int, windows: int,
                   words_per_token: float = LLM_WORDS_PER_TOKEN) -> int:
    """`--fit-windows`: the window limit raised to what `words` needs, capped at the spec's
    20 (Exit 2 still ends the run there); a larger `windows` is kept. The window limit is the
    user's setting, so this changes no exit rule, only the limit Exit 2 reads."""
    need = windows_needed(words, generation_tokens, words_per_token)
    return max(windows, min(need, MAX_WINDOWS_LIMIT))


def _check_budget(generation_tokens: int, words_per_token: float) -> None:
    if generation_tokens < 1:
        raise InvalidInputError(f"generation tokens must be positive, got {generation_tokens}")
    if not math.isfinite(words_per_token) or words_per_token <= 0:
        raise InvalidInputError(f"words per token must be positive, got {words_per_token}")


def capacity_warning(words: int, max_windows: int, generation_tokens: int,
                     words_per_token: float = LLM_WORDS_PER_TOKEN) -> str | None:
    """One line when `words` is beyond what the windows can carry, else None."""
    cap = window_capacity(max_windows, generation_tokens, words_per_token)
    if words <= cap * (1 + LENGTH_TOLERANCE):
        return None
    need = windows_needed(words, generation_tokens, words_per_token)
    return (f"--words {words} is more than {max_windows} window(s) of {generation_tokens} "
            f"tokens can carry (about {cap} words at {words_per_token} words a token); "
            f"use --windows {need} or more (--fit-windows), or a larger --generation-tokens")


@dataclass(frozen=True)
class LengthReport:
    """A run's words against the words asked: the trace's optional `length` field."""

    asked: int
    delivered: int

    @property
    def score(self) -> float:
        return length_score(self.asked, self.delivered)

    @property
    def ratio(self) -> float:
        return self.delivered / self.asked

    @property
    def within(self) -> bool:
        return within_tolerance(self.asked, self.delivered)

    def to_dict(self) -> dict[str, Any]:
        return {"asked": self.asked, "delivered": self.delivered,
                "ratio": round(self.ratio, 4), "score": round(self.score, 2),
                "within_tolerance": self.within}

    def summary(self) -> str:
        """The CLI's summary part: words delivered / asked and the length score."""
        return (f"words {self.delivered}/{self.asked} ({self.ratio:.0%})  "
                f"length score {self.score:.1f}")


def run_length(expected_words: Sequence[int], outputs: Iterable[str]) -> LengthReport:
    """The length report of a run whose sub-queries expect `expected_words` (they split the
    words asked exactly: `cdr.window.dpe.split_words`) and whose windows wrote `outputs`."""
    return LengthReport(int(sum(expected_words)), count_words(outputs))
