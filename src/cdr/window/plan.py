"""`plan: "packed"` (cdr.options): a model writer's window plans only sections its envelope holds
facts of.

With the spec's planning a window asks for the leading open sections of the outline that its
words cover, and every packed fact is assigned among those. When the envelope holds nothing
of them (its facts are another section's, or the leading section's facts went out earlier),
the model is asked for a section it has no facts for and writes it from memory: with
`--profile focused` on two Python-docs pages, 6 of 10 windows held at most one fact of the
section they named, and those windows grounded 42.6% of their sentences against 87.2% in the
others (docs/retrieval.md, "Why `focused` grounds less on two pages").

Here each packed fact is owned by its closest open section (the plan's own assignment), and
only sections owning at least `PLAN_MIN_FACTS` of the window's facts may be planned, in
outline order, as many as the window's words cover (`fit_plan`, as before). When no section
owns that many, the sections owning the most do (the envelope is what the window has to write
from); when none owns any (every fact below `plan_min_similarity`), the spec's planning
stands. The words asked per planned section are the length contract's, unchanged: only which
sections are asked for changes.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np

# Facts a section must own in a window's envelope to be planned. Chosen on the retrieval
# benchmark's TUNE split (bench/focused_plan.py, bench/results/focused_plan.md).
PLAN_MIN_FACTS = 4


# A heading's own number ("3.3.1. Basic customization"): an outline line names the section
# without it as often as with it.
_NUMBER = re.compile(r"^\d+(?:\.\d+)*\.?\s+")


def heading_key(text: str) -> str:
    """A heading or outline line as compared: its number, case and spacing aside."""
    return _NUMBER.sub("", " ".join(text.split())).casefold()


def label_owners(sections: Sequence[str], titles: Sequence[str]) -> np.ndarray:
    """Per fact, the position among `titles` of the deepest part of its section path
    ("Page > Section > Subsection") that is one of them, word for word (`heading_key`: its
    number, case and spacing aside); −1 when none is.

    A fact's heading is what decides its section when the outline names the document's own
    headings (an outline decomposed from the CKF is made of them): on the retrieval
    benchmark's TUNE pages the closest sub-query by cosine was another section for most of a
    window's facts (bench/results/focused_plan.md)."""
    where: dict[str, int] = {}
    for j, t in enumerate(titles):
        where.setdefault(heading_key(t), j)
    out = np.full(len(sections), -1, dtype=np.int64)
    for i, path in enumerate(sections):
        for part in reversed((path or "").split(" > ")):
            at = where.get(heading_key(part))
            if at is not None:
                out[i] = at
                break
    return out


def owning_sections(owner: np.ndarray, n_sections: int, min_facts: int = PLAN_MIN_FACTS
                    ) -> list[int]:
    """Positions of the sections that may be planned, those owning the most facts first
    (ties in outline order).

    `owner[i]` is the position of packed fact i's section among the `n_sections` open ones,
    or −1 when it has none. Sections owning at least `min_facts` facts; else those owning the
    most, when that is at least one; else none."""
    if min_facts < 1:
        raise ValueError(f"min_facts must be at least 1, got {min_facts}")
    owned = np.asarray(owner, dtype=np.int64)
    counts = np.bincount(owned[owned >= 0], minlength=n_sections)[:n_sections]
    if not len(counts) or counts.max(initial=0) < 1:
        return []
    floor = min(min_facts, int(counts.max()))
    keep = np.flatnonzero(counts >= floor)
    return [int(j) for j in keep[np.argsort(-counts[keep], kind="stable")]]
