"""Hybrid relevance (`lexical`): ``"off"`` (spec: relevance is the cosine) or ``"bm25"``:
relevance fuses the cosine with a BM25 score of the task's words, so facts that name the
subject's own terms pass the gate. BM25's statistics are the whole knowledge base's, which no
shard holds alone: the window is ranked here."""

from __future__ import annotations

from cdr.rules.rule import Rule

RULE = Rule(
    name="lexical",
    choices=("off", "bm25"),
    meaning="bm25: relevance fuses the cosine with BM25 over the task's words.",
    module="cdr.retrieval.lexical",
    profiles={"focused": "bm25"},
    ranked_on_shards=frozenset({"off"}),
    why=("focused: the retrieval benchmark's TUNE split (docs/retrieval.md, \"Relevance "
         "means the task's own material\")."),
)
