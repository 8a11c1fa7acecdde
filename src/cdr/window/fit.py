"""Envelopes sized to the window (`envelope: "fit"`, not in CRP-SPEC-024).

The spec packs ranked facts until the envelope budget E = C − S − T − G is spent. At a 4k
context that is ~50 facts, while a window of G = 1024 tokens has room for ~12 of them: the rest
are prompt tokens paid for and not used (and, without fact memory, sent again next window).
With `fit` the envelope holds about as many facts as the window's planned words can use:

    facts = max(FIT_MIN_FACTS, ceil(FIT_FACTS_PER_WORD × planned words))
    planned words = min(Σ remaining target words of the planned sections, WORDS_PER_TOKEN × G)

and the rest of E is simply not spent. The ratio is calibrated from what the writer actually
used on the quality benchmark (bench/results/quality.md, "Envelopes sized to the window"):
facts written per word written, times a margin for facts the plan cannot place.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from cdr.coverage import SubQuery
from cdr.errors import InvalidInputError

# Measured on the quality benchmark (extractive writer, spec-default CDR, 16 tasks × 5
# windows, bench/results/quality.md): the text runs 0.70 words per cl100k completion token
# and each fact the writer used carries 36.6 words. The margin (×1.1) covers facts the plan
# puts under a section the window does not reach; × 2/3 and × 2 were measured too.
WORDS_PER_TOKEN = 0.70
WORDS_PER_WRITTEN_FACT = 36.6
FIT_MARGIN = 1.1
FIT_FACTS_PER_WORD = FIT_MARGIN / WORDS_PER_WRITTEN_FACT
FIT_MIN_FACTS = 4
MIN_SECTION_WORDS = 40  # the loop's plan never asks for fewer words per section


def planned_words(sub_queries: Sequence[SubQuery], cumulative_depth: Mapping[str, float]) -> int:
    """Words the planned sections still need: the loop's per-section targets, summed."""
    return sum(max(round(sq.expected_words * (1.0 - min(cumulative_depth.get(sq.id, 0.0), 1.0))),
                   MIN_SECTION_WORDS)
               for sq in sub_queries)


def fit_facts(planned: int, generation_tokens: int,
              facts_per_word: float = FIT_FACTS_PER_WORD) -> int:
    """How many facts a window that plans `planned` words within `generation_tokens` can use."""
    if generation_tokens <= 0:
        raise InvalidInputError(f"generation tokens must be positive, got {generation_tokens}")
    if not math.isfinite(facts_per_word) or facts_per_word <= 0:
        raise InvalidInputError(f"facts per word must be positive, got {facts_per_word}")
    words = min(max(planned, 0), WORDS_PER_TOKEN * generation_tokens)
    return max(FIT_MIN_FACTS, math.ceil(facts_per_word * words))
