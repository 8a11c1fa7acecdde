"""Citations (`citations`): ``"off"`` (spec) or ``"numbers"`` / ``"footnotes"``: each sentence
cites the facts it rests on, checked and repaired against the window's facts, and the document
ends with its sources (docs/citations.md)."""

from __future__ import annotations

from cdr.rules.rule import Rule

RULE = Rule(
    name="citations",
    choices=("off", "numbers", "footnotes"),
    meaning=("numbers / footnotes: each sentence cites the facts it rests on, [n] or "
             "[^n], checked and repaired against the window's facts; the document ends "
             "with its sources."),
    module="cdr.citations",
    profiles={"focused": "numbers"},
    ranked_on_shards=frozenset({"off", "numbers", "footnotes"}),
    why="focused: a document says where each sentence came from (docs/citations.md).",
)
