"""Calibrate the relevance gate for the `title-section` fact recipe, and the weight and gate of
fused relevance (`lexical: "bm25"`), on the retrieval benchmark's TUNE split of both corpora.

A gate is calibrated for the distribution of relevances it cuts, and that distribution depends
on how facts and queries were embedded: a `title-section` fact carries its page's title, so it
sits nearer its own page's task and the cosines of all facts rise. For each query kind —

- `spec`: sub-queries as written, cosine (what `--profile spec` runs on such a CKF);
- `anchor`: subject-anchored sub-queries, cosine;
- `spec+bm25 w` / `anchor+bm25 w`: fused with BM25 at weight w —

and each gate, over the tune tasks of each corpus: the share of the task page's own facts that
pass (recall) and the share of passing facts that are its own (precision, pooled over tasks).
The gate chosen per kind maximises the mean over the two corpora of F1. The REPORT split is
never read here.

Usage: python bench/calibrate_lexical.py — writes bench/results/calibration_lexical.md.
"""

from __future__ import annotations

import platform
from pathlib import Path

import numpy as np

import _paths  # noqa: F401  (cdr importable from a checkout)
from cdr.retrieval.lexical import fuse, lexical_index, session_terms
from cdr.retrieval.subject import subject_of
from cdr.window.loop import GenerationConfig, Generator
from cdr.writers import get_writer
from retrieval import man_corpus, own_rows, pydocs_corpus

WEIGHTS = (0.3, 0.4, 0.5, 0.6, 0.7)
GATES = tuple(round(float(x), 3) for x in np.arange(0.30, 0.901, 0.025))
OUT = Path(__file__).parent / "results" / "calibration_lexical.md"
RECIPE = "title-section"


def measure(corpus) -> dict[str, dict[float, tuple[int, int, int]]]:
    """kind -> gate -> (own passing, own total, passing) summed over the tune tasks."""
    ckf = corpus.ckfs[RECIPE]
    emb = np.asarray(ckf.embeddings, np.float32)
    own_by_source = own_rows(ckf)
    lex = lexical_index(ckf)
    kinds = ["spec", "anchor", *[f"{q}+bm25 {w}" for q in ("spec", "anchor") for w in WEIGHTS]]
    out = {k: {g: (0, 0, 0) for g in GATES} for k in kinds}
    for task in corpus.tasks["tune"]:
        own = np.zeros(ckf.n_rows, bool)
        own[list(own_by_source.get(task.source, ()))] = True
        rels = {}
        for subject in ("off", "anchor"):
            gen = Generator(ckf, get_writer("extractive"), GenerationConfig(subject=subject))
            session = gen.start(task.text, task.outline_text)
            rels["spec" if subject == "off" else "anchor"] = emb @ session.query_vector
        rows, b = lex.scores(session_terms(subject_of(task.text), list(task.outline)))
        dense = np.zeros(ckf.n_rows, np.float32)
        dense[rows] = b
        for w in WEIGHTS:
            for q in ("spec", "anchor"):
                rels[f"{q}+bm25 {w}"] = fuse(rels[q], dense, w)
        active = ckf.active
        for kind, rel in rels.items():
            for g in GATES:
                passed = (rel >= g) & active
                a, n, p = out[kind][g]
                out[kind][g] = (a + int((passed & own).sum()), n + int(own.sum()),
                                p + int(passed.sum()))
    return out


def f1(recall: float, precision: float) -> float:
    return 2 * recall * precision / max(recall + precision, 1e-9)


def main() -> None:
    corpora = [man_corpus(), pydocs_corpus()]
    results = {c.name: measure(c) for c in corpora}
    kinds = list(next(iter(results.values())))
    lines = [
        "# Calibration: the gate for title-section facts, and fused relevance", "",
        *[f"- `{c.name}`: {c.version}; {len(c.tasks['tune'])} TUNE tasks" for c in corpora],
        f"- CKF recipe `{RECIPE}`; queries built by `Generator.start`; machine "
        f"{platform.machine()}, Python {platform.python_version()}.",
        "- Command: `python bench/calibrate_lexical.py` (the REPORT split is never read).", "",
        "Best gate per query kind (mean F1 over the corpora of own-fact recall and pooled "
        "precision):", "",
        "| query kind | gate | " + " | ".join(f"{c.name} recall | {c.name} precision"
                                          for c in corpora) + " | mean F1 |",
        "|---|---|" + "---|---|" * len(corpora) + "---|",
    ]
    best: dict[str, tuple[float, float]] = {}
    for kind in kinds:
        def score(g: float, kind: str = kind) -> float:
            vals = []
            for c in corpora:
                a, n, p = results[c.name][kind][g]
                vals.append(f1(a / max(n, 1), a / max(p, 1)))
            return float(np.mean(vals))
        g = max(GATES, key=score)
        best[kind] = (g, score(g))
        cells = []
        for c in corpora:
            a, n, p = results[c.name][kind][g]
            cells.append(f"{a / max(n, 1):.1%} | {a / max(p, 1):.1%}")
        lines.append(f"| {kind} | {g} | " + " | ".join(cells) + f" | {score(g):.3f} |")
    lines += ["", "At the plain-recipe MiniLM gate 0.40:", "",
              "| query kind | " + " | ".join(f"{c.name} recall | {c.name} precision"
                                          for c in corpora) + " |",
              "|---|" + "---|---|" * len(corpora)]
    for kind in ("spec", "anchor"):
        cells = []
        for c in corpora:
            a, n, p = results[c.name][kind][0.4]
            cells.append(f"{a / max(n, 1):.1%} | {a / max(p, 1):.1%}")
        lines.append(f"| {kind} | " + " | ".join(cells) + " |")
    OUT.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
