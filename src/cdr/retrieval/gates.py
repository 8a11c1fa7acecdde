"""The relevance gate of §2.6, calibrated per embedding identity and relevance kind.

CRP-SPEC-024 writes 0.55 for large embedding models. A gate is calibrated for the distribution
of relevances it cuts, and that depends on the model, on how the facts were embedded (their
recipe, `cdr.retrieval.fact_recipe`) and on whether relevance is the cosine or the cosine fused with
BM25 (`cdr.retrieval.lexical`). Each value below was chosen on tuning tasks only and is reported on
others:

- plain MiniLM facts, cosine: 0.40 — it keeps on-topic material and sits above the 99th
  percentile of off-topic similarity (bench/results/calibration.md, Python docs);
- `title-section` facts, cosine: 0.45, and fused relevance (weight 0.6): 0.40 — the best mean
  F1 of own-fact recall and precision over the TUNE tasks of the man-page and Python-docs
  corpora (bench/results/calibration_lexical.md);
- `title-section-short` facts, cosine: 0.425; fused relevance: 0.40; fused relevance weighed
  by document support (`cdr.retrieval.doc_support`, power 2): 0.325 — the same rule
  (bench/results/calibration_lexical_title-section-short.md). Document support only takes
  away, so the gate it is paired with is lower: its weighing cuts a sibling document's facts
  that the plain fused gate cut with many of the task's own.

- the int8 path of MiniLM (`cdr.retrieval.embed_int8`, its own identity), `title-section-short`
  facts: cosine 0.45, fused relevance 0.40, fused relevance weighed by document support 0.30 —
  the same rule on its own re-embedded CKFs (bench/results/embed_paths.md).

An identity without an entry gets the spec's 0.55; fused relevance without its own entry gets
the identity's cosine gate; document support without its own entry gets the gate of the
relevance it weighs.
"""

from __future__ import annotations

SPEC_GATE = 0.55
MINILM = "sentence-transformers/all-MiniLM-L6-v2"
MINILM_INT8 = f"{MINILM}+int8"

# (embedding identity, lexical mode) -> gate
GATES: dict[tuple[str, str], float] = {
    (MINILM, "off"): 0.40,
    (f"{MINILM}#title-section", "off"): 0.45,
    (f"{MINILM}#title-section", "bm25"): 0.40,
    (f"{MINILM}#title-section-short", "off"): 0.425,
    (f"{MINILM}#title-section-short", "bm25"): 0.40,
    (f"{MINILM_INT8}#title-section-short", "off"): 0.45,
    (f"{MINILM_INT8}#title-section-short", "bm25"): 0.40,
}
# (embedding identity, lexical mode) -> gate, when relevance is weighed by document support
SUPPORT_GATES: dict[tuple[str, str], float] = {
    (f"{MINILM}#title-section-short", "bm25"): 0.325,
    (f"{MINILM_INT8}#title-section-short", "bm25"): 0.30,
}


def calibrated_gate(identity: str, lexical: str = "off", documents: str = "off") -> float:
    """The gate for relevances of `identity`'s vectors (fused with BM25 when `lexical` is
    "bm25", weighed by document support when `documents` is "support")."""
    if documents != "off":
        gate = SUPPORT_GATES.get((identity, lexical))
        if gate is not None:
            return gate
    gate = GATES.get((identity, lexical))
    if gate is None and lexical != "off":
        gate = GATES.get((identity, "off"))
    return SPEC_GATE if gate is None else gate
