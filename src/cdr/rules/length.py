"""The length contract (`length`): ``"open"`` (spec: the words asked only size the sub-queries;
a run ends on the spec's four exits) or ``"contract"``: each window is planned for the words
still owed, as many as its generation budget carries at the writer's words per token; a section
written whole is not planned again, only one cut off is continued; and the run ends with
`task-complete` once the words delivered reach the ±15% band of the words asked."""

from __future__ import annotations

from cdr.rules.rule import Rule

RULE = Rule(
    name="length",
    choices=("open", "contract"),
    meaning=("contract: plan each window for the words still owed, write a section once "
             "(continue only one cut off), end task-complete once the words asked are "
             "delivered within ±15%."),
    module="cdr.window.length",
    profiles={"focused": "contract"},
    ranked_on_shards=frozenset({"open", "contract"}),
    why=("focused: keeps a long run to the words asked; without it a run goes on to its "
         "window limit or its stale stop (bench/results/long.md)."),
)
