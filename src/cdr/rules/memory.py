"""Fact memory (`memory`): ``"off"`` (spec: novelty is per topic) or ``"facts"``: facts already
shown, and more strongly facts already written, lose score in later windows. The memory is the
session's; a shard ranks without it, so the window is ranked here."""

from __future__ import annotations

from cdr.rules.rule import Rule

RULE = Rule(
    name="memory",
    choices=("off", "facts"),
    meaning="facts: facts already shown or written lose score in later windows.",
    module="cdr.fact_memory",
    profiles={"fresh": "facts", "focused": "facts"},
    ranked_on_shards=frozenset({"off"}),
    why="fresh and focused: the quality benchmark's winner on the Python-docs corpus.",
)
