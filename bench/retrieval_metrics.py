"""Per-window retrieval measures of one run (issue 21 §5): is the envelope the task's own
material, is it new, how much of the task's document has been sent, and did the run stop
when that material ran out?

Pure functions over fact ids, so they are tested on exact small cases
(`tests/test_bench_retrieval.py`) and every arm is measured the same way.

Words used here:
- *own facts*: the facts of the task's own document (the page the task was made from);
- *sent*: in the envelope of a window that was written (a window the loop closed unwritten —
  empty or stale envelope — handed nothing to the writer);
- *on-topic share*: own facts / envelope facts; *fresh share*: facts not sent in an earlier
  window / envelope facts;
- *stale window*: a written window whose fresh share is below `STALE_BELOW` (25%);
- *own pool*: the own facts that pass the arm's relevance gate (Phase 1's selection); it
  *ran out* at the first window after which all of them had been sent.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Hashable, Sequence
from dataclasses import dataclass

STALE_BELOW = 0.25
LIMIT_REASON = "limit-reached"  # the loop's status when it stops at its window limit


@dataclass(frozen=True)
class WindowMeasure:
    """One window of one run."""

    window: int  # 1-based
    written: bool  # the writer got this envelope (it was not closed unwritten)
    envelope: int  # facts in the envelope
    on_topic: float  # share of envelope facts from the task's own document (NaN: empty)
    fresh: float  # share of envelope facts not sent in an earlier window (NaN: empty)
    own_recall: float  # own facts sent so far (this window included) / own facts
    pool_recall: float  # own-pool facts sent so far / own-pool facts (NaN: empty pool)

    @property
    def stale(self) -> bool:
        return self.written and not math.isnan(self.fresh) and self.fresh < STALE_BELOW


def _share(part: int, whole: int) -> float:
    return part / whole if whole else math.nan


def window_measures(
    envelopes: Sequence[Sequence[Hashable]],
    written: Sequence[bool],
    own: Collection[Hashable],
    own_pool: Collection[Hashable] = (),
) -> list[WindowMeasure]:
    """The measures of every window, in order.

    `envelopes[i]` holds the facts (CKF rows or ids) of window i+1's envelope; `written[i]`
    says whether it was sent to the writer; `own` is the task document's facts, `own_pool`
    those of them past the gate. A fact repeated within one envelope counts once."""
    if len(envelopes) != len(written):
        raise ValueError(f"{len(envelopes)} envelopes but {len(written)} written flags")
    own_set, pool_set = set(own), set(own_pool)
    if not pool_set <= own_set:
        raise ValueError("the own pool must be a subset of the own facts")
    sent: set[Hashable] = set()
    out = []
    for i, (env, w) in enumerate(zip(envelopes, written, strict=True)):
        ids = list(dict.fromkeys(env))
        n = len(ids)
        on = sum(1 for f in ids if f in own_set)
        fresh = sum(1 for f in ids if f not in sent)
        if w:
            sent.update(ids)
        out.append(WindowMeasure(
            window=i + 1, written=bool(w), envelope=n, on_topic=_share(on, n),
            fresh=_share(fresh, n), own_recall=_share(len(sent & own_set), len(own_set)),
            pool_recall=_share(len(sent & pool_set), len(pool_set)),
        ))
    return out


def pool_ran_out(measures: Sequence[WindowMeasure]) -> int | None:
    """The window after which every own-pool fact had been sent (None: never, or no pool)."""
    for m in measures:
        if m.pool_recall >= 1.0:
            return m.window
    return None


@dataclass(frozen=True)
class RunSummary:
    """One run's figures for the report's table."""

    w1_on_topic: float
    later_on_topic: float  # mean over written windows 2+ (NaN: none)
    later_fresh: float  # mean over written windows 2+ (NaN: none)
    own_recall_end: float
    pool_recall_end: float
    stale_windows: int  # written windows with fresh share < 25%
    written_windows: int
    exit_window: int | None  # the window whose status was an exit (None: no exit)
    exit_reason: str
    ran_out: int | None  # `pool_ran_out`
    exit_lag: int | None  # exit_window - ran_out (None when either is None)
    on_topic_slope: float  # least-squares slope of on-topic share over written windows 2+

    @property
    def exit_timing(self) -> str:
        """How the exit relates to the own pool running out (the issue's target: exit within
        one window after it ran out)."""
        if self.exit_window is None or self.exit_reason == LIMIT_REASON:
            return "window limit" if self.ran_out is None else "window limit after pool ran out"
        if self.ran_out is None:
            return "before pool ran out"
        if self.exit_lag is not None and 0 <= self.exit_lag <= 1:
            return "on time"
        return "late" if (self.exit_lag or 0) > 1 else "before pool ran out"


def _mean(values: Sequence[float]) -> float:
    vals = [v for v in values if not math.isnan(v)]
    return sum(vals) / len(vals) if vals else math.nan


def slope(values: Sequence[float]) -> float:
    """Least-squares slope per window of `values` (NaNs left out; NaN under two points)."""
    pts = [(i, v) for i, v in enumerate(values) if not math.isnan(v)]
    if len(pts) < 2:
        return math.nan
    mx = sum(i for i, _ in pts) / len(pts)
    my = sum(v for _, v in pts) / len(pts)
    den = sum((i - mx) ** 2 for i, _ in pts)
    return sum((i - mx) * (v - my) for i, v in pts) / den


def summarise(measures: Sequence[WindowMeasure], statuses: Sequence[str],
              in_progress: str = "in-progress") -> RunSummary:
    """A run's summary from its window measures and the loop's status after each window."""
    if len(measures) != len(statuses):
        raise ValueError(f"{len(measures)} windows but {len(statuses)} statuses")
    if not measures:
        return RunSummary(math.nan, math.nan, math.nan, 0.0, math.nan, 0, 0, None, "none",
                          None, None, math.nan)
    later = [m for m in measures[1:] if m.written]
    exit_window = next((i + 1 for i, s in enumerate(statuses) if s != in_progress), None)
    reason = statuses[exit_window - 1] if exit_window is not None else "max-windows"
    ran_out = pool_ran_out(measures)
    lag = exit_window - ran_out if exit_window is not None and ran_out is not None else None
    return RunSummary(
        w1_on_topic=measures[0].on_topic,
        later_on_topic=_mean([m.on_topic for m in later]),
        later_fresh=_mean([m.fresh for m in later]),
        own_recall_end=measures[-1].own_recall,
        pool_recall_end=measures[-1].pool_recall,
        stale_windows=sum(1 for m in measures if m.stale),
        written_windows=sum(1 for m in measures if m.written),
        exit_window=exit_window,
        exit_reason=reason,
        ran_out=ran_out,
        exit_lag=lag,
        on_topic_slope=slope([m.on_topic for m in later]),
    )
