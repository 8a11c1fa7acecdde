"""Citations with the reference model: how many factual sentences carry a citation, how many
citations the writer gave itself, how many attribution repaired, and what attribution costs
beside writing, on reports from the PostgreSQL manual.

Tasks and arms were fixed before any run (`TUNE`, `REPORT`, `ARMS`): the support threshold is
chosen on the tuning reports' hand-labelled pairs (`--label`, then `--calibrate`), and the
figures are read on the report tasks. Each run is checkpointed as it finishes
(`~/.cache/cdr/bench/citations/runs.jsonl`), so an interrupted run resumes.

    make llm && .venv/bin/python bench/citations_llm.py --split tune     # tuning reports
    .venv/bin/python bench/citations_llm.py --split report               # held-out reports
    .venv/bin/python bench/citations_llm.py --pairs tune > pairs.jsonl   # pairs to label
    .venv/bin/python bench/citations_llm.py --calibrate                  # threshold, precision
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _machine import cpu_name
from cdr.citations.support import (
    SUPPORT_THRESHOLD,
    content_words,
    lexical_support,
    support_scores,
)
from cdr.cli.samples import cache_dir
from cdr.window.cite import cite_text, window_citer
from cdr.window.loop import GenerationConfig, Generator
from retrieval import ingest_pages

OUT = cache_dir() / "bench" / "citations"
RESULTS = Path(__file__).resolve().parent / "results"
LABELS = RESULTS / "citation_labels.jsonl"
# Named before any run, from the split of `corpus_pg` (itself fixed before the shapes
# benchmark): two tuning chapters; for the figures, the first report chapter of at least 6
# pages and the first report survey, in the corpus's order.
TUNE = ("wal", "jit")
REPORT = ("typeconv", "views")


@dataclass(frozen=True)
class Arm:
    name: str
    options: dict[str, Any]


ARMS = (
    Arm("default", {"profile": "focused"}),
    Arm("spec", {"profile": "spec", "citations": "numbers"}),
    Arm("relevance", {"profile": "focused", "ranking": "relevance"}),
)
WORDS, WINDOWS = 1200, 3  # a tuning report; a report run writes REPORT_WINDOWS of them
REPORT_WINDOWS = 2
REPORT_GENERATION_TOKENS = 600  # a report window's budget: citing is per sentence, not per length


class Recording:
    """The local writer, keeping each window's text as the model wrote it (markers in)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.raw: list[str] = []
        self.seconds: list[float] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def generate(self, messages: Any, max_tokens: int, **kw: Any) -> Any:
        t = time.perf_counter()
        result = self.inner.generate(messages, max_tokens, **kw)
        self.seconds.append(time.perf_counter() - t)
        self.raw.append(result.text)
        return result


def knowledge_base() -> tuple[Any, dict[str, Any]]:
    """The shapes benchmark's PostgreSQL knowledge base (its own copy) and its topics."""
    import corpus_pg
    from corpus import pg_docs_dir

    html = pg_docs_dir()
    topics = corpus_pg.topics(html)
    ckf = ingest_pages(OUT / "pg.ckf", html, corpus_pg.kb_pages(html, topics))
    return ckf, {t.name: t for t in topics}


def run_one(ckf: Any, topic: Any, arm: Arm, writer: Recording, windows: int
            ) -> dict[str, Any]:
    """One report with the reference model; per window the raw text, the citations, the
    facts given, the writing time and a cold re-run of attribution's time."""
    extra = {} if windows == WINDOWS else {"generation_tokens": REPORT_GENERATION_TOKENS}
    cfg = GenerationConfig(max_windows=windows, words=WORDS, **extra, **arm.options)
    gen = Generator(ckf, writer, cfg)
    session = gen.start(topic.task, "\n".join(topic.outline))
    windows = []
    writer.raw.clear()
    writer.seconds.clear()
    for event in gen.run(topic.task, session=session):
        if not event.output.strip() or event.citations is None:
            continue
        raw = writer.raw[-1]
        citer = window_citer(ckf, ckf.embedder, event.prepared, cfg.citation_threshold)
        t = time.perf_counter()
        cite_text(session, citer, raw)
        attribution = time.perf_counter() - t
        windows.append({
            "number": event.number, "raw": raw, "output": event.output, "shown": event.shown,
            "citations": event.citations.to_dict(),
            "given": [{"ref": g.ref, "fact_id": g.fact_id, "content": g.content}
                      for g in citer.given],
            "write_seconds": round(writer.seconds[-1], 2),
            "attribution_seconds": round(attribution, 4)})
    return {"task": topic.name, "arm": arm.name, "status": session.status,
            "windows": windows}


