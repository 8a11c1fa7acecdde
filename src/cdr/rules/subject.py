"""Subject-anchored sub-queries (`subject`): ``"off"`` (spec: an outline line is embedded as
written) or ``"anchor"``: each sub-query is embedded as the task's subject plus its line, so
"Background" means the background *of this task's subject*; the window still writes under
"Background"."""

from __future__ import annotations

from cdr.rules.rule import Rule

RULE = Rule(
    name="subject",
    choices=("off", "anchor"),
    meaning="anchor: embed each sub-query as the task's subject plus its line.",
    module="cdr.retrieval.subject",
    profiles={},
    ranked_on_shards=frozenset({"off", "anchor"}),
    why=("Not in focused: anchoring the subject added nothing once BM25 carries the "
         "subject's words (bench/results/tune_focused_round2.md)."),
)
