"""Candidates by section (`pool`): ``"task"`` (spec: Phase 1 gates each fact by its relevance to
the task query) or ``"sections"`` (the window loop's `_section_pool`): a fact is a candidate when
it is relevant to the task or to one of its outline sections, each section pulled toward the
task, at its best relevance; BM25 words and document support are each query's own; navigation
pages such as a back-of-book index are left out (`cdr.retrieval.navigation`); a section's pages
by meaning and the documents the run draws on join, so a task whose sections live in
different documents reaches every one of them. The pool is built over the whole knowledge base:
the window is ranked here."""

from __future__ import annotations

from cdr.rules.rule import Rule

RULE = Rule(
    name="pool",
    choices=("task", "sections"),
    meaning=("sections: a fact is a candidate when it is relevant to the task or to one "
             "of its sections (each pulled toward the task), so a task spanning "
             "documents reaches each."),
    module="cdr.window.loop",
    profiles={"focused": "sections"},
    ranked_on_shards=frozenset({"task"}),
    why=("focused: chosen on the tuning tasks of bench/shapes.py (tasks whose material "
         "is 2-5 man pages): material sent 67% -> 93%, false exhaustions 4 -> 1 of 5, "
         "single-page tasks unchanged; its section pages and whole documents on the "
         "PostgreSQL manual's tuning chapters and surveys (docs/retrieval.md)."),
)