def load_runs() -> dict[tuple[str, str], dict[str, Any]]:
    path = OUT / "runs.jsonl"
    if not path.exists():
        return {}
    runs = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {(r["task"], r["arm"]): r for r in runs}


def measure(split: str, arms: list[str]) -> None:
    from cdr.writers.local import LocalWriter

    OUT.mkdir(parents=True, exist_ok=True)
    ckf, topics = knowledge_base()
    done = load_runs()
    writer = Recording(LocalWriter(n_ctx=6144))
    names = TUNE if split == "tune" else REPORT
    todo = [(n, a) for n in names for a in ARMS if a.name in arms and (n, a.name) not in done]
    for i, (name, arm) in enumerate(todo, 1):
        t = time.perf_counter()
        rec = run_one(ckf, topics[name], arm, writer,
                      WINDOWS if split == "tune" else REPORT_WINDOWS)
        with (OUT / "runs.jsonl").open("a", encoding="utf-8") as f:
            f.write(json.dumps(rec) + "\n")
        print(f"[{i}/{len(todo)}] {name} {arm.name}: {len(rec['windows'])} windows, "
              f"{time.perf_counter() - t:.0f} s", file=sys.stderr, flush=True)


def recited(runs: dict[tuple[str, str], dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    """The runs with each window cited again from the model's stored text, at the shipped
    threshold (`SUPPORT_THRESHOLD`): the figures follow the calibration, not the threshold
    in force when the model wrote."""
    from cdr.citations import Citer, GivenFact

    ckf, _ = knowledge_base()
    out = {}
    for key, run in runs.items():
        windows = []
        for w in run["windows"]:
            given = [GivenFact(g["ref"], g["fact_id"], "", "", g["content"]) for g in w["given"]]
            vectors = ckf.vectors(ckf.rows_for_ids([g.fact_id for g in given]))
            t = time.perf_counter()
            _, citations = Citer(given, vectors, ckf.embedder.encode).cite(w["raw"])
            seconds = time.perf_counter() - t
            windows.append({**w, "citations": citations.to_dict(),
                            "attribution_seconds": round(seconds, 4)})
        out[key] = {**run, "windows": windows}
    return out


def writer_cited(window: dict[str, Any]) -> int:
    """Factual sentences the writer's own markers covered and attribution let stand."""
    return sum(1 for s in window["citations"]["sentences"] if s["status"] == "cited")


def pairs(split: str, per_run: int | None = None, seed: int = 7) -> list[dict[str, Any]]:
    """(sentence, fact) pairs to label, without their scores: each sentence with the fact it
    ended up citing, or for a flagged sentence the given fact that scored best."""
    names = TUNE if split == "tune" else REPORT
    per_run = per_run or (40 if split == "tune" else 12)
    rng = random.Random(seed)
    out = []
    for (task, arm), run in sorted(load_runs().items()):
        if task not in names:
            continue
        items = []
        for w in run["windows"]:
            given = {g["fact_id"]: g["content"] for g in w["given"]}
            for s in w["citations"]["sentences"]:
                sentence = w["output"][s["start"]:s["end"]]
                fact = s["facts"][0] if s["facts"] else _best(sentence, w["given"])
                items.append({"task": task, "arm": arm, "window": w["number"],
                              "sentence": sentence, "fact_id": fact, "fact": given[fact]})
        rng.shuffle(items)
        out += items[:per_run]
    return out


def _best(sentence: str, given: list[dict[str, Any]]) -> str:
    return max(given, key=lambda g: _score(sentence, g["content"], g["fact_id"]))["fact_id"]


_EMB: Any = None


def _score(sentence: str, fact: str, fact_id: str | None = None) -> float:
    """The support `Citer` gives: the fact's vector is the knowledge base's own (embedded with
    its title and section) when its id is known, as the loop reads it."""
    global _EMB
    if _EMB is None:
        _EMB = knowledge_base()[0]
    vec = _EMB.embedder.encode([sentence])
    fvec = (_EMB.vectors(_EMB.rows_for_ids([fact_id])) if fact_id
            else _EMB.embedder.encode([fact]))
    lex = lexical_support([content_words(sentence)], [content_words(fact)])
    return float(support_scores(lex, vec, fvec)[0, 0])


def calibrate() -> str:
    """The threshold that best separates the tuning labels, and on the report labels the
    share of kept citations that support their sentence; then the report runs' measures."""
    labels = [json.loads(x) for x in LABELS.read_text().splitlines() if x.strip()]
    for item in labels:
        item["score"] = _score(item["sentence"], item["fact"], item["fact_id"])
    tune = [x for x in labels if x["task"] in TUNE]
    report = [x for x in labels if x["task"] in REPORT]
    grid = np.round(np.arange(0.30, 0.76, 0.02), 2)

    def accuracy(items: list[dict[str, Any]], tau: float) -> float:
        return float(np.mean([(x["score"] >= tau) == x["supports"] for x in items]))

    # ties go to the lowest: a citation is kept where the labels cannot tell
    best = max(grid, key=lambda tau: (accuracy(tune, tau), -tau))
    import os

    lines = [f"# Citations with the reference model\n\nMachine: {cpu_name()}, "
             f"{os.cpu_count()} CPUs. Reference model: Qwen2.5-Coder-1.5B-Instruct (llama.cpp), "
             f"{WORDS} words asked per report, {WINDOWS} windows at most on the tuning "
             f"reports, {REPORT_WINDOWS} of {REPORT_GENERATION_TOKENS} tokens on the report "
             "runs.\n",
             f"Labelled pairs: {len(tune)} tuning, {len(report)} report "
             f"(`{LABELS.relative_to(RESULTS.parent.parent)}`).\n",
             "| threshold | tuning accuracy | report accuracy |", "|---:|---:|---:|"]
    for tau in grid[::2]:
        lines.append(f"| {tau:.2f} | {accuracy(tune, tau):.0%} | "
                     f"{accuracy(report, tau) if report else float('nan'):.0%} |")
    kept = [x for x in report if x["score"] >= best]
    precision = float(np.mean([x["supports"] for x in kept])) if kept else float("nan")
    flagged = [x for x in report if x["score"] < best]
    flag_right = float(np.mean([not x["supports"] for x in flagged])) if flagged else float("nan")
    lines += ["", f"Chosen on the tuning pairs: **{best:.2f}** (ties → the lowest; shipped: "
              f"{SUPPORT_THRESHOLD}). On the report pairs at it: {len(kept)} kept citations, "
              f"**{precision:.0%}** support their sentence by the labels; {len(flagged)} "
              f"flagged, {flag_right:.0%} of them rightly.", ""]
    lines.append(report_table())
    return "\n".join(lines)


def report_table() -> str:
    rows = ["| arm | runs | factual sentences | cited | cited by the writer | repaired | "
            "unsupported | refs outside the envelope (dropped) | attribution / writing |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    runs = recited(load_runs())
    for arm in ARMS:
        ws = [w for (task, a), r in runs.items() if a == arm.name and task in REPORT
              for w in r["windows"]]
        if not ws:
            continue
        n = sum(w["citations"]["factual"] for w in ws)
        cited = sum(w["citations"]["cited"] for w in ws)
        own = sum(writer_cited(w) for w in ws)
        repaired = sum(1 for w in ws for s in w["citations"]["sentences"]
                       if s["status"] == "repaired")
        unsup = sum(w["citations"]["unsupported"] for w in ws)
        invalid = sum(w["citations"]["invalid"] for w in ws)
        ratio = (sum(w["attribution_seconds"] for w in ws)
                 / max(sum(w["write_seconds"] for w in ws), 1e-9))
        n_runs = sum(1 for (task, a) in runs if a == arm.name and task in REPORT)
        rows.append(f"| {arm.name} | {n_runs} | {n} | {cited / n:.0%} | {own / n:.0%} | "
                    f"{repaired / n:.0%} | {unsup / n:.0%} | {invalid} | {ratio:.1%} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--split", choices=("tune", "report"))
    ap.add_argument("--arms", default=",".join(a.name for a in ARMS))
    ap.add_argument("--pairs", choices=("tune", "report"))
    ap.add_argument("--calibrate", action="store_true")
    ap.add_argument("--out", type=Path,
                    default=RESULTS.parent.parent / "docs" / "results" / "citations.md")
    args = ap.parse_args(argv)
    if args.split:
        measure(args.split, args.arms.split(","))
    if args.pairs:
        for item in pairs(args.pairs):
            print(json.dumps(item))
    if args.calibrate:
        text = calibrate()
        args.out.write_text(text + "\n", encoding="utf-8")
        print(text)
    if not (args.split or args.pairs or args.calibrate):
        print(report_table())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
