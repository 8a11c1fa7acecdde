"""How fast the reference model reads a window's prompt and writes its text on this machine, at
a few window sizes (issue 22 §1): the measurement the local writer's default context and
generation budget are chosen by (docs/llm.md, "Windows sized to the model").

For each prompt size it loads nothing new (one model, one context), writes one window of
`--generate` tokens from a prompt of real Python-docs facts cut to that many model tokens, and
reports the prompt tokens/s (prompt evaluation until the first piece) and the generation
tokens/s (the rest) separately, from `cdr.writers.local.WindowTiming`. Each prompt starts with
different text, so llama.cpp keeps no prefix from the previous one. The load average is
printed with the figures: on a shared machine they are under that load.

Usage: `python bench/llm_speed.py [--prompts 1000,2000,3500] [--generate 192] [--n-ctx 6144]`
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Sequence


def fact_text(n_words: int) -> list[str]:
    """Words of Python-docs pages (the retrieval benchmark's corpus), tags stripped."""
    import html
    import re
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from corpus import python_docs_dir

    words: list[str] = []
    for page in ("datetime", "collections", "logging", "argparse", "unittest"):
        raw = (python_docs_dir() / "library" / f"{page}.html").read_text(encoding="utf-8")
        raw = re.sub(r"<script.*?</script>|<style.*?</style>", " ", raw, flags=re.S)
        words += html.unescape(re.sub(r"<[^>]+>", " ", raw)).split()
        if len(words) > n_words:
            break
    return words


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", default="1000,2000,3500", help="prompt sizes, model tokens")
    ap.add_argument("--generate", type=int, default=192)
    ap.add_argument("--n-ctx", type=int, default=6144)
    args = ap.parse_args(argv)
    from cdr.writers.local import LocalWriter

    writer = LocalWriter(n_ctx=args.n_ctx)
    llm = writer._llm
    words = fact_text(20000)
    out = []
    for i, size in enumerate(int(x) for x in args.prompts.split(",")):
        # a distinct head per prompt: no prefix is kept from the previous call
        body, n = [f"Part {i + 1} of the notes, read carefully."], 0
        j = i * 997
        while n < size - 80:
            chunk = " ".join(words[j % len(words):(j % len(words)) + 60])
            body.append(chunk)
            j += 60
            n = len(llm.tokenize(" ".join(body).encode(), add_bos=False))
        messages = [{"role": "system", "content": f"Session {i}: write documentation."},
                    {"role": "user", "content": " ".join(body) + "\n\nWrite a detailed guide "
                     "to the notes above in full paragraphs."}]
        load = os.getloadavg()
        t0 = time.perf_counter()
        writer.generate(messages, args.generate)
        t = writer.last_timing
        assert t is not None
        row = {"n_ctx": args.n_ctx, "prompt_tokens": t.prompt_tokens,
               "evaluated": t.evaluated_tokens, "prompt_s": round(t.prompt_seconds, 1),
               "prompt_tps": round(t.prompt_tokens_per_second or 0, 1),
               "generated": t.completion_tokens, "generation_s": round(t.generation_seconds, 1),
               "generation_tps": round(t.generation_tokens_per_second or 0, 2),
               "wall_s": round(time.perf_counter() - t0, 1),
               "load_before": [round(x, 1) for x in load],
               "load_after": [round(x, 1) for x in os.getloadavg()]}
        out.append(row)
        print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
