"""What a window's prompt holds against its budget (issue 22; docs/length.md, "The budget counts
the whole prompt"): per window, the envelope budget E, the tokens the packed facts were counted
at, and the whole prompt as the writer sends it — cl100k with the chat framing
(`cdr.writers.base.estimate_prompt_tokens`, the budget's counter) and, when the reference model
is cached, its own tokenizer (its vocabulary only, as the `local` writer counts a prompt) —
with the plan lines, closing instructions and fact label lines read off the prompt.

The long-document benchmark's tasks and arms (`bench/long_llm.py`) at its 3,072 / 1,024, each
run to 12 windows at most with a model-like writer: the window's planned sections written from
its facts by the extractive writer, cut at ⌊0.577 · G⌋ words (a model's words per token,
docs/length.md), no model. To compare two packings, run it on each checkout:

    PYTHONPATH=CHECKOUT/src .venv/bin/python bench/prompt_budget.py --out FILE.json

("counted" is what the budget accounted for: C − G − E + the facts' counted tokens;
"uncounted" is the prompt less that.)
"""

from __future__ import annotations

import argparse
import json
import os
import re
from pathlib import Path
from typing import Any

from _paths import ROOT  # noqa: F401  (cdr importable from a checkout)
from cdr.session import IN_PROGRESS
from cdr.text.tokens import LLM_WORDS_PER_TOKEN, count_tokens
from cdr.window.loop import GenerationConfig, Generator
from cdr.writers import get_writer
from cdr.writers.base import WriterResult, estimate_prompt_tokens
from cdr.writers.local import reference_vocabulary
from long_llm import ARMS, CONTEXT_TOKENS, GENERATION_TOKENS, load_fixed_tasks

WINDOWS = 12
WORDS = 5000
_LABEL = re.compile(r"^\[F\d+\] \(.*\)$", re.M)


class ModelLike:
    """Writes prose from the prompt's facts, cut where a model at G tokens would be."""

    name = "model-like"

    def __init__(self, generation: int) -> None:
        self.limit = int(LLM_WORDS_PER_TOKEN * generation)
        self.calls = 0

    def generate(self, messages: list[dict[str, str]], max_tokens: int, *,
                 on_delta: Any = None) -> WriterResult:
        self.calls += 1
        words = get_writer("extractive").generate(messages, 100_000).text.split(" ")
        text = " ".join([*words[:self.limit], f"Call {self.calls} ends here."])
        return WriterResult(text, "length" if len(words) > self.limit else "stop",
                            {"completion_tokens": len(text.split())})


def _model_counter() -> Any:
    """The `local` writer's prompt count on the reference model's tokenizer, else None."""
    vocab = reference_vocabulary()
    if vocab is None:
        return None

    def count(messages: list[dict[str, str]]) -> int:  # as LocalWriter._prompt_tokens
        body = sum(len(vocab.tokenize(m["content"].encode(), add_bos=False)) for m in messages)
        return body + 5 * len(messages) + 3

    return count


def parts(user: str) -> dict[str, int]:
    """cl100k tokens of the plan lines, the closing lines and the facts' label lines."""
    plan = user.partition("\n\nFacts:\n")[0].partition("(write these sections in order")[2]
    closing = user.partition("Write this part now:")[2]
    labels = "\n".join(_LABEL.findall(user))
    return {"plan": count_tokens(plan), "closing": count_tokens(closing),
            "labels": count_tokens(labels)}


def main(out: Path) -> None:
    model_count = _model_counter()
    rows = []
    for ckf, _own, task in load_fixed_tasks():
        for arm in ARMS:
            cfg = GenerationConfig(max_windows=WINDOWS, words=WORDS,
                                   context_tokens=CONTEXT_TOKENS,
                                   generation_tokens=GENERATION_TOKENS, **arm.config)
            gen = Generator(ckf, ModelLike(GENERATION_TOKENS), cfg)
            session = gen.start(task.text, task.outline_text)
            while session.status == IN_PROGRESS:
                prepared = gen.prepare(session)
                env = prepared.envelope
                if prepared.messages and len(env):
                    prompt = estimate_prompt_tokens(prepared.messages)
                    counted = CONTEXT_TOKENS - GENERATION_TOKENS - env.budget.envelope + \
                        env.used_tokens
                    rows.append({
                        "task": task.name, "arm": arm.name, "window": prepared.number,
                        "budget": env.budget.envelope, "facts": len(env),
                        "fact_tokens": env.used_tokens, "prompt": prompt,
                        "counted": counted, "uncounted": prompt - counted,
                        "model_prompt": model_count(prepared.messages) if model_count else None,
                        **parts(prepared.messages[-1]["content"])})
                gen.write_and_complete(session, prepared)
            print(task.name, arm.name, session.window_count, session.status, flush=True)
    load = os.getloadavg()
    out.write_text(json.dumps({"context": CONTEXT_TOKENS, "generation": GENERATION_TOKENS,
                               "load": [round(x, 2) for x in load], "windows": rows}, indent=1),
                   encoding="utf-8")
    room = CONTEXT_TOKENS - GENERATION_TOKENS
    for key in ("prompt", "uncounted", "plan", "closing", "labels", "model_prompt",
                "fact_tokens", "budget"):
        vals = [r[key] for r in rows if r[key] is not None]
        if vals:
            print(f"{key:>12}: {min(vals)}–{max(vals)} (mean {sum(vals) / len(vals):.0f})")
    print(f"windows over C − G = {room}: {sum(r['prompt'] > room for r in rows)} of {len(rows)};"
          f" load {load[0]:.2f}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    main(ap.parse_args().out)
