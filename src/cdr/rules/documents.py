"""Document support (`documents`): ``"off"`` (spec: each fact's relevance is its own) or
``"support"``: a fact's relevance is weighed by how well its document's best facts match the
task, against the best-matching document's. A document's rivals sit on other shards: the window
is ranked here."""

from __future__ import annotations

from cdr.rules.rule import Rule

RULE = Rule(
    name="documents",
    choices=("off", "support"),
    meaning=("support: weigh each fact's relevance by how well its document matches the "
             "task against the best-matching document."),
    module="cdr.retrieval.doc_support",
    profiles={"focused": "support"},
    ranked_on_shards=frozenset({"off"}),
    why=("focused: document support lifted every measure on both retrieval corpora "
         "(bench/results/tune_focused_round3.md)."),
)
