"""Planning (`plan`): ``"outline"`` (spec: a model writer's window plans the leading open
sections its words cover, in outline order, and the packed facts are assigned among them) or
``"packed"``: it plans only open sections that own at least a few of its packed facts, each fact
owned by its closest open section, so a window is never asked for a section its envelope holds
nothing of."""

from __future__ import annotations

from cdr.rules.rule import Rule

RULE = Rule(
    name="plan",
    choices=("outline", "packed"),
    meaning=("packed: a model writer's window plans only the open sections that own "
             "enough of its packed facts (never a section its envelope holds nothing "
             "of)."),
    module="cdr.window.plan",
    profiles={"focused": "packed"},
    ranked_on_shards=frozenset({"outline", "packed"}),
    why=("focused: with the outline's leading sections, 6 of focused's 10 windows on two "
         "Python-docs pages held at most one fact of the section they were asked for, "
         "and the model wrote it from memory (docs/retrieval.md)."),
)
