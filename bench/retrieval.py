"""Retrieval benchmark (issue 21 §5): on a knowledge base of many similar documents, does the
envelope hold the task's own material, is it new, and does the run stop when it runs out?

Two corpora, each a set of documents of one shape with one task per document (its sections as
the outline, every other document a distractor):

- `man`: 60 Linux system-call pages (Debian `manpages-dev`, `bench/corpus_man.py`),
  split by sha1 into 20 tuning and 40 report tasks, fixed before any tuning;
- `pydocs`: the quality benchmark's 16 Python-docs pages on its `related` corpus
  (`bench/quality.py`), split by sha1 into 6 tuning and 10 report tasks.

Each corpus is ingested once per fact recipe (`plain`, `title-section`) into its own CKF under
`~/.cache/cdr/bench/retrieval/`. Every (arm, task) runs through `cdr.window.loop.Generator` with the
extractive writer until the arm's own exit (at most `--max-windows`); each window's envelope is
measured by `bench/retrieval_metrics.py`. Finished runs are appended to a JSONL checkpoint as
they finish, so an interrupted run resumes (`--restart` starts over).

Usage: `python bench/retrieval.py --corpus man|pydocs --split tune|report [--arms a,b]
[--tasks N] [--max-windows 12] [--words 9000] [--ingest-speed] [--no-report]`;
`make bench-retrieval` runs both corpora on both splits and writes the report
(`bench/retrieval_report.py` → `bench/results/retrieval.md`).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import inspect
import json
import os
import shutil
import sqlite3
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from _paths import BENCH, ROOT
from cdr.ckf import CKF, ingest
from cdr.ckf.schema import DB_NAME
from cdr.cli.samples import cache_dir
from cdr.ranking import rank
from cdr.retrieval.fact_recipe import DEFAULT_RECIPE, fact_text
from cdr.session import EXHAUSTION_RATIO
from cdr.window.loop import Generator
from cdr.writers import get_writer
from quality_arms import CachingEmbedder
from retrieval_arms import (
    RECIPES,
    RetrievalArm,
    all_arms,
    generation_config,
    inert,
    plan_arms,
)
from retrieval_metrics import summarise, window_measures

RESULTS = BENCH / "results"
RUNS = RESULTS / "retrieval-runs.jsonl"
INGEST_SPEED = RESULTS / "retrieval-ingest.json"
CKF_DIR = cache_dir() / "bench" / "retrieval"
MAX_WINDOWS = 12
# Enough for every section of a task's outline over 12 windows (the measurement used
# 9,000 words on the encyclopedia articles).
WORDS = 9000

# The Python-docs tasks (bench/quality_tasks.DEFAULT_PAGES) split by sha1 of the page path,
# the 6 smallest digests for tuning; fixed before any tuning.
PYDOCS_TUNE: tuple[str, ...] = (
    "library/dataclasses.html", "library/re.html", "library/typing.html",
    "reference/datamodel.html", "reference/expressions.html", "reference/import.html",
)
PYDOCS_REPORT: tuple[str, ...] = (
    "library/argparse.html", "library/asyncio-task.html", "library/collections.html",
    "library/configparser.html", "library/datetime.html", "library/logging.html",
    "library/subprocess.html", "library/threading.html", "library/unittest.html",
    "reference/compound_stmts.html",
)

console = Console()


@dataclass(frozen=True)
class RTask:
    """One benchmark task: a document of the corpus."""

    corpus: str
    name: str  # the document's name (man page name, or docs page path)
    text: str  # the task given to the loop
    outline: tuple[str, ...]  # the document's sections
    source: str  # the document's source path as stored in the CKF

    @property
    def outline_text(self) -> str:
        return "\n".join(self.outline)


@dataclass
class CorpusData:
    name: str
    version: str  # where the text comes from, exactly
    ckfs: dict[str, CKF]  # recipe -> CKF
    tasks: dict[str, list[RTask]]  # split -> tasks
    ingest_seconds: dict[str, float]
    embedded: dict[str, int]  # facts embedded by this run's ingest (0: the CKF was built)


# ------------------------------------------------------------------------------- corpora


def _ingest(path: Path, recipe: str, docs: Path, include: Sequence[str],
            exclude: Sequence[str] = ()) -> tuple[CKF, float, int]:
    ckf = CKF.open_or_create(path, recipe=recipe)
    t0 = time.perf_counter()
    rep = ingest(ckf, [docs], source_type="official", include=list(include),
                 exclude=list(exclude))
    ckf.refresh()
    if int(ckf.active.sum()) < ckf.n_rows:
        # Re-ingests under earlier code left superseded rows behind. Run keys name `n_rows`,
        # and a run's records name rows by index, so only what a fresh build of these
        # documents gives is reproducible from a clean checkout: build it again.
        print(f"{path.name}: {ckf.n_rows - int(ckf.active.sum())} superseded rows of "
              "earlier ingests; building it again from the documents", flush=True)
        ckf.close()
        shutil.rmtree(path)
        return _ingest(path, recipe, docs, include, exclude)
    return ckf, time.perf_counter() - t0, rep.embedded


def ingest_pages(path: Path, docs: Path, pages: Sequence[str],
                 recipe: str = DEFAULT_RECIPE) -> CKF:
    """A CKF of exactly `pages` (file names under `docs`), built on first use."""
    return _ingest(path, recipe, docs, list(pages))[0]


def man_corpus(recipes: Sequence[str] = RECIPES) -> CorpusData:
    """The man-page corpus, its CKF built with each of `recipes` (only those are embedded)."""
    import corpus_man

    md, version, pages = corpus_man.corpus_dir()
    ckfs, secs, emb = {}, {}, {}
    for r in recipes:
        ckfs[r], secs[r], emb[r] = _ingest(CKF_DIR / f"man-{r}.ckf", r, md, ["*.md"])
    by_name = {p.name: p for p in pages}

    def task(name: str) -> RTask:
        p = by_name[name]
        return RTask("man", name, p.task, p.sections, str(md / f"{name}.md"))

    tasks = {s: [task(n) for n in corpus_man.split_names(s)] for s in ("tune", "report")}
    return CorpusData("man", f"Debian {corpus_man.DEBIAN_PACKAGE} {version}, section 2, "
                      f"{len(pages)} pages", ckfs, tasks, secs, emb)


def pydocs_corpus(recipes: Sequence[str] = RECIPES) -> CorpusData:
    """The Python-docs corpus, its CKF built with each of `recipes` (only those are embedded)."""
    from corpus import DEBIAN_PACKAGE, python_docs_dir
    from quality import EXCLUDE, RELATED
    from quality_tasks import make_task, page_of

    docs = python_docs_dir()
    ckfs, secs, emb = {}, {}, {}
    for r in recipes:
        ckfs[r], secs[r], emb[r] = _ingest(CKF_DIR / f"pydocs-{r}.ckf", r, docs, RELATED,
                                           EXCLUDE)
    ckf = ckfs[recipes[0]]
    sections: dict[str, list[str]] = {}
    for f in ckf.facts(np.flatnonzero(ckf.active)):
        page = page_of(f.source, str(docs))
        if page is not None:
            sections.setdefault(page, []).append(f.section)
    tasks: dict[str, list[RTask]] = {}
    for split, pages in (("tune", PYDOCS_TUNE), ("report", PYDOCS_REPORT)):
        tasks[split] = []
        for p in pages:
            t = make_task(p, sections.get(p, []))
            if t is not None:
                tasks[split].append(RTask("pydocs", p, t.title, t.outline, str(docs / p)))
    version = _deb_version(DEBIAN_PACKAGE)
    return CorpusData("pydocs", f"Debian {DEBIAN_PACKAGE} {version}, `related` pages",
                      ckfs, tasks, secs, emb)


def _deb_version(package: str) -> str:
    try:
        out = subprocess.run(["apt-cache", "policy", package], capture_output=True, text=True,
                             timeout=30).stdout
        for line in out.splitlines():
            if line.strip().startswith("Candidate:"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown version"


def own_rows(ckf: CKF, shared: bool = False) -> dict[str, set[int]]:
    """source → the active CKF rows of that document.

    A text several documents hold (man pages repeat "EFAULT buf points outside your accessible
    address space." word for word) is stored once, under the first document that held it.
    With `shared`, it counts as each holding document's own (from the CKF's occurrences): the
    page a task was made from does contain it, and sending it is on-topic; without, it counts
    only for the document it is stored under."""
    out: dict[str, set[int]] = {}
    active = np.asarray(ckf.active)
    for f in ckf.facts(np.flatnonzero(active)):
        out.setdefault(f.source, set()).add(int(f.row))
    if shared:
        db = sqlite3.connect(f"file:{ckf.path / DB_NAME}?mode=ro", uri=True)
        try:
            pairs = db.execute("SELECT o.row, d.source FROM occurrences o JOIN documents d "
                               "ON d.doc_id = o.doc_id").fetchall()
        finally:
            db.close()
        for row, source in pairs:
            if 0 <= row < len(active) and active[row]:
                out.setdefault(source, set()).add(int(row))
    return out


# ------------------------------------------------------------------------------- one run


def run_one(ckf: CKF, embedder: CachingEmbedder, own: set[int], task: RTask,
            arm: RetrievalArm, max_windows: int, words: int) -> dict[str, Any]:
    """One (arm, task) run to the arm's own exit; its per-window measures and summary."""
    t0 = time.perf_counter()
    cfg = generation_config(arm, max_windows=max_windows, words=words)
    gen = Generator(ckf, get_writer("extractive"), cfg)
    gen.embedder = embedder
    session = gen.start(task.text, task.outline_text)
    selection = gen.candidates(session)
    pool = {int(r) for r in selection.indices} & own
    envelopes: list[list[int]] = []
    written: list[bool] = []
    statuses: list[str] = []
    for ev in gen.run(task.text, session=session):
        envelopes.append([int(r) for r in ev.prepared.rows])
        written.append(bool(ev.output.strip()))
        statuses.append(ev.status)
    measures = window_measures(envelopes, written, own, pool)
    summary = summarise(measures, statuses)
    sent = {r for env, w in zip(envelopes, written, strict=True) if w for r in env}
    condemned = below_floor(gen, session, selection, sorted(pool - sent))
    loop_pool = pool - condemned
    loop_summary = summarise(window_measures(envelopes, written, own, loop_pool), statuses)
    return {
        "corpus": task.corpus, "task": task.name, "arm": arm.name, "recipe": arm.recipe,
        "config": arm.config, "group": arm.group,
        "own": len(own), "own_pool": len(pool), "candidates": len(selection.indices),
        "statuses": statuses,
        "windows": [{k: (round(v, 5) if isinstance(v, float) else v)
                     for k, v in dataclasses.asdict(m).items()} for m in measures],
        "summary": {k: (round(v, 5) if isinstance(v, float) else v)
                    for k, v in dataclasses.asdict(summary).items()},
        "exit_timing": summary.exit_timing,
        # The own pool as the loop sees it at its end: less the facts never sent whose
        # novelty ratio has fallen below Exit 3's floor (their 6-grams were written, or their
        # topic is covered), which the spec's loop would not send again.
        "own_pool_loop": len(loop_pool), "below_floor": len(condemned),
        "exit_timing_loop": loop_summary.exit_timing,
        "seconds": round(time.perf_counter() - t0, 2),
    }


