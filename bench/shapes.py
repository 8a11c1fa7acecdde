"""Retrieval by task shape: does the default find, spread and finish a task whose material spans
several documents as well as one whose material is one document?

The knowledge base is the retrieval benchmark's man-page CKF (60 Linux system-call pages,
`bench/corpus_man.py`). Two task shapes on it:

- `single`: a page's own task (its title, its sections as the outline), the first `--single`
  tasks of the retrieval benchmark's split;
- `family`: a topic whose material is 2-5 pages of the corpus (the asynchronous-I/O calls, the
  Landlock calls, ...), asked as a user would ask it, with a thematic outline that names no page.
  Material = every fact of those pages.

The family tasks and their split were written here before any arm ran on them: tuning tasks are
the 5 whose sha1 of the name is smallest, the other 7 are report tasks (`split`).

Per run (extractive writer, to the arm's own exit, at most `--max-windows`): share of the task's
material sent, share of its documents with at least half their facts sent, on-topic share of
written envelopes, stale windows, whether it ended `ckf-exhausted` with under 80% of the
material sent (a false exhaustion), and words. Runs are appended to a JSONL checkpoint under the
cache folder as they finish, so an interrupted run resumes; the report is printed as Markdown
and written to `bench/results/shapes.md`.

Usage: `python bench/shapes.py [--split tune|report] [--arms focused,spec,relevance]
[--single 8] [--max-windows 12] [--words 6000]`.
"""

from __future__ import annotations

import argparse
import hashlib
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _paths import BENCH
from cdr.retrieval.fact_recipe import DEFAULT_RECIPE
from cdr.window.loop import Generator
from cdr.writers import get_writer
from quality_arms import CachingEmbedder
from retrieval import (
    CKF_DIR,
    RTask,
    append_run,
    code_hash,
    ingest_pages,
    load_runs,
    man_corpus,
    own_rows,
    run_key,
)
from retrieval_arms import RetrievalArm, generation_config
from retrieval_metrics import summarise, window_measures

RESULTS = BENCH / "results"
RUNS = CKF_DIR / "shapes-runs.jsonl"
FALSE_EXHAUSTION_BELOW = 0.8
HALF = 0.5


@dataclass(frozen=True)
class Family:
    name: str
    task: str
    outline: tuple[str, ...]
    pages: tuple[str, ...]


