"""Progress of long CKF work (ingest, re-embedding) on stderr: a bar on a terminal, plain
lines otherwise; both show the stage's rate (facts/s while embedding) and the time left.

A rich bar on a console that is not a terminal (a CI log, `2> ingest.log`, a pipe into
`tee`) draws nothing until it ends, so a 5-minute ingest looked hung. Off a terminal each
stage prints a line when it starts, every `LINE_SECONDS` while it runs, and when it ends:
how many of how many, the rate and the time left, which a log keeps and a person can grep.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)

LINE_SECONDS = 10.0
STAGE_LABELS = {"read": "reading documents", "embed": "embedding facts"}
StageProgress = Callable[[str, int, int], None]


def speed_text(done: int, total: int, seconds: float, unit: str) -> str:
    """`58 facts/s, about 6 min left`: the mean rate since the stage started and the time the
    rest takes at it ("" before anything is done, no time left once `total` is reached or
    when it is unknown)."""
    if seconds <= 0 or done <= 0:
        return ""
    rate = done / seconds
    parts = [f"{rate:,.0f} {unit}/s" if rate >= 10 else f"{rate:,.1f} {unit}/s"]
    if total > done:
        left = (total - done) / rate
        parts.append(f"about {left / 60:.0f} min left" if left >= 90
                     else f"about {left:.0f} s left")
    return ", ".join(parts)


def rate_text(done: int, total: int, seconds: float, unit: str) -> str:
    """`1,200/23,000 (5%), 58 facts/s, about 6 min left` (parts left out when unknown)."""
    count = f"{done:,}/{total:,} ({100 * done // total}%)" if total else f"{done:,}"
    speed = speed_text(done, total, seconds, unit)
    return f"{count}, {speed}" if speed else count


def _complete(done: int, total: int) -> bool:
    return bool(total) and done >= total


def _unit(stage: str) -> str:
    return "documents" if stage == "read" else "facts" if "fact" in stage or stage == "embed" \
        else "items"


class _Bar:
    """Stage progress as rich bars, one per stage, with the stage's rate and time left
    (`speed_text`: from the stage's own estimate of its total, which ingest revises as it
    reads documents; rich's own remaining-time column, from the last seconds' speed against
    a total that moves, showed nothing or jumped)."""

    def __init__(self, progress: Progress, clock: Callable[[], float] = time.monotonic) -> None:
        self.progress = progress
        self.clock = clock
        self.tasks: dict[str, tuple[TaskID, float]] = {}

    def __call__(self, stage: str, done: int, total: int) -> None:
        now = self.clock()
        if stage not in self.tasks:
            task = self.progress.add_task(STAGE_LABELS.get(stage, stage), total=total or None,
                                          rate="")
            self.tasks[stage] = (task, now)
        task, started = self.tasks[stage]
        seconds = now - started
        rate = speed_text(done, total, seconds, _unit(stage)) if seconds > 1 else ""
        self.progress.update(task, completed=done, total=total or None, rate=rate)


class _Lines:
    """Stage progress as plain lines (see the module's docstring)."""

    def __init__(self, console: Console, clock: Callable[[], float] = time.monotonic) -> None:
        self.console = console
        self.clock = clock
        self.stages: dict[str, list[float]] = {}  # stage -> [started, last line]
        self.last: tuple[str, int, int] | None = None

    def __call__(self, stage: str, done: int, total: int) -> None:
        now = self.clock()
        if self.last is not None and self.last[0] != stage and not _complete(*self.last[1:]):
            self._line(*self.last, now)  # the stage before ended
        if stage not in self.stages:
            self.stages[stage] = [now, now]
            self.console.print(f"{STAGE_LABELS.get(stage, stage)}: started", markup=False,
                               highlight=False)
        elif now - self.stages[stage][1] >= LINE_SECONDS or _complete(done, total):
            self._line(stage, done, total, now)
        self.last = (stage, done, total)

    def _line(self, stage: str, done: int, total: int, now: float) -> None:
        started, _ = self.stages[stage]
        self.stages[stage][1] = now
        self.console.print(f"{STAGE_LABELS.get(stage, stage)}: "
                           f"{rate_text(done, total, now - started, _unit(stage))}",
                           markup=False, highlight=False)

    def finish(self) -> None:
        if self.last is not None:
            stage, done, total = self.last
            if not _complete(done, total):
                self._line(stage, done, total, self.clock())


@contextmanager
def stage_progress(console: Console, *, disable: bool = False) -> Iterator[StageProgress]:
    """A `progress(stage, done, total)` callback for ingest: bars on a terminal, lines
    elsewhere, nothing when `disable` (`--json`)."""
    if disable:
        yield lambda _stage, _done, _total: None
        return
    if not console.is_terminal:
        lines = _Lines(console)
        yield lines
        lines.finish()
        return
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), TextColumn("{task.fields[rate]}"),
                  console=console, transient=True) as bar:
        yield _Bar(bar)
