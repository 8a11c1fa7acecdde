"""`make demo`: the main job on embedded defaults — no network, no API key.

Builds a CKF from Python's own documentation (the language-reference topics shipped in the
standard library's `pydoc_data`), then writes the same multi-window guide twice with the
offline extractive writer: once ranked by CDR, once by relevance only (what CDR replaces), and
prints the per-window tables side by side so the difference is visible.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from cdr.ckf import CKF, ingest
from cdr.cli.samples import cache_dir, pydoc_topics_dir
from cdr.cli.tables import window_table
from cdr.options import DEFAULTS
from cdr.report import write_report
from cdr.report.quality import cwr6, fact_reuse
from cdr.trace import build_trace
from cdr.window.assemble import assemble_document
from cdr.window.loop import GenerationConfig, Generator, WindowEvent
from cdr.writers.extractive import ExtractiveWriter

TASK = "Write a guide to Python's built-in types"
OUTLINE = """\
Truth value testing
Numeric types
Sequence types
Text sequence type str
Mapping types dict
Methods and code objects
"""

console = Console()


def build_ckf(root: Path) -> CKF:
    topics = pydoc_topics_dir(root / "pydoc-topics", suffix=".txt")
    ckf = CKF.open_or_create(root / "pydoc.ckf")
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=console, transient=True) as bar:
        job = bar.add_task("reading documents", total=None)

        def progress(stage: str, done: int, total: int) -> None:
            label = "reading documents" if stage == "read" else "embedding new facts"
            bar.update(job, description=label, completed=done, total=total or None)

        report = ingest(ckf, [str(topics)], source_type="official", progress=progress)
    console.print(
        f"CKF {ckf.path}: {report.documents} documents, {report.facts_added} facts added, "
        f"{report.facts_kept} kept, {report.embedded} embedded in {report.seconds:.1f}s"
    )
    return ckf


def run_arm(ckf: CKF, ranking: str, windows: int, words: int, out_dir: Path
            ) -> list[WindowEvent]:
    gen = Generator(ckf, ExtractiveWriter(),
                    GenerationConfig(max_windows=windows, words=words, ranking=ranking))
    session = gen.start(TASK, OUTLINE)
    events = []
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  console=console, transient=True) as bar:
        job = bar.add_task(f"{ranking}: writing windows", total=windows)
        for event in gen.run(TASK, session=session):
            events.append(event)
            bar.advance(job)
    document = assemble_document(TASK, [e.output for e in events], OUTLINE.splitlines())
    (out_dir / f"guide-{ranking}.md").write_text(document, "utf-8")
    (out_dir / f"trace-{ranking}.json").write_text(
        json.dumps(build_trace(session, events), indent=2), "utf-8")
    return events


def summary_table(results: dict[str, list[WindowEvent]]) -> Table:
    t = Table(title="Windows 2+ compared (CWR6 and reuse: mean over windows 2+)")
    for col in ("ranking", "windows", "CWR6", "reuse", "distinct facts", "complete", "status"):
        t.add_column(col, justify="left" if col == "status" else "right",
                     no_wrap=col == "status")
    for ranking, events in results.items():
        later_rep = cwr6([e.output for e in events])[1:]
        later_reuse = fact_reuse([e.prepared.envelope.fact_ids for e in events])[1:]
        distinct = len({f for e in events for f in e.prepared.envelope.fact_ids})
        t.add_row(
            ranking, str(len(events)),
            f"{sum(later_rep) / len(later_rep):.1%}" if later_rep else "-",
            f"{sum(later_reuse) / len(later_reuse):.0%}" if later_reuse else "-",
            str(distinct), f"{events[-1].completeness:.2f}", events[-1].status,
        )
    return t


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--windows", type=int, default=DEFAULTS.max_windows)
    parser.add_argument("--words", type=int, default=3000)
    parser.add_argument("--out", type=Path, default=Path("demo-output"))
    parser.add_argument("--cache", type=Path, default=cache_dir() / "demo")
    args = parser.parse_args(argv)
    t0 = time.perf_counter()
    args.out.mkdir(parents=True, exist_ok=True)
    ckf = build_ckf(args.cache)
    console.print(f"\n[bold]Task:[/] {TASK}\n[bold]Outline:[/] "
                  + "; ".join(OUTLINE.strip().splitlines()) + "\n")
    results = {}
    for ranking in ("cdr", "relevance"):
        results[ranking] = run_arm(ckf, ranking, args.windows, args.words, args.out)
        console.print(window_table(results[ranking], f"ranking = {ranking}"))
    console.print(summary_table(results))
    report = write_report([args.out / f"trace-{r}.json" for r in results], args.out / "run.html")
    console.print(
        f"\nDocuments and traces in {args.out}/ (guide-cdr.md, guide-relevance.md, "
        f"trace-*.json). Total {time.perf_counter() - t0:.0f}s.\n"
        f"[bold]Open {report}[/] to see both runs side by side: what each window was given, "
        "what it wrote, and where it repeated itself."
    )
    console.print("Next: [bold]make demo-llm[/] writes the same guide with a real language model "
                  "on this CPU (first run: `make llm`, ~8 min build + 1.1 GB download).")


if __name__ == "__main__":
    main()
