"""Envelope size (`envelope`): ``"budget"`` (spec: fill the envelope budget E) or ``"fit"``: pack
about as many facts as the window's planned words can use."""

from __future__ import annotations

from cdr.rules.rule import Rule

RULE = Rule(
    name="envelope",
    choices=("budget", "fit"),
    meaning="fit: pack as many facts as the window's planned words can use.",
    module="cdr.window.fit",
    profiles={"fresh": "fit"},
    ranked_on_shards=frozenset({"budget", "fit"}),
    why=("fresh only: on the TUNE split of both retrieval corpora fresh's fitted "
         "envelopes lost to the spec's (bench/results/tune_focused_round1.md), so "
         "focused keeps the budget."),
)
