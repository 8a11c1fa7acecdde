"""Sub-query expansion (`queries`): ``"titles"`` (spec: sub-queries are embedded as written) or
``"expanded"``: each sub-query is expanded once at session start from the CKF, and the expansion
drives residual pull, the plan and Stage 8 attribution. The expansion widens Phase 1 with the
session's own vectors, which the shards do not hold: the window is ranked here."""

from __future__ import annotations

from cdr.rules.rule import Rule

RULE = Rule(
    name="queries",
    choices=("titles", "expanded"),
    meaning="expanded: sub-queries expanded from the CKF at session start.",
    module="cdr.retrieval.expansion",
    profiles={"fresh": "expanded"},
    ranked_on_shards=frozenset({"titles"}),
    why=("fresh only: expanded sub-queries lost to the spec's on the TUNE split of both "
         "retrieval corpora (bench/results/tune_focused_round1.md)."),
)
