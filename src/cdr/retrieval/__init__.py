"""The fact index and Phase 1: what the window loop reads facts through, and how it picks them.

`factindex` is the interface (`FactIndex`, `RankingIndex`; `cdr.knowledge_base` opens one by
address); `embed` and `models` turn text into vectors; `fact_recipe`, `subject`, `expansion`,
`lexical` and `gates` shape relevance (which facts a window may consider); `row_products` is the
per-row dot product every score is built from.
"""
