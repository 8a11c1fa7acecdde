"""Checkpoints of the LLM quality benchmark: one JSON file per finished (task, arm) run.

A window of the reference model costs minutes on a loaded 2-core machine, so a benchmark of
a hundred windows is interrupted more often than not. Each finished run is written at once
(atomically: a temporary file renamed over the target), keyed by the run's settings, so
`--resume` skips exactly the runs whose file exists with the same settings and reruns any
whose settings changed. A run is only ever saved whole: a half-written run is rerun.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

_SAFE = re.compile(r"[^A-Za-z0-9._-]+")


def settings_key(settings: Mapping[str, Any]) -> str:
    """A short digest of the settings a run depends on (model, context, tokens, windows…):
    a checkpoint made with other settings is not this run's."""
    blob = json.dumps(dict(settings), sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def run_path(directory: Path, task: str, arm: str) -> Path:
    """Where the run of `arm` on `task` is checkpointed (names made file-safe)."""
    return directory / f"{_SAFE.sub('_', task)}__{_SAFE.sub('_', arm)}.json"


def save_run(directory: Path, run: Mapping[str, Any]) -> Path:
    """Write one finished run (it must name its `task`, `arm` and `settings_key`)."""
    for k in ("task", "arm", "settings_key", "windows"):
        if k not in run:
            raise ValueError(f"run checkpoint lacks {k!r}")
    directory.mkdir(parents=True, exist_ok=True)
    path = run_path(directory, run["task"], run["arm"])
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(run, indent=1), "utf-8")
    os.replace(tmp, path)
    return path


def load_run(directory: Path, task: str, arm: str, key: str, complete_only: bool = True
             ) -> dict[str, Any] | None:
    """The checkpoint of (task, arm) if it exists, parses and was made with settings `key`
    (and, with `complete_only`, ran to its end: an interrupted run is run again whole)."""
    path = run_path(directory, task, arm)
    try:
        data = json.loads(path.read_text("utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("settings_key") != key:
        return None
    if complete_only and not data.get("complete", False):
        return None
    return data


def pending(directory: Path, pairs: Iterable[tuple[str, str]], key: str,
            resume: bool) -> list[tuple[str, str]]:
    """The (task, arm) pairs still to run, in the order given: all of them without `resume`,
    else those with no valid checkpoint for settings `key`."""
    pairs = list(pairs)
    if not resume:
        return pairs
    return [(t, a) for t, a in pairs if load_run(directory, t, a, key) is None]


def finished(directory: Path, pairs: Iterable[tuple[str, str]], key: str,
             complete_only: bool = True) -> list[dict[str, Any]]:
    """The checkpointed runs among `pairs` made with settings `key`, in the order given."""
    out = []
    for t, a in pairs:
        run = load_run(directory, t, a, key, complete_only)
        if run is not None:
            out.append(run)
    return out


def _alive(pid: Any) -> bool:
    try:
        os.kill(int(pid), 0)
    except (OSError, TypeError, ValueError):
        return False
    return True


def taken(directory: Path, task: str, arm: str, key: str) -> bool:
    """Whether (task, arm) needs no start here: complete, or in progress in a live process
    (its checkpoint names the pid). Checked just before a run starts, so workers sharing a
    checkpoint directory do not write the same run twice."""
    run = load_run(directory, task, arm, key, complete_only=False)
    if run is None:
        return False
    return bool(run.get("complete")) or (run.get("pid") != os.getpid() and _alive(run.get("pid")))