def below_floor(gen: Generator, session: Any, selection: Any, rows: list[int]) -> set[int]:
    """Of `rows` (Phase 1 candidates), those whose novelty ratio (novelty × (1 − n-gram
    penalty)), ranked as the loop ranks them at the session's current state, is below Exit 3's
    floor: the loop would end a window made of them unwritten (`cdr.window.loop.stale_envelope`)."""
    if not rows:
        return set()
    pos = {int(r): i for i, r in enumerate(selection.indices)}
    at = np.array([pos[r] for r in rows], dtype=np.int64)
    counts = session.blacklist.counts
    ranking = rank(selection.embeddings[at], selection.relevances[at],
                   importance=gen.index.importance[np.asarray(rows)],
                   ngram_counts=counts[np.asarray(rows)] if len(counts) else None,
                   coverage=session.coverage, residual=session.residual,
                   mode=session.ranking, min_relevance=-1.0, rows=np.asarray(rows))
    ratio = ranking.novelty * (1.0 - ranking.ngram_penalty)
    return {int(r) for r, x in zip(ranking.indices, ratio, strict=True)
            if x < EXHAUSTION_RATIO}


# ------------------------------------------------------------------------------- checkpoint


def code_hash() -> str:
    """What a finished run depends on: the library and the benchmark's measuring code. A run
    made on another library is not reused (the report keeps the latest run per arm and task)."""
    h = hashlib.sha256()
    for p in sorted((ROOT / "src" / "cdr").rglob("*.py")):
        h.update(p.relative_to(ROOT).as_posix().encode())
        h.update(p.read_bytes())
    for name in ("retrieval_metrics.py",):
        h.update((BENCH / name).read_bytes())
    h.update(inspect.getsource(run_one).encode())
    return h.hexdigest()[:16]