# Written before any run; the outlines are a user's, not the pages' section names.
FAMILIES: tuple[Family, ...] = (
    Family("aio", "Write a guide to the Linux kernel's native asynchronous I/O interface",
           ("Creating and destroying an I/O context", "Submitting I/O requests",
            "Waiting for completion events", "Cancelling outstanding requests",
            "Errors and portability"),
           ("io_setup", "io_submit", "io_getevents", "io_cancel", "io_destroy")),
    Family("landlock", "Write a guide to sandboxing an unprivileged process with Landlock",
           ("Creating a ruleset", "Adding access rules", "Enforcing the ruleset on a thread",
            "Errors and kernel versions"),
           ("landlock_create_ruleset", "landlock_add_rule", "landlock_restrict_self")),
    Family("sockets", "Explain how a TCP server and client set up connections with the "
           "socket system calls",
           ("Marking a socket as passive", "Accepting incoming connections",
            "Connecting to a peer", "Reading socket options", "Error handling"),
           ("listen", "accept", "connect", "getsockopt")),
    Family("numa", "Write a guide to controlling NUMA memory placement on Linux",
           ("Memory policies and nodes", "Setting a policy for a memory range",
            "Querying the current policy", "Moving pages between nodes", "Errors"),
           ("mbind", "get_mempolicy", "migrate_pages")),
    Family("xattr", "Explain how to read and list extended attributes of files on Linux",
           ("Attribute names and namespaces", "Reading an attribute's value",
            "Listing attribute names", "Buffer sizes and errors"),
           ("getxattr", "listxattr")),
    Family("zerocopy", "Write a guide to moving data between file descriptors through pipes "
           "without copying it to user space",
           ("Creating a pipe", "Splicing data into and out of a pipe",
            "Duplicating pipe content", "Flags, limits and errors"),
           ("pipe", "splice", "tee")),
    Family("pidfd", "Explain how to refer to and signal processes safely with process file "
           "descriptors",
           ("Obtaining a file descriptor for a process", "Sending a signal through it",
            "Signals sent by process ID", "Race conditions and errors"),
           ("pidfd_open", "pidfd_send_signal", "kill")),
    Family("epoll", "Write a guide to monitoring many file descriptors with epoll",
           ("Creating an epoll instance", "Waiting for events", "Timeouts and signals",
            "Errors"),
           ("epoll_create", "epoll_wait")),
    Family("cell", "Explain how programs run code on the Cell processor's synergistic "
           "processing units",
           ("Creating an SPU context", "Running an SPU context", "Stop and signal codes",
            "Errors"),
           ("spu_create", "spu_run")),
    Family("reflink", "Write a guide to sharing data between files with clone and dedupe "
           "range ioctls",
           ("Cloning a range of a file", "Deduplicating identical ranges",
            "Filesystem support and limits", "Errors"),
           ("ioctl_ficlonerange", "ioctl_fideduperange")),
    Family("timers", "Write a guide to interval timers, timer overruns and high-resolution "
           "sleeps on Linux",
           ("Interval timers", "Counting timer overruns", "Sleeping on a chosen clock",
            "Errors"),
           ("getitimer", "timer_getoverrun", "clock_nanosleep")),
    Family("mmsg", "Explain how to send and receive several socket messages in one system call",
           ("Sending multiple messages", "Receiving multiple messages",
            "Timeouts and partial results", "Errors"),
           ("sendmmsg", "recvmmsg")),
)
N_TUNE = 5


def split(name: str) -> str:
    digests = sorted(FAMILIES, key=lambda f: hashlib.sha1(f.name.encode()).hexdigest())
    return "tune" if name in {f.name for f in digests[:N_TUNE]} else "report"


ARMS: dict[str, RetrievalArm] = {
    "focused": RetrievalArm("focused", "the default (--profile focused)", DEFAULT_RECIPE,
                            {"ranking": "cdr", "profile": "focused"}),
    "focused-task": RetrievalArm("focused-task", "the default before the section pool "
                                 "(focused, pool task)", DEFAULT_RECIPE,
                                 {"ranking": "cdr", "profile": "focused", "pool": "task"}),
    "spec": RetrievalArm("spec", "--profile spec", DEFAULT_RECIPE,
                         {"ranking": "cdr", "profile": "spec"}),
    "relevance": RetrievalArm("relevance", "relevance only, focused's options", DEFAULT_RECIPE,
                              {"ranking": "relevance", "profile": "focused"}),
}


def family_task(f: Family, md_dir: Path) -> tuple[RTask, tuple[str, ...]]:
    sources = tuple(str(md_dir / f"{p}.md") for p in f.pages)
    return RTask("man-family", f.name, f.task, f.outline, sources[0]), sources


