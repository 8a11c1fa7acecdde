"""Does a `--profile focused` window plan only sections its envelope can ground? (issue 21)

With the reference model, 6 of `focused`'s 10 windows on `dataclasses` and `datetime` held at
most one fact of the section(s) their plan named, and the model wrote those sections from
memory (42.6% of their sentences grounded, against 87.2% in the other windows;
docs/retrieval.md). This benchmark measures the plan without a model, on the retrieval
benchmark's splits (`bench/retrieval.py`, fixed by sha1 before any tuning; the threshold
`cdr.window.plan.PLAN_MIN_FACTS` is chosen on TUNE only and REPORT is reported).

The writer is a stand-in for the model: it does not paste facts (so the loop plans, fits and
prompts as for a model) and writes the extractive writer's text of the prompt's planned
sections, cut at the words 320 tokens carry at the reference model's 0.577 words a token
(`finish_reason` "length" when cut, as the model stopped in 7 of 10 windows). The window
settings are `make bench-llm`'s: 2,048-token context, 320 generated tokens, 1,200 words, at
most 5 windows; the knowledge base is the retrieval benchmark's default-recipe CKF
(`title-section-short`).

Per written window and planned section: the packed facts of the task's own page whose section
path lies under that section (`bench/grounding_by_window.py`'s reading). Reported per arm:

- `starved`: share of windows with a planned section holding 0 of its own facts, and
  `begun, starved` those where that section was begun by an earlier window;
- `≥k`: share of windows whose every planned section holds at least k (k = 1, 2, 3);
- `own share`: of the packed facts, those listed under the planned section they belong to;
- own-fact recall at the end (the page's facts sent), windows written, exits.

Usage: `CDR_EMBED_THREADS=1 PYTHONPATH=src python bench/focused_plan.py --split tune
[--corpus pydocs,man] [--arms ...]` → `bench/results/focused_plan-<split>.json` and a Markdown
table on stdout (the tables and the choice: bench/results/focused_plan.md).
"""

from __future__ import annotations

import argparse
import json
import resource
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from _paths import BENCH  # first: makes `cdr` importable
from cdr.retrieval.fact_recipe import TITLE_SECTION_SHORT
from cdr.session import IN_PROGRESS
from cdr.text.tokens import LLM_WORDS_PER_TOKEN
from cdr.window.loop import GenerationConfig, Generator
from cdr.window.plan import heading_key
from cdr.writers import get_writer
from cdr.writers.base import WriterResult
from quality_arms import CachingEmbedder

RESULTS = BENCH / "results"
CONTEXT, GENERATION, WORDS, WINDOWS = 2048, 320, 1200, 5
KS = (1, 2, 3)


@dataclass(frozen=True)
class Arm:
    name: str
    config: dict[str, Any] = field(default_factory=dict)


PACKED = {"profile": "focused", "plan": "packed"}
ARMS = (
    Arm("focused-outline", {"profile": "focused", "plan": "outline"}),
    *(Arm(f"packed-k{k}", {**PACKED, "plan_min_facts": k}) for k in (1, 2, 3, 4, 6)),
    Arm("packed-cosine-k2", {**PACKED, "plan_min_facts": 2, "plan_by_heading": False}),
    Arm("sections-outline", {"profile": "focused", "plan": "outline", "ranking": "sections"}),
    Arm("sections-packed-k2", {**PACKED, "plan_min_facts": 2, "ranking": "sections"}),
)


class ModelLikeWriter:
    """Writes prose (no `pastes_facts`): the extractive writer's text of the prompt's plan,
    cut where 320 tokens of the reference model end."""

    name = "model-like"

    def __init__(self) -> None:
        self.inner = get_writer("extractive")
        self.prompts: list[str] = []

    def generate(self, messages: list[dict[str, str]], max_tokens: int, *,
                 on_delta: Any = None) -> WriterResult:
        self.prompts.append(messages[-1]["content"])
        words = self.inner.generate(messages, 100_000).text.split(" ")
        cap = int(max_tokens * LLM_WORDS_PER_TOKEN)
        cut = len(words) > cap
        text = " ".join(words[:cap])
        return WriterResult(text, "length" if cut else "stop",
                            {"completion_tokens": len(text.split())})


def under(section: str, title: str) -> bool:
    """Whether a fact's section path lies under the planned section `title` (headings
    compared without their numbers: the reference pages number theirs, "3.3.1. Basic
    customization", and the outline does not)."""
    key = heading_key(title)
    return any(heading_key(part) == key for part in section.split(" > ")[1:])


