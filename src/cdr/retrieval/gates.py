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
  corpora (bench/results/calibration_lexical.md).

An identity without an entry gets the spec's 0.55; fused relevance without its own entry gets
the identity's cosine gate.
"""

from __future__ import annotations

SPEC_GATE = 0.55
MINILM = "sentence-transformers/all-MiniLM-L6-v2"

# (embedding identity, lexical mode) -> gate
GATES: dict[tuple[str, str], float] = {
    (MINILM, "off"): 0.40,
    (f"{MINILM}#title-section", "off"): 0.45,
    (f"{MINILM}#title-section", "bm25"): 0.40,
}


def calibrated_gate(identity: str, lexical: str = "off") -> float:
    """The gate for relevances of `identity`'s vectors (fused with BM25 when `lexical` is
    "bm25")."""
    gate = GATES.get((identity, lexical))
    if gate is None and lexical != "off":
        gate = GATES.get((identity, "off"))
    return SPEC_GATE if gate is None else gate
