"""Calibrate the relevance gate for the `title-section` fact recipe, and the weight and gate of
fused relevance (`lexical: "bm25"`), on the retrieval benchmark's TUNE split of both corpora.

A gate is calibrated for the distribution of relevances it cuts, and that distribution depends
on how facts and queries were embedded: a `title-section` fact carries its page's title, so it
sits nearer its own page's task and the cosines of all facts rise. For each query kind —

- `spec`: sub-queries as written, cosine (what `--profile spec` runs on such a CKF);
- `anchor`: subject-anchored sub-queries, cosine;
- `spec+bm25 w` / `anchor+bm25 w`: fused with BM25 at weight w;
- `spec+bm25 0.6 support p`: fused at the library's weight, then weighed by document support
  at power p (`cdr.retrieval.doc_support`: gated, weighed, gated again) —

and each gate, over the tune tasks of each corpus: the share of the task page's own facts that
pass (recall) and the share of passing facts that are its own (precision, pooled over tasks).
The gate chosen per kind maximises the mean over the two corpora of F1. The REPORT split is
never read here.

Usage: python bench/calibrate_lexical.py [--recipe R] — writes
bench/results/calibration_lexical.md (recipe title-section) or calibration_lexical_<R>.md.
"""

from __future__ import annotations

import argparse
import platform
from pathlib import Path

import numpy as np

import _paths  # noqa: F401  (cdr importable from a checkout)
from cdr.retrieval.doc_support import support_weights
from cdr.retrieval.lexical import fuse, lexical_index, session_terms
from cdr.retrieval.subject import subject_of
from cdr.window.loop import GenerationConfig, Generator
from cdr.writers import get_writer
from retrieval import man_corpus, own_rows, pydocs_corpus

WEIGHTS = (0.3, 0.4, 0.5, 0.6, 0.7)
GATES = tuple(round(float(x), 3) for x in np.arange(0.30, 0.901, 0.025))
OUT = Path(__file__).parent / "results" / "calibration_lexical.md"
RECIPE = "title-section"
POWERS = (1.0, 2.0)


def measure(corpus, recipe: str = RECIPE) -> dict[str, dict[float, tuple[int, int, int]]]:
    """kind -> gate -> (own passing, own total, passing) summed over the tune tasks."""
    ckf = corpus.ckfs[recipe]
    emb = np.asarray(ckf.embeddings, np.float32)
    own_by_source = own_rows(ckf, shared=True)
    lex = lexical_index(ckf)
    sources = [f.source for f in ckf.facts(np.arange(ckf.n_rows))]
    codes = np.unique(np.asarray(sources), return_inverse=True)[1].astype(np.int64)
    kinds = ["spec", "anchor", *[f"{q}+bm25 {w}" for q in ("spec", "anchor") for w in WEIGHTS],
             *[f"spec+bm25 0.6 support {p:g}" for p in POWERS]]
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
        for kind in kinds:
            for g in GATES:
                if "support" in kind:
                    rel = rels["spec+bm25 0.6"]
                    cand = np.flatnonzero((rel >= g) & active)
                    weighed = np.zeros(ckf.n_rows, np.float32)
                    weighed[cand] = rel[cand] * support_weights(
                        cand, rel[cand], codes, float(kind.rsplit(" ", 1)[1]))
                    passed = (weighed >= g) & active
                else:
                    passed = (rels[kind] >= g) & active
                a, n, p = out[kind][g]
                out[kind][g] = (a + int((passed & own).sum()), n + int(own.sum()),
                                p + int(passed.sum()))
    return out


def f1(recall: float, precision: float) -> float:
    return 2 * recall * precision / max(recall + precision, 1e-9)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipe", default=RECIPE)
    recipe = ap.parse_args().recipe
    corpora = [man_corpus((recipe,)), pydocs_corpus((recipe,))]
    results = {c.name: measure(c, recipe) for c in corpora}
    kinds = list(next(iter(results.values())))
    lines = [
        "# Calibration: the gate for title-section facts, and fused relevance", "",
        *[f"- `{c.name}`: {c.version}; {len(c.tasks['tune'])} TUNE tasks" for c in corpora],
        f"- CKF recipe `{recipe}`; queries built by `Generator.start`; machine "
        f"{platform.machine()}, Python {platform.python_version()}.",
        f"- Command: `python bench/calibrate_lexical.py --recipe {recipe}` (the REPORT split is "
        "never read).", "",
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
    out = OUT if recipe == RECIPE else OUT.with_name(f"calibration_lexical_{recipe}.md")
    out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
