"""Which window prompt works on the reference model? Measured, not guessed.

Variants, each run for a few windows of the same tasks with CDR ranking, the local writer at
temperature 0 / seed 42, a 2,048-token context:

* `plain`   — the prompt before issue 9: every remaining section planned, no closing lines.
* `guided`  — what the CLI now sends: only the sections the window's word budget covers,
              closing lines naming the exact headings, the word count, "no introduction, no
              conclusion", and which sections to continue rather than re-introduce.
* `guided+stop` — `guided` plus stop sequences at headings the plan never asks for
              ("## Introduction", "## Conclusion", "## Summary").

Per variant: windows, words kept, off-plan share (words Stage 8 attributed to no sub-query,
chatter included), unrequested headings (headings that name no planned section), sections
written again (a planned heading that appears in more than one window), introductions and
conclusions, CWR6 over windows 2+, finish reasons, seconds. Every window's prompt and output are
saved (`--save DIR`), which is how tests/data/llm_outputs/ was made.

    .venv/bin/python bench/llm_prompts.py --windows 3 --save tests/data/llm_outputs
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from cdr.cli.demo import OUTLINE as TYPES_OUTLINE
from cdr.cli.demo import TASK as TYPES_TASK
from cdr.cli.demo import build_ckf
from cdr.cli.demo_llm import run_windows
from cdr.cli.samples import cache_dir
from cdr.report.quality import cwr6
from cdr.session import Session
from cdr.text.markdown import parse_blocks
from cdr.window.dpe import normalise_heading, word_count
from cdr.window.loop import Generator, PreparedWindow
from cdr.window.prompt import build_user_prompt

TASKS = {
    "types": (TYPES_TASK, TYPES_OUTLINE),
    "exceptions": ("Write a guide to Python exception handling",
                   "The try statement\nRaising exceptions\nThe with statement\n"
                   "Built-in exceptions\nThe assert statement\n"),
}
STOPS = ["\n## Introduction", "\n## Conclusion", "\n## Summary", "\n# Conclusion"]


class PlainPromptGenerator(Generator):
    """The prompt as it was before issue 9, for comparison: no budget fit, no closing lines."""

    def prepare(self, session: Session) -> PreparedWindow:
        prepared = super().prepare(session)
        plan = self._plan(session, self._plan_sub_queries(session), prepared.rows,
                          prepared.envelope)
        refs = [(f"F{i + 1}", f.section or f.source, f.content)
                for i, f in enumerate(prepared.facts)]
        anchor = prepared.messages[1]["content"].splitlines()[1]
        user = build_user_prompt(session.task, anchor, plan, refs, instructions=False)
        prepared.plan = plan
        prepared.messages = [prepared.messages[0], {"role": "user", "content": user}]
        prepared.envelope.messages = prepared.messages
        return prepared


def window_stats(events: list[Any]) -> dict[str, Any]:
    words = sum(word_count(e.output) for e in events)
    off = sum(e.report.unattributed_words for e in events)
    planned_seen: Counter[str] = Counter()
    unrequested = intro = 0
    for e in events:
        planned = {normalise_heading(s.title) for s in e.prepared.plan}
        heads = [normalise_heading(b.text) for b in parse_blocks(e.output) if b.kind == "heading"]
        for h in set(heads) & planned:
            planned_seen[h] += 1
        unrequested += sum(1 for h in heads if h not in planned)
        intro += sum(1 for h in heads if re.search(r"\b(introduction|conclusion|summary)\b", h))
    later = cwr6([e.output for e in events])[1:]
    return {
        "windows": len(events), "words": words,
        "off_plan": off / words if words else 0.0,
        "unrequested_headings": unrequested, "intro_conclusion": intro,
        "sections_rewritten": sum(1 for n in planned_seen.values() if n > 1),
        "cwr6_later": sum(later) / len(later) if later else 0.0,
        "finish": dict(Counter(e.finish_reason for e in events)),
        "seconds": sum(e.seconds for e in events),
        "status": events[-1].status if events else "",
    }


def main(argv: list[str] | None = None) -> None:
    from cdr.writers import get_writer

    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--windows", type=int, default=3)
    ap.add_argument("--context-tokens", type=int, default=2048)
    ap.add_argument("--generation-tokens", type=int, default=512)
    ap.add_argument("--tasks", default="types,exceptions")
    ap.add_argument("--variants", default="plain,guided,guided+stop")
    ap.add_argument("--save", type=Path, default=None)
    ap.add_argument("--out", type=Path, default=Path("bench/results/llm-prompts.json"))
    args = ap.parse_args(argv)
    store = build_ckf(cache_dir() / "demo")
    results: dict[str, dict[str, Any]] = {}
    t0 = time.perf_counter()
    for variant in args.variants.split(","):
        # The model's tokenizer counts ~20% more tokens than cl100k (the budget's): headroom.
        writer = get_writer("local", n_ctx=round(args.context_tokens * 1.3),
                            stop=STOPS if variant.endswith("+stop") else None)
        for name in args.tasks.split(","):
            task, outline = TASKS[name]
            cls = PlainPromptGenerator if variant == "plain" else Generator
            recorder = RecordingWriter(writer)
            run = _run(cls, store, recorder, task, outline, args)
            stats = window_stats(run.events)
            results[f"{variant}/{name}"] = stats
            print(f"{variant:12s} {name:10s} {json.dumps(stats)}", flush=True)
            if args.save is not None:
                _save(args.save, variant, name, run, recorder.results)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"results": results, "args": {
        k: str(v) for k, v in vars(args).items()}, "seconds": time.perf_counter() - t0},
        indent=2), encoding="utf-8")
    print(f"wrote {args.out} in {time.perf_counter() - t0:.0f}s", file=sys.stderr)


class RecordingWriter:
    """The writer, keeping each window's result (its dropped tail too) for the fixtures."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.name, self.results = inner, inner.name, []

    def generate(self, messages: Any, max_tokens: int, *, on_delta: Any = None) -> Any:
        result = self.inner.generate(messages, max_tokens, on_delta=on_delta)
        self.results.append(result)
        return result


