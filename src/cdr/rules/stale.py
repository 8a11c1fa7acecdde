"""The stale stop (`stale`): ``"write"`` (spec: a window is written whatever its envelope holds,
until an exit fires) or ``"stop"``: a window whose envelope is mostly facts earlier windows were
already sent ends the run with `ckf-exhausted`, unwritten."""

from __future__ import annotations

from cdr.rules.rule import Rule

RULE = Rule(
    name="stale",
    choices=("write", "stop"),
    meaning=("stop: end the run (ckf-exhausted) instead of writing a window whose "
             "envelope is mostly facts already sent."),
    module="cdr.window.stale",
    profiles={"focused": "stop"},
    ranked_on_shards=frozenset({"write", "stop"}),
    why="focused: an honest stop (docs/retrieval.md, \"An honest stop\").",
)
