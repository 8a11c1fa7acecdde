"""A stop on stale envelopes (`stale: "stop"`, not in CRP-SPEC-024).

Exit 3 (§6) reads staleness off the novelty ratio, which compares a candidate with the Coverage
Set, and the Coverage Set holds *sub-query* embeddings. A fact sent in every window but never
written (an off-topic fact that passes the gate, say) adds nothing to the Coverage Set, so its
novelty never falls and Exit 3 never sees that the run is sending the same material again: the
spec-exact loop writes window after window from an envelope earlier windows already got
(docs/retrieval.md, "Relevance means the task's own material"). The trace shows it for every run
as each window's `sent_before` share.

With `stale: "stop"` the session remembers which facts it sent (by fact id, `cdr.fact_memory`) and
a window whose envelope is at least `STALE_SHARE` facts sent before ends the run unwritten with
`ckf-exhausted` and its onboarding hint: the task's own material has run out, and writing on
would only repeat it.
"""

from __future__ import annotations

from collections.abc import Container, Sequence

# A window is stale when at most a quarter of its envelope is new to the run: the benchmark's
# "stale window" line (fresh share < 25%).
STALE_SHARE = 0.75


def sent_before_share(fact_ids: Sequence[str], sent: Container[str]) -> float | None:
    """The share of an envelope's facts an earlier window was already sent; None when the
    envelope is empty."""
    if not fact_ids:
        return None
    return sum(1 for f in fact_ids if f in sent) / len(fact_ids)


def is_stale(fact_ids: Sequence[str], sent: Container[str],
             threshold: float = STALE_SHARE) -> bool:
    """True when the envelope is mostly what earlier windows got (and it is not empty: an
    empty envelope is Exit 3 by itself)."""
    share = sent_before_share(fact_ids, sent)
    return share is not None and share >= threshold


def sent_before_per_window(envelopes: Sequence[Sequence[str]]) -> list[float | None]:
    """For a run's envelopes in window order, each one's `sent_before_share` against the
    envelopes before it (what the trace shows per window)."""
    seen: set[str] = set()
    out: list[float | None] = []
    for ids in envelopes:
        out.append(sent_before_share(ids, seen))
        seen.update(ids)
    return out
