"""`make demo-llm`: `make demo`'s task written by the real reference model, CDR and
relevance-only side by side.

Same CKF, task, outline and tables as `make demo`, plus the words each window kept, how it
finished (a token-limited window keeps its complete paragraphs) and its seconds. The documents
and traces land in demo-output/ (guide-llm-cdr.md, guide-llm-relevance.md, trace-llm-*.json).
The defaults are the windows a long document needs and this CPU can run (docs/llm.md,
"Windows sized to the model"): 3,072-token context and 1,024 generated tokens a window (about
590 words), 3 windows per ranking; `--windows`, `--context-tokens` and `--generation-tokens`
change them.

`run_windows` is the one helper that runs N windows of a task with a writer and returns the
events with timings; the LLM quality benchmark calls it per arm.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from cdr.errors import CdrError
from cdr.options import DEFAULTS

console = Console()


@dataclass
class ArmRun:
    """One arm's windows, and the session they updated."""

    ranking: str
    events: list[Any]
    session: Any
    seconds: float


def run_windows(
    store: Any,
    writer: Any,
    task: str,
    outline: str | None,
    *,
    ranking: str = DEFAULTS.ranking,
    windows: int = DEFAULTS.max_windows,
    words: int = DEFAULTS.words,
    context_tokens: int = 3072,  # this demo's: the reference model's small context
    generation_tokens: int = 768,
    on_window: Any = None,
    generator_cls: Any = None,
    **config: Any,
) -> ArmRun:
    """Run up to `windows` windows of `task` with `writer`, exactly as `cdr generate` does
    (`generator_cls`: a `Generator` subclass, for experiments on the prompt)."""
    from cdr.window.loop import GenerationConfig, Generator

    gen = (generator_cls or Generator)(store, writer, GenerationConfig(
        max_windows=windows, words=words, ranking=ranking, context_tokens=context_tokens,
        generation_tokens=generation_tokens, **config))
    t0 = time.perf_counter()
    session = gen.start(task, outline)
    events = []
    for event in gen.run(task, session=session):
        events.append(event)
        if on_window is not None:
            on_window(event)
    return ArmRun(ranking, events, session, time.perf_counter() - t0)


def restated_shares(outputs: list[str], embedder: Any) -> list[float]:
    """Per window, the share of its sentences that restate an earlier window in other words
    (`cdr.report.quality.semantic_repetition` at the threshold `make bench-llm` calibrated); NaN for
    a window with no prose sentence."""
    import numpy as np

    from cdr.report.quality import SEMANTIC_REPETITION_THRESHOLD, semantic_repetition, sentences

    vecs = []
    for text in outputs:
        sents = sentences(text)
        vecs.append(np.asarray(embedder.encode(sents)) if sents else np.zeros((0, 1)))
    return semantic_repetition(vecs, SEMANTIC_REPETITION_THRESHOLD)


def words_table(run: ArmRun, restated: list[float]) -> Table:
    from cdr.window.dpe import word_count

    t = Table(title=f"ranking = {run.ranking}: what the model wrote")
    for col in ("win", "words kept", "finish", "attributed", "chatter/off-plan", "restated",
                "seconds"):
        t.add_column(col, justify="right")
    for e, share in zip(run.events, restated, strict=True):
        t.add_row(str(e.number), str(word_count(e.output)), e.finish_reason,
                  str(sum(e.report.words.values())), str(e.report.unattributed_words),
                  "-" if share != share else f"{share:.0%}", f"{e.seconds:.0f}")
    return t


def restated_table(restated: dict[str, list[float]], words: dict[str, int]) -> Table:
    """Words written and semantic repetition over windows 2+, per ranking."""
    t = Table(title="What the model wrote (restated: share of windows 2+'s sentences that "
                    "restate an earlier window)")
    for col in ("ranking", "words", "restated"):
        t.add_column(col, justify="right")
    for ranking, shares in restated.items():
        later = [x for x in shares[1:] if x == x]
        t.add_row(ranking, str(words[ranking]),
                  f"{sum(later) / len(later):.1%}" if later else "-")
    return t


def main(argv: list[str] | None = None) -> None:
    from cdr.cli.demo import OUTLINE, TASK, build_ckf, summary_table
    from cdr.cli.samples import cache_dir
    from cdr.cli.tables import window_table
    from cdr.trace import build_trace
    from cdr.window.assemble import assemble_document
    from cdr.writers.local import LocalWriter

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--windows", type=int, default=3)
    parser.add_argument("--words", type=int, default=1200)
    parser.add_argument("--context-tokens", type=int, default=3072,
                        help="envelope budget (cl100k); the model gets 1.3x this as context")
    parser.add_argument("--generation-tokens", type=int, default=DEFAULTS.generation_tokens)
    parser.add_argument("--out", type=Path, default=Path("demo-output"))
    parser.add_argument("--cache", type=Path, default=cache_dir() / "demo")
    parser.add_argument("--repeats", choices=("keep", "drop"), default="keep",
                        help="drop: both rankings with the opt-in repeat guard "
                             "(cdr.window.repeat_guard), as `cdr generate --repeats drop`")
    args = parser.parse_args(argv)
    t0 = time.perf_counter()
    try:
        writer = LocalWriter(n_ctx=max(4096, round(args.context_tokens * 1.3)))
    except CdrError as exc:
        console.print(f"[bold red]error:[/] {exc}")
        raise SystemExit(1) from None
    args.out.mkdir(parents=True, exist_ok=True)
    store = build_ckf(args.cache)
    console.print(f"\n[bold]Task:[/] {TASK}\n[bold]Model:[/] {writer.model_path}\n"
                  f"[bold]Outline:[/] " + "; ".join(OUTLINE.strip().splitlines()) + "\n")
    results = {}
    restated: dict[str, list[float]] = {}
    words: dict[str, int] = {}
    for ranking in ("cdr", "relevance"):
        def show(e: Any, ranking: str = ranking) -> None:
            console.print(f"  {ranking} window {e.number}: {len(e.output.split())} words, "
                          f"{e.finish_reason}, {e.seconds:.0f}s, status {e.status}")

        run = run_windows(store, writer, TASK, OUTLINE, ranking=ranking, windows=args.windows,
                          words=args.words, context_tokens=args.context_tokens,
                          generation_tokens=args.generation_tokens, on_window=show,
                          repeats=args.repeats)
        results[ranking] = run.events
        document = assemble_document(TASK, [e.output for e in run.events],
                                     OUTLINE.splitlines())
        (args.out / f"guide-llm-{ranking}.md").write_text(document, "utf-8")
        (args.out / f"trace-llm-{ranking}.json").write_text(
            json.dumps(build_trace(run.session, run.events), indent=2), "utf-8")
        console.print(window_table(run.events, f"ranking = {ranking}"))
        restated[ranking] = restated_shares([e.output for e in run.events], store.embedder)
        words[ranking] = sum(len(e.output.split()) for e in run.events)
        console.print(words_table(run, restated[ranking]))
    console.print(summary_table(results))
    console.print(restated_table(restated, words))
    console.print(f"\nDocuments and traces in {args.out}/ (guide-llm-cdr.md, "
                  f"guide-llm-relevance.md, trace-llm-*.json). Total "
                  f"{time.perf_counter() - t0:.0f}s.")


if __name__ == "__main__":
    main()
