"""Grounding window by window, from the LLM benchmark's checkpoints (no model runs).

Why: the v4 report (`bench/quality_llm_report.py`) gives one grounding share per run, and on
two Python-docs pages `--profile focused` grounds far below spec CDR (issue 21). This script
says where the gap is: per window and arm, the envelope (facts, their words, the share from
the task's own page, the facts of the sections the window's plan names against those the page
holds and those not sent yet), the words the plan asked for against the words written, the finish
reason and the grounding share, scored as the report scores it (a sentence is grounded when
its best cosine to a fact of its window's envelope, the fact's own text embedded alone,
reaches the fixed bar); then every ungrounded sentence with its best cosine and a rough kind:

- `task`: most of its content words are the task's title and outline (it restates the task);
- `api`: it names a code identifier (backticked, or `name(`) that no envelope fact holds;
- `near`: its best cosine is within 0.1 of the bar (a paraphrase of a fact, just below);
- `other`: none of these (general prose, the model's own knowledge).

Rerun: `CDR_EMBED_THREADS=1 PYTHONPATH=src .venv/bin/python bench/grounding_by_window.py
--pages dataclasses,datetime` (one process, the default embedder; `--ckf` the knowledge base
the runs used, for the facts' pages).
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

import numpy as np

from cdr.ckf import CKF, Fact
from cdr.retrieval.embed import default_embedder
from quality_llm import default_ckf
from quality_llm_metrics import containment, content_words, sentences

GROUNDING = 0.508  # the fixed grounding bar of the v4 reports (docs/retrieval.md)
NEAR = 0.1  # an ungrounded sentence this close to the bar counts as a near paraphrase
TASK_SHARE = 0.5  # share of a sentence's content words from the title and outline
_API = re.compile(r"`([^`]+)`|\b([A-Za-z_][\w.]*)\(")


def _identifiers(text: str) -> set[str]:
    """Code names a sentence mentions: backticked spans and `name(` calls, bare names."""
    out = set()
    for a, b in _API.findall(text):
        name = (a or b).split("(")[0].strip().lower()
        if name:
            out.add(name.rsplit(".", 1)[-1])
    return out


def _unit(v: np.ndarray) -> np.ndarray:
    return v / np.maximum(np.linalg.norm(v, axis=1, keepdims=True), 1e-12)


def kind(sentence: str, best: float, task_words: set[str], fact_text: str) -> str:
    """The rough kind of an ungrounded sentence (module docstring)."""
    if containment(content_words(sentence), task_words) >= TASK_SHARE:
        return "task"
    if any(n not in fact_text for n in _identifiers(sentence)):
        return "api"
    return "near" if best >= GROUNDING - NEAR else "other"


def _in_plan(section: str, titles: set[str]) -> bool:
    """Whether a fact's section path lies under one of the planned sections."""
    return any(part in titles for part in section.split(" > ")[1:])


def analyse(run: dict[str, Any], encode: Any, facts_by_id: dict[str, Fact]
            ) -> list[dict[str, Any]]:
    """Per-window rows of one checkpointed run."""
    task_words = content_words(" ".join([run["title"], *run["outline"]]))
    page = run["task"].rsplit("/", 1)[-1]
    on_page = [f for f in facts_by_id.values() if f.source.endswith("/" + page)]
    sent: set[str] = set()
    rows = []
    for w in run["windows"]:
        titles = {p[0] for p in w["plan"]}
        planned = {f.id for f in on_page if _in_plan(f.section, titles)}
        in_env = sum(1 for f in w["fact_ids"] if f in planned)
        ss = sentences(w["text"])
        facts = w["fact_texts"]
        best = np.zeros(len(ss))
        if ss and facts:
            sv = _unit(np.asarray(encode(ss), dtype=np.float64))
            fv = _unit(np.asarray(encode(facts), dtype=np.float64))
            best = (sv @ fv.T).max(axis=1)
        fact_text = " ".join(facts).lower()
        own = [f in facts_by_id and facts_by_id[f].source.endswith("/" + page)
               for f in w["fact_ids"]]
        ungrounded = [(s, float(b), kind(s, float(b), task_words, fact_text))
                      for s, b in zip(ss, best, strict=True) if b < GROUNDING]
        rows.append({
            "window": w["number"], "facts": len(facts),
            "fact_words": sum(len(t.split()) for t in facts),
            "own_page": sum(own) / len(own) if own else float("nan"),
            "asked": sum(int(p[1]) for p in w["plan"]), "written": len(w["text"].split()),
            "finish": w["finish_reason"], "sentences": len(ss),
            "grounded": int((best >= GROUNDING).sum()), "ungrounded": ungrounded,
            "planned": f"{in_env}/{len(planned - sent)}/{len(planned)}",
        })
        sent.update(w["fact_ids"])
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=Path, default=Path("bench/results/quality-llm-runs-v4"))
    ap.add_argument("--pages", default="dataclasses,datetime",
                    help="comma-separated page names (library/NAME.html)")
    ap.add_argument("--arms", default="focused,cdr")
    ap.add_argument("--ckf", type=Path, default=None, help="the runs' knowledge base")
    args = ap.parse_args()
    ckf = CKF.open(args.ckf or default_ckf())
    active = np.flatnonzero(ckf.active)
    facts_by_id = {f.id: f for f in ckf.facts(active)}
    encode = default_embedder().encode
    for name in args.pages.split(","):
        for arm in args.arms.split(","):
            path = args.runs / f"library_{name}.html__{arm}.json"
            run = json.loads(path.read_text("utf-8"))
            rows = analyse(run, encode, facts_by_id)
            total = sum(r["sentences"] for r in rows)
            grounded = sum(r["grounded"] for r in rows)
            means = [r["grounded"] / r["sentences"] for r in rows if r["sentences"]]
            print(f"\n## {name} {arm}: grounding {grounded}/{total} = {grounded / total:.1%}"
                  f" (mean of windows {sum(means) / len(means):.1%})")
            print("| W | facts | fact words | own page | planned sections: in envelope / "
                  "unsent / on page | asked | written | finish | grounded |")
            print("|---|---:|---:|---:|---:|---:|---:|---|---:|")
            for r in rows:
                print(f"| {r['window']} | {r['facts']} | {r['fact_words']} | "
                      f"{r['own_page']:.0%} | {r['planned']} | {r['asked']} | "
                      f"{r['written']} | {r['finish']} | "
                      f"{r['grounded']}/{r['sentences']} |")
            for r in rows:
                for s, b, k in r["ungrounded"]:
                    print(f"  W{r['window']} {b:.3f} {k:5s} {s[:160]}")


if __name__ == "__main__":
    main()
