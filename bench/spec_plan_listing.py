"""How many of a window's packed facts its prompt lists (docs/design.md §3.17, "The envelope is
what the prompt lists"): the spec profile (no length contract) with a model-like writer, per
window, the facts packed, the facts the prompt lists, the sections planned, the listed facts'
text in cl100k tokens (labels not counted) and the whole prompt with its chat framing.

The built-in types knowledge base of the tests (`tests/conftest.py`, 14 pydoc topics and 8
unrelated ones) under its six-section outline, 5 windows, 3,000 words asked, at 2,048 / 320
(bench-llm's window), 3,072 / 1,024 (bench-long's) and 4,096 / 1,024 (the CLI's default). The
writer is `tests/test_prompt_budget.py`'s prose writer: the window's planned sections written
from its listed facts by the extractive writer, cut at 150 words, no model. To compare two
checkouts, run it on each:

    PYTHONPATH=CHECKOUT/src .venv/bin/python bench/spec_plan_listing.py --out FILE.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

from _paths import ROOT
from cdr.ckf import CKF
from cdr.session import IN_PROGRESS
from cdr.text.tokens import count_tokens
from cdr.window.loop import GenerationConfig, Generator
from cdr.writers import get_writer
from cdr.writers.base import WriterResult, estimate_prompt_tokens

sys.path.insert(0, str(ROOT))  # tests.conftest: the knowledge base the tests build
from tests.conftest import (
    BUILTIN_TYPES_OUTLINE,
    BUILTIN_TYPES_TASK,
    BUILTIN_TYPES_TOPICS,
    DISTRACTOR_TOPICS,
    build_topics_ckf,
)

WINDOWS = [(2048, 320), (3072, 1024), (4096, 1024)]
LISTED = re.compile(r"^\[(F\d+)\] \(.*\)\n(.*)$", re.M)


class ProseWriter:
    """Writes prose (no `pastes_facts`), so the loop plans and prompts as for a model."""

    name = "prose"

    def __init__(self) -> None:
        self.prompts: list[list[dict[str, str]]] = []

    def generate(self, messages: list[dict[str, str]], max_tokens: int, *,
                 on_delta: Any = None) -> WriterResult:
        self.prompts.append(messages)
        words = get_writer("extractive").generate(messages, 100_000).text.split(" ")
        text = " ".join([*words[:150], f"Call {len(self.prompts)} ends here."])
        return WriterResult(text, "length", {"completion_tokens": len(text.split())})


def run(ckf: Path, context: int, generation: int) -> list[dict[str, Any]]:
    """One 5-window run's per-window counts."""
    writer = ProseWriter()
    cfg = GenerationConfig(max_windows=5, words=3000, context_tokens=context,
                           generation_tokens=generation)
    gen = Generator(CKF.open(ckf), writer, cfg)
    session = gen.start(BUILTIN_TYPES_TASK, BUILTIN_TYPES_OUTLINE)
    rows = []
    while session.status == IN_PROGRESS:
        event = gen.step(session)
        if not (event.output or event.usage):
            rows.append({"window": event.number, "written": False})
            continue
        listed = LISTED.findall(writer.prompts[-1][-1]["content"])
        rows.append({"window": event.number, "written": True,
                     "packed": len(event.prepared.envelope), "listed": len(listed),
                     "sections": len(event.prepared.plan),
                     "listed_tokens": sum(count_tokens(f"[{r}]\n{c}\n") for r, c in listed),
                     "prompt_tokens": estimate_prompt_tokens(writer.prompts[-1])})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ckf", type=Path, default=Path("/tmp/cdr-spec-plan-listing"),
                    help="where the knowledge base is built (once) and read")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    ckf = args.ckf / "ckf"
    if not ckf.exists():
        args.ckf.mkdir(parents=True, exist_ok=True)
        build_topics_ckf(args.ckf, BUILTIN_TYPES_TOPICS + DISTRACTOR_TOPICS)
    out = {"load_before": os.getloadavg()[0], "runs": {}}
    for context, generation in WINDOWS:
        rows = run(ckf, context, generation)
        out["runs"][f"{context}/{generation}"] = rows
        for r in rows:
            print(context, generation, r, flush=True)
    out["load_after"] = os.getloadavg()[0]
    args.out.write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