def _run(cls: type[Generator], store: Any, writer: Any, task: str, outline: str,
         args: argparse.Namespace) -> Any:
    return run_windows(store, writer, task, outline, windows=args.windows,
                       context_tokens=args.context_tokens,
                       generation_tokens=args.generation_tokens, generator_cls=cls,
                       on_window=lambda e: print(f"  window {e.number}: "
                                                 f"{word_count(e.output)} words, "
                                                 f"{e.finish_reason}, {e.seconds:.0f}s",
                                                 flush=True))


def _save(root: Path, variant: str, task: str, run: Any, results: list[Any]) -> None:
    """Each written window as `<task>-<variant>-w<N>.md` (the model's raw text, before the
    truncation cut) and `.json` (prompt, plan, sub-queries, finish reason, kept text)."""
    root.mkdir(parents=True, exist_ok=True)
    slug = f"{task}-{variant.replace('+', '-')}"
    written = [e for e in run.events if e.output or e.finish_reason == "length"]
    for e, result in zip(written, results, strict=False):
        stem = root / f"{slug}-w{e.number}"
        raw = result.text + (("\n\n" if result.text else "") + result.dropped_text
                             if result.dropped_text else "")
        stem.with_suffix(".md").write_text(raw, encoding="utf-8")
        meta = {
            "variant": variant, "task": run.session.task, "window": e.number,
            "messages": e.prepared.messages, "max_tokens": e.prepared.max_tokens,
            "finish_reason": e.finish_reason,
            "kept_text": e.output, "dropped_text": result.dropped_text,
            "plan": [{"title": s.title, "target_words": s.target_words}
                     for s in e.prepared.plan],
            "sub_queries": [{"id": sq.id, "text": sq.text, "expected_words": sq.expected_words}
                            for sq in run.session.sub_queries],
            "model": "Qwen2.5-Coder-1.5B-Instruct Q4_K_M, llama.cpp, temperature 0, seed 42",
        }
        stem.with_suffix(".json").write_text(json.dumps(meta, indent=2), encoding="utf-8")


if __name__ == "__main__":
    main()