def run_key(code: str, task: RTask, arm: RetrievalArm, max_windows: int, words: int,
            n_rows: int) -> str:
    parts = [code, task.corpus, task.name, task.text, task.outline, arm.name, arm.recipe,
             sorted(arm.config.items()), max_windows, words, n_rows, inert(arm)]
    return hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()[:32]


def load_runs(path: Path) -> dict[str, dict[str, Any]]:
    """key → run; a line cut by an interruption is skipped."""
    runs: dict[str, dict[str, Any]] = {}
    if path.exists():
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                rec = json.loads(line)
                runs[rec["key"]] = rec
            except (ValueError, KeyError, TypeError):
                continue
    return runs


def append_run(path: Path, rec: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as f:
        f.write(json.dumps(rec, sort_keys=True) + "\n")
        f.flush()
        os.fsync(f.fileno())


def library_commit() -> str:
    try:
        out = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "src"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return out + ("+dirty" if dirty else "")
    except OSError:
        return "unknown"


# ------------------------------------------------------------------------------- ingest speed


def ingest_speed(ckf: CKF, rounds: int = 2, chunk: int = 128,
                 limit: int | None = 1200) -> dict[str, Any]:
    """Facts/s embedding the same facts' texts as each recipe makes them (`RECIPES`: plain,
    title-section, title-section-short), interleaved chunk by chunk (A B C, then C B A) so a
    change in the machine's load hits all alike. This is the part of ingest the recipe changes;
    parsing and storing are the same for all; any one CKF of the corpus holds the texts. At most
    `limit` facts, evenly spaced over the CKF, so a large corpus is timed in minutes."""
    db = sqlite3.connect(f"file:{ckf.path / DB_NAME}?mode=ro", uri=True)
    try:
        rows = db.execute("SELECT f.content, d.title, f.section FROM facts f LEFT JOIN "
                          "documents d ON d.doc_id = f.doc_id ORDER BY f.row").fetchall()
    finally:
        db.close()
    if limit is not None and len(rows) > limit:
        rows = [rows[i] for i in np.linspace(0, len(rows) - 1, limit).round().astype(int)]
    texts = {r: [fact_text(r, c, t, s) for c, t, s in rows] for r in RECIPES}
    model = getattr(ckf.embedder, "base", ckf.embedder)
    secs = dict.fromkeys(RECIPES, 0.0)
    model.encode(texts[RECIPES[0]][:32])  # warm-up, not timed
    for k in range(rounds):
        order = RECIPES if k % 2 == 0 else RECIPES[::-1]
        for lo in range(0, len(rows), chunk):
            for r in order:
                t0 = time.perf_counter()
                model.encode(texts[r][lo: lo + chunk])
                secs[r] += time.perf_counter() - t0
    n = len(rows) * rounds
    words = {r: float(np.mean([len(t.split()) for t in texts[r]])) for r in RECIPES}
    return {"facts": len(rows), "rounds": rounds, "chunk": chunk,
            "facts_per_s": {r: n / secs[r] for r in RECIPES},
            "mean_words": words, "load": os.getloadavg()[0]}


# ------------------------------------------------------------------------------- main


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", choices=("man", "pydocs"), default="man")
    ap.add_argument("--split", choices=("tune", "report"), default="tune")
    ap.add_argument("--arms", default=None, help="comma-separated arm names (default: all "
                    "that can run on this checkout)")
    ap.add_argument("--tasks", type=int, default=None, help="only the first N tasks")
    ap.add_argument("--max-windows", type=int, default=MAX_WINDOWS)
    ap.add_argument("--words", type=int, default=WORDS)
    ap.add_argument("--runs", type=Path, default=RUNS,
                    help="JSONL checkpoint of finished runs (resumed from)")
    ap.add_argument("--restart", action="store_true", help="ignore finished runs")
    ap.add_argument("--ingest-speed", action="store_true",
                    help="also time embedding plain vs title-section texts (same facts)")
    ap.add_argument("--no-report", action="store_true", help="do not rewrite the report")
    args = ap.parse_args(argv)
    from cdr import settings

    settings.export({"CDR_EMBED_CACHE": ""})  # time the model, never vectors kept by a run
    if not 1 <= args.max_windows <= 20:
        ap.error("--max-windows must be within 1..20")
    plan = plan_arms(all_arms())
    arms = plan.run
    if args.arms:
        want = args.arms.split(",")
        unknown = [a for a in want if a not in {x.name for x in all_arms()}]
        if unknown:
            ap.error(f"unknown arms {unknown}; choose from {[x.name for x in all_arms()]}")
        arms = [a for a in arms if a.name in want]
    for a, why in plan.skipped:
        console.print(f"[yellow]skipped arm {a.name!r}: {why}[/]")
    console.print(f"building the {args.corpus} CKFs (once per recipe; unchanged pages are "
                  "not embedded again)…")
    # Only the recipes the chosen arms read are built (a corpus embeds in minutes to an hour).
    need = tuple(r for r in RECIPES if any(a.recipe == r for a in arms))
    build = man_corpus if args.corpus == "man" else pydocs_corpus
    data = build(need or RECIPES)
    tasks = data.tasks[args.split][: args.tasks]
    code, commit = code_hash(), library_commit()
    done = {} if args.restart else load_runs(args.runs)
    if args.restart and args.runs.exists():
        args.runs.unlink()
    owners = {r: own_rows(c, shared=True) for r, c in data.ckfs.items()}
    embedders = {r: CachingEmbedder(c.embedder) for r, c in data.ckfs.items()}
    jobs = [(a, t) for a in arms for t in tasks]
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn())
    started = time.perf_counter()
    fresh_runs = 0
    with Progress(*columns, console=console) as progress:
        bar = progress.add_task("runs", total=len(jobs))
        for a, t in jobs:
            ckf = data.ckfs[a.recipe]
            key = run_key(code, t, a, args.max_windows, args.words, ckf.n_rows)
            progress.update(bar, description=f"{a.name:>34} · {t.name}")
            if key not in done:
                rec = run_one(ckf, embedders[a.recipe], owners[a.recipe].get(t.source, set()),
                              t, a, args.max_windows, args.words)
                opts = generation_config(a, max_windows=args.max_windows,
                                         words=args.words).session_options()
                rec.update(key=key, split=args.split, commit=commit, label=a.label,
                           inert=inert(a), options=dataclasses.asdict(opts),
                           max_windows=args.max_windows, words=args.words,
                           corpus_version=data.version, n_facts=ckf.n_rows)
                append_run(args.runs, rec)
                done[key] = rec
                fresh_runs += 1
            progress.advance(bar)
    console.print(f"{len(jobs)} runs ({fresh_runs} new, {len(jobs) - fresh_runs} from "
                  f"{args.runs}) in {time.perf_counter() - started:.0f} s")
    if args.ingest_speed:
        speed = ingest_speed(next(iter(data.ckfs.values())))
        speed.update(corpus=data.name, corpus_version=data.version,
                     ingest_seconds=data.ingest_seconds, ingest_embedded=data.embedded)
        every = json.loads(INGEST_SPEED.read_text(encoding="utf-8")) if INGEST_SPEED.exists() \
            else {}
        if "facts_per_s" in every:  # the file's first layout: one corpus, the man pages
            every = {"man": every}
        every[data.name] = speed
        INGEST_SPEED.write_text(json.dumps(every, indent=1) + "\n", encoding="utf-8")
        console.print(f"embedding speed: {speed['facts_per_s']}")
    meta = RESULTS / "retrieval-meta.json"
    info = json.loads(meta.read_text(encoding="utf-8")) if meta.exists() else {}
    info[data.name] = {"version": data.version,
                       "facts": {r: c.n_rows for r, c in data.ckfs.items()},
                       "documents": len({s for o in owners.values() for s in o}),
                       "skipped_arms": [[a.name, why] for a, why in plan.skipped]}
    meta.write_text(json.dumps(info, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    if not args.no_report:
        import retrieval_report

        out = retrieval_report.write(args.runs, RESULTS / "retrieval.md")
        console.print(f"report: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
