"""Per-window rows shared by the long-document reports (`long.py`, `long_llm.py`,
`long_llm_causes.py`): the mean that skips missing measures, and one arm's windows at a given
depth, so each report's table loops read the same rows the same way."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any


def nan_mean(xs: Iterable[Any]) -> float:
    """Mean of the values present: a window without a measure (None or NaN) is left out rather
    than counted as zero; NaN when none is present."""
    vals = [float(x) for x in xs if x is not None and not (isinstance(x, float) and math.isnan(x))]
    return statistics.fmean(vals) if vals else math.nan


def arm_windows(runs: Sequence[dict[str, Any]], arm: str, i: int, *,
                written_only: bool = False) -> list[dict[str, Any]]:
    """Window i (0-based) of every run of `arm` that reached it; with `written_only`, only
    windows that wrote words."""
    return [r["windows"][i] for r in runs if r["arm"] == arm and len(r["windows"]) > i
            and (not written_only or r["windows"][i].get("words"))]


def window_means(runs: Sequence[dict[str, Any]], arms: Sequence[str], *,
                 written_only: bool = False
                 ) -> Iterator[tuple[int, str, int, Callable[[str], float]]]:
    """(window number from 1, arm, runs that reached it, mean of a measure over them) for each
    window depth and arm that has windows: the rows of a per-window table."""
    deepest = max((len(r["windows"]) for r in runs), default=0)
    for i in range(deepest):
        for arm in arms:
            ws = arm_windows(runs, arm, i, written_only=written_only)
            if ws:
                yield i + 1, arm, len(ws), lambda k, ws=ws: nan_mean(w.get(k) for w in ws)