def measures(rec: dict[str, Any], docs: dict[str, set[int]]) -> dict[str, Any]:
    """The shape measures of a finished run (its envelopes are in `rec["envelopes"]`)."""
    sent = {r for env, w in zip(rec["envelopes"], rec["written"], strict=True) if w for r in env}
    material = set().union(*docs.values())
    written = [env for env, w in zip(rec["envelopes"], rec["written"], strict=True) if w]
    on_topic = [sum(1 for r in set(e) if r in material) / len(set(e)) for e in written if e]
    share = len(sent & material) / len(material) if material else math.nan
    half = [len(sent & rows) / len(rows) >= HALF for rows in docs.values() if rows]
    status = rec["statuses"][-1] if rec["statuses"] else "none"
    return {
        "material": len(material), "sent_share": share,
        "docs_half": sum(half) / len(half) if half else math.nan,
        "on_topic": sum(on_topic) / len(on_topic) if on_topic else math.nan,
        "stale": rec["summary"]["stale_windows"], "windows": len(rec["statuses"]),
        "written": len(written), "exit": status,
        "false_exhaustion": status == "ckf-exhausted" and share < FALSE_EXHAUSTION_BELOW,
        "words": rec["words"],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", choices=("man", "pg"), default="man",
                    help="man: families of system calls; pg: the PostgreSQL manual's "
                         "chapters and surveys (bench/corpus_pg.py)")
    ap.add_argument("--split", choices=("tune", "report"), default="tune")
    ap.add_argument("--arms", default="focused,focused-task,spec,relevance")
    ap.add_argument("--single", type=int, default=8)
    ap.add_argument("--max-windows", type=int, default=0, help="default 12 (man), 16 (pg)")
    ap.add_argument("--words", type=int, default=0, help="default 6000 (man), 10000 (pg)")
    ap.add_argument("--only", default="", help="comma-separated family names")
    ap.add_argument("--tag", default="", help="kept apart from runs of another tag")
    args = ap.parse_args(argv)
    arms = [ARMS[a] for a in args.arms.split(",")]
    if args.corpus == "pg":
        args.max_windows, args.words = args.max_windows or 16, args.words or 10000
        ckf, tasks = pg_tasks(args.split, args.only)
    else:
        args.max_windows, args.words = args.max_windows or 12, args.words or 6000
        ckf, tasks = man_tasks(args.split, args.only, args.single)
    owned = own_rows(ckf, shared=True)
    embedder = CachingEmbedder(ckf.embedder)
    code = code_hash()
    done = load_runs(RUNS)
    rows: list[dict[str, Any]] = []
    total = len(tasks) * len(arms)
    for i, (shape, task, sources) in enumerate(tasks):
        docs = {s: owned.get(s, set()) for s in sources}
        missing = [s for s, r in docs.items() if not r]
        if missing:
            print(f"{task.name}: no facts for {missing}", file=sys.stderr)
            return 2
        own = set().union(*docs.values())
        for j, arm in enumerate(arms):
            key = (run_key(code, task, arm, args.max_windows, args.words, ckf.n_rows)
                   + f"-shape{args.tag}")
            rec = done.get(key)
            if rec is None:
                rec = run_shape(ckf, embedder, task, arm, args.max_windows, args.words, own)
                rec["key"] = key
                append_run(RUNS, rec)
            m = measures(rec, docs)
            rows.append({"shape": shape, "task": task.name, "arm": arm.name, **m})
            print(f"[{i * len(arms) + j + 1}/{total}] {shape} {task.name} {arm.name}: "
                  f"sent {m['sent_share']:.0%} docs≥½ {m['docs_half']:.0%} "
                  f"on-topic {m['on_topic']:.0%} stale {m['stale']} "
                  f"windows {m['windows']} exit {m['exit']} words {m['words']}", flush=True)
    report = render(rows, args)
    print(report)
    RESULTS.mkdir(exist_ok=True)
    name = f"shapes-{args.split}.md" if args.corpus == "man" else f"shapes-pg-{args.split}.md"
    (RESULTS / name).write_text(report, encoding="utf-8")
    return 0


Tasks = list[tuple[str, RTask, tuple[str, ...]]]


def man_tasks(split_name: str, only: str, single: int) -> tuple[Any, Tasks]:
    """The man-page CKF; its families of `split_name` and its first `single` page tasks."""
    corpus = man_corpus((DEFAULT_RECIPE,))
    md_dir = Path(corpus.tasks["tune"][0].source).parent
    tasks: Tasks = []
    for f in FAMILIES:
        if split(f.name) == split_name and (not only or f.name in only.split(",")):
            t, sources = family_task(f, md_dir)
            tasks.append(("family", t, sources))
    if not only:
        for t in corpus.tasks[split_name][:single]:
            tasks.append(("single", t, (t.source,)))
    return corpus.ckfs[DEFAULT_RECIPE], tasks


