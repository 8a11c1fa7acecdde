"""What the output guard (`repeats: "drop"`, `cdr.window.repeat_guard`) would have kept of
the long runs' windows: an estimate, read off the recorded texts, of the one lever against
repetition at length that acts on the model's output rather than on its input.

Each run's windows are filtered in order, as the loop filters them: the guard sees the 6-grams
and sentence vectors of what earlier windows *kept*, and each window's kept text goes on to the
next. A real run with the guard would differ after the first drop (the next prompt quotes the
kept text, and the length contract asks for the words dropped), so this bounds what the guard
takes out of text like this, not a run's figures.

    python bench/long_llm_guard.py            # every finished run of the local-model matrix
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import Any

import numpy as np

from _paths import BENCH
from cdr.ngrams import ngram_hashes
from cdr.retrieval.embed import default_embedder
from cdr.window.repeat_guard import RESTATE_COSINE, RepeatGuard

RUNS = BENCH / "results" / "long-llm-runs.jsonl"
OUT = BENCH / "results" / "long-llm-guard.json"
PAGE_WINDOW_WORDS = 450  # about what a window of the runs writes (337–701 words at 5,000+)


def guarded(texts: Sequence[str], encode: Any, dim: int, cosine: float = RESTATE_COSINE
            ) -> list[tuple[str, int]]:
    """(kept text, units dropped) per window, each filtered against what the earlier ones
    kept."""
    seen: set[int] = set()
    earlier = np.zeros((0, dim), np.float32)
    out = []
    for text in texts:
        guard = RepeatGuard(seen.__contains__, earlier, encode, restate_cosine=cosine)
        res = guard.filter(text)
        out.append((res.text, len(res.dropped)))
        seen.update(np.unique(ngram_hashes(res.text)).tolist())
        if len(res.vectors):
            earlier = np.vstack([earlier, res.vectors])
    return out


def _kept(texts: Sequence[str], encode: Any, dim: int, cosine: float) -> tuple[int, int]:
    """(words, words the guard keeps) of `texts` taken as consecutive windows."""
    kept = guarded(texts, encode, dim, cosine)
    return sum(len(t.split()) for t in texts), sum(len(t.split()) for t, _ in kept)


def page_windows(ckf: Any, own: set[int]) -> list[str]:
    """The task page's own facts, in document order, cut into windows of
    `PAGE_WINDOW_WORDS`: text that repeats nothing on purpose."""
    facts = ckf.facts(np.asarray(sorted(own), dtype=np.int64))
    words = " ".join(f.content for f in facts).split()
    return [" ".join(words[i:i + PAGE_WINDOW_WORDS])
            for i in range(0, len(words), PAGE_WINDOW_WORDS)]


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--min-words", type=int, default=5000,
                    help="runs asked at least this many words (the long ones)")
    args = ap.parse_args(argv)
    from long_llm import load_fixed_tasks
    from long_llm_semrep import load_calibration

    emb = default_embedder()
    cal = load_calibration()
    cosines = [RESTATE_COSINE] + ([round(cal["threshold"], 3)] if cal else [])
    runs = [json.loads(line) for line in RUNS.read_text(encoding="utf-8").splitlines() if line]
    runs = [r for r in runs if r["words"] >= args.min_words and r["delivered"]]
    # The control depends on the page and the threshold only: once per task, not per run.
    page_kept = {}
    for ckf, own, t in load_fixed_tasks():
        if any(r["task"] == t.name for r in runs):
            page = page_windows(ckf, own)
            for c in cosines:
                total, kept = _kept(page, emb.encode, emb.dim, c)
                page_kept[t.name, c] = kept / total
    rows = []
    for r in runs:
        texts = [w["text"] for w in r["windows"]]
        row = {"task": r["task"], "arm": r["arm"], "asked": r["words"], "windows": len(texts)}
        for c in cosines:
            words, kept = _kept(texts, emb.encode, emb.dim, c)
            row["words"] = words
            row[f"kept_{c}"] = kept / max(words, 1)
            row[f"page_kept_{c}"] = page_kept[r["task"], c]
        rows.append(row)
    OUT.write_text(json.dumps({"cosines": cosines, "page_window_words": PAGE_WINDOW_WORDS,
                               "runs": rows}, indent=1), encoding="utf-8")
    head = " | ".join(f"kept at {c} (the page's own text)" for c in cosines)
    print(f"| task | arm | asked | windows | words | {head} |")
    print("|---|---|---:|---:|---:|" + "---:|" * len(cosines))
    for row in rows:
        cells = " | ".join(f"{row[f'kept_{c}']:.0%} ({row[f'page_kept_{c}']:.0%})"
                           for c in cosines)
        print(f"| {row['task']} | {row['arm']} | {row['asked']:,} | {row['windows']} | "
              f"{row['words']:,} | {cells} |")
    print(f"written: {OUT}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
