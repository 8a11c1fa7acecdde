"""The repeat guard (`repeats`): ``"keep"`` (spec: the window's text is kept as written) or
``"drop"``: sentences, list items and code an earlier window already wrote, in the same words
or, for prose, the same meaning, are taken out before Stage 8."""

from __future__ import annotations

from cdr.rules.rule import Rule

RULE = Rule(
    name="repeats",
    choices=("keep", "drop"),
    meaning=("drop: take out of each window the sentences, list items and code an "
             "earlier window already wrote (same words or same meaning)."),
    module="cdr.window.repeat_guard",
    profiles={},
    ranked_on_shards=frozenset({"keep", "drop"}),
    why="No profile turns it on: an opt-in (docs/length.md).",
)