def run_one(ckf: Any, embedder: Any, own: set[int], task: Any, arm: Arm) -> dict[str, Any]:
    """One (arm, task) run; per written window, each planned section's own facts."""
    cfg = GenerationConfig(max_windows=WINDOWS, words=WORDS, context_tokens=CONTEXT,
                           generation_tokens=GENERATION, **arm.config)
    writer = ModelLikeWriter()
    gen = Generator(ckf, writer, cfg)
    gen.embedder = embedder
    session = gen.start(task.text, task.outline_text)
    windows, sent, statuses = [], set(), []
    while session.status == IN_PROGRESS:
        done = {sq.text for sq in session.sub_queries if sq.id in set(session.finished_ids)}
        ev = gen.step(session)
        statuses.append(ev.status)
        if not ev.output.strip():
            continue
        p = ev.prepared
        rows = [int(r) for r in p.rows]
        sent.update(rows)
        facts = {f"F{i + 1}": (row, f.section) for i, (row, f) in enumerate(zip(rows, p.facts,
                                                                               strict=True))}
        sections = []
        for s in p.plan:
            mine = sum(1 for row, sec in facts.values() if row in own and under(sec, s.title))
            listed_own = sum(1 for r in s.fact_refs
                             if facts[r][0] in own and under(facts[r][1], s.title))
            begun = f'"{s.title}" was begun earlier' in writer.prompts[-1]
            sections.append({"title": s.title, "asked": s.target_words, "begun": begun,
                             "own_facts": mine, "listed": len(s.fact_refs),
                             "listed_own": listed_own})
        of_done = sum(1 for row, sec in facts.values()
                      if row in own and any(under(sec, t) for t in done))
        windows.append({"number": ev.number, "packed": len(rows), "of_written": of_done,
                        "own_page": sum(r in own for r in rows), "sections": sections,
                        "written": len(ev.output.split()), "finish": ev.finish_reason})
    return {"task": task.name, "arm": arm.name, "own": len(own), "sent_own": len(sent & own),
            "statuses": statuses, "windows": windows}


def summary(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The arm's figures over its runs (module docstring)."""
    ws = [w for r in runs for w in r["windows"]]
    n = len(ws) or 1
    least = [min((s["own_facts"] for s in w["sections"]), default=0) for w in ws]
    packed = sum(w["packed"] for w in ws) or 1
    return {
        "runs": len(runs), "windows": len(ws),
        "starved": sum(x == 0 for x in least) / n,
        **{f"ge{k}": sum(x >= k for x in least) / n for k in KS},
        # windows that continue a begun section holding none of its own facts (a model
        # restates such a section: docs/retrieval.md)
        "begun_starved": sum(any(s["begun"] and s["own_facts"] == 0 for s in w["sections"])
                             for w in ws) / n,
        # packed facts of the page's sections already written whole (not planned again)
        "of_written": sum(w["of_written"] for w in ws) / packed,
        "own_share": sum(s["listed_own"] for w in ws for s in w["sections"]) / packed,
        "sections_per_window": sum(len(w["sections"]) for w in ws) / n,
        "asked_per_window": sum(s["asked"] for w in ws for s in w["sections"]) / n,
        "recall": float(np.mean([r["sent_own"] / r["own"] for r in runs if r["own"]])),
        "exits": {e: sum(r["statuses"][-1] == e for r in runs)
                  for e in sorted({r["statuses"][-1] for r in runs})},
    }


def main(argv: Sequence[str] | None = None) -> int:
    from retrieval import man_corpus, own_rows, pydocs_corpus

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--split", choices=("tune", "report"), default="tune")
    ap.add_argument("--corpus", default="pydocs,man")
    ap.add_argument("--arms", default=",".join(a.name for a in ARMS))
    ap.add_argument("--tasks", type=int, default=None, help="only the first N tasks a corpus")
    args = ap.parse_args(argv)
    arms = [a for a in ARMS if a.name in args.arms.split(",")]
    out: dict[str, Any] = {"split": args.split, "settings": [CONTEXT, GENERATION, WORDS,
                                                             WINDOWS], "corpora": {}}
    t0 = time.process_time()
    for corpus in args.corpus.split(","):
        data = (man_corpus if corpus == "man" else pydocs_corpus)((TITLE_SECTION_SHORT,))
        ckf = data.ckfs[TITLE_SECTION_SHORT]
        owners = own_rows(ckf, shared=True)
        embedder = CachingEmbedder(ckf.embedder)
        tasks = data.tasks[args.split][: args.tasks]
        res: dict[str, Any] = {}
        for a in arms:
            runs = [run_one(ckf, embedder, owners.get(t.source, set()), t, a) for t in tasks]
            res[a.name] = {"summary": summary(runs), "runs": runs}
            print(f"{corpus} {a.name}: {json.dumps(res[a.name]['summary'])}", flush=True)
        out["corpora"][corpus] = res
    usage = resource.getrusage(resource.RUSAGE_SELF)
    out["cpu_seconds"] = round(time.process_time() - t0, 1)
    out["max_rss_mb"] = round(usage.ru_maxrss / 1024)
    path = RESULTS / f"focused_plan-{args.split}.json"
    path.write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    print(table(out))
    return 0


def table(out: dict[str, Any]) -> str:
    """The Markdown table of every corpus and arm."""
    lines = ["| corpus | arm | windows | starved | begun, starved | ≥1 | ≥2 | ≥3 | own share "
             "listed | sections / window | words asked / window | own-fact recall | exits |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for corpus, res in out["corpora"].items():
        for arm, r in res.items():
            s = r["summary"]
            exits = ", ".join(f"{k} {v}" for k, v in s["exits"].items())
            lines.append(f"| {corpus} | `{arm}` | {s['windows']} | {s['starved']:.1%} | "
                         f"{s['begun_starved']:.1%} | "
                         f"{s['ge1']:.1%} | {s['ge2']:.1%} | {s['ge3']:.1%} | "
                         f"{s['own_share']:.1%} | {s['sections_per_window']:.2f} | "
                         f"{s['asked_per_window']:.0f} | {s['recall']:.1%} | {exits} |")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