def pg_tasks(split_name: str, only: str) -> tuple[Any, Tasks]:
    """The PostgreSQL-manual CKF (built on first use) and its chapter and survey tasks."""
    import corpus_pg
    from corpus import pg_docs_dir

    html = pg_docs_dir()
    topics = corpus_pg.topics(html)
    ckf = ingest_pages(CKF_DIR / f"pg-{DEFAULT_RECIPE}.ckf", html,
                       corpus_pg.kb_pages(html, topics))
    tasks: Tasks = []
    for t in topics:
        if corpus_pg.split(t, topics) == split_name and (not only or t.name in only.split(",")):
            sources = tuple(str(html / p) for p in t.pages)
            tasks.append((t.shape, RTask(f"pg-{t.shape}", t.name, t.task, t.outline,
                                         sources[0]), sources))
    return ckf, tasks


def run_shape(ckf: Any, embedder: Any, task: RTask, arm: RetrievalArm, max_windows: int,
              words: int, own: set[int]) -> dict[str, Any]:
    """One (arm, task) run to the arm's own exit: each window's envelope rows, whether it was
    written, the loop's status after it, and the words written."""
    cfg = generation_config(arm, max_windows=max_windows, words=words)
    gen = Generator(ckf, get_writer("extractive"), cfg)
    gen.embedder = embedder
    session = gen.start(task.text, task.outline_text)
    envelopes: list[list[int]] = []
    written: list[bool] = []
    statuses: list[str] = []
    n_words = 0
    for ev in gen.run(task.text, session=session):
        envelopes.append([int(r) for r in ev.prepared.rows])
        written.append(bool(ev.output.strip()))
        statuses.append(ev.status)
        n_words += len(ev.output.split())
    summary = summarise(window_measures(envelopes, written, own), statuses)
    return {"task": task.name, "arm": arm.name, "envelopes": envelopes, "written": written,
            "statuses": statuses, "words": n_words,
            "summary": {"stale_windows": summary.stale_windows}}


def _mean(xs: list[float]) -> float:
    xs = [x for x in xs if not math.isnan(x)]
    return sum(xs) / len(xs) if xs else math.nan


def render(rows: list[dict[str, Any]], args: Any) -> str:
    out = [f"# Retrieval by task shape ({args.split} tasks)", "",
           f"`python bench/shapes.py --split {args.split} --arms {args.arms} --single "
           f"{args.single} --max-windows {args.max_windows} --words {args.words} --corpus "
           f"{args.corpus}`; the {'man-page' if args.corpus == 'man' else 'PostgreSQL-manual'} "
           "CKF, extractive writer.", "",
           "| shape | arm | tasks | material sent | documents ≥ ½ sent | on-topic | stale "
           "windows | false exhaustions | windows | words |",
           "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for shape in ("single", "family", "chapter", "survey"):
        for arm in args.arms.split(","):
            rs = [r for r in rows if r["shape"] == shape and r["arm"] == arm]
            if not rs:
                continue
            out.append(
                f"| {shape} | {arm} | {len(rs)} | {_mean([r['sent_share'] for r in rs]):.0%} "
                f"| {_mean([r['docs_half'] for r in rs]):.0%} "
                f"| {_mean([r['on_topic'] for r in rs]):.0%} "
                f"| {sum(r['stale'] for r in rs)} | {sum(r['false_exhaustion'] for r in rs)} "
                f"| {_mean([r['windows'] for r in rs]):.1f} "
                f"| {_mean([r['words'] for r in rs]):.0f} |")
    out += ["", "| task | arm | material | sent | docs ≥ ½ | on-topic | stale | exit |",
            "|---|---|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        out.append(f"| {r['task']} | {r['arm']} | {r['material']} | {r['sent_share']:.0%} | "
                   f"{r['docs_half']:.0%} | {r['on_topic']:.0%} | {r['stale']} | {r['exit']} |")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
