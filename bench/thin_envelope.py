"""What a window may be asked to write from its envelope: the ratio of `cdr.window.length`'s
envelope cap, chosen on the TUNE split (issue 21, the thin-envelope window).

With the length contract a window was asked for its share of the owed words whatever its
envelope held: on the man pages' `listxattr` (a REPORT task) the stale stop packed the one
candidate never sent, the plan still asked for a 122-word "Description", and the reference
model wrote 245 words from memory (grounding 44.4%). The loop now asks a model writer for at
most `GROUNDED_WORDS_PER_FACT_WORD` × the words of the facts its envelope carries, and a window
whose cap is below a minimal section (`MIN_SECTION_WORDS`) is not written.

The ratio is read off the reference model's checkpointed windows on TUNE pages only (the
retrieval benchmark's split, fixed by sha1 before any tuning): per window, the words of its
envelope's facts (F), the words its plan asked for (P), the words the model wrote (W) and the
share of its sentences grounded in the envelope (cosine ≥ 0.508, the Python-docs calibration
of `bench/results/quality-llm.md`). The cap must not bind on the TUNE windows that grounded
well, so the ratio is the largest P/F among them, rounded up to a tenth. No TUNE window had a
thin envelope (none holds fewer than 600 fact words), so the ratio is the edge of what was seen
grounded, not a measured failure point: a conservative reading.

Usage: `python bench/thin_envelope.py` → `bench/results/thin_envelope.md`. Embedding the
windows' sentences and facts takes seconds; no model is run.
"""

from __future__ import annotations

import json
import math
import platform
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from _paths import BENCH  # first: makes `cdr` importable
from quality_llm_metrics import grounding, sentences

RESULTS = BENCH / "results"
RUN_DIRS = (RESULTS / "quality-llm-runs", RESULTS / "quality-llm-man-runs")
GROUNDING_BAR = 0.508  # bench/results/quality-llm.md's calibration, fixed before this
WELL_GROUNDED = 0.8  # a window counts as grounded when this share of its sentences is


def tune_pages() -> set[str]:
    """The TUNE split of both corpora, as checkpoint task names."""
    import corpus_man
    from retrieval import PYDOCS_TUNE

    return set(PYDOCS_TUNE) | set(corpus_man.split_names("tune"))


def tune_windows(run_dirs: tuple[Path, ...] = RUN_DIRS) -> list[dict[str, Any]]:
    """Every written window of a checkpointed run on a TUNE page: task, arm, F, P, W, text."""
    pages = tune_pages()
    out = []
    for d in run_dirs:
        for path in sorted(d.glob("*.json")):
            run = json.loads(path.read_text("utf-8"))
            if run["task"] not in pages:
                continue
            for w in run["windows"]:
                if not w["text"].strip():
                    continue
                out.append({"task": run["task"], "arm": run["arm"], "window": w["number"],
                            "facts": w["fact_texts"],
                            "F": sum(len(t.split()) for t in w["fact_texts"]),
                            "P": sum(int(p[1]) for p in w["plan"]),
                            "W": len(w["text"].split()), "text": w["text"]})
    return out


def with_grounding(windows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each window's grounding in its own envelope (MiniLM, as the LLM report measures it)."""
    from cdr.retrieval.embed import default_embedder

    enc = default_embedder().encode
    for w in windows:
        ss = sentences(w["text"])
        w["G"] = grounding(np.asarray(enc(ss)) if ss else np.zeros((0, 384)),
                           np.asarray(enc(w["facts"])) if w["facts"] else np.zeros((0, 384)),
                           GROUNDING_BAR)
    return windows


def chosen_ratio(windows: list[dict[str, Any]]) -> float:
    """The largest asked-over-envelope ratio P/F among the well-grounded windows, rounded up
    to a tenth: the cap binds on none of them."""
    ok = [w["P"] / w["F"] for w in windows if w["F"] and w["G"] >= WELL_GROUNDED]
    if not ok:
        raise SystemExit("no well-grounded TUNE window to read the ratio from")
    return math.ceil(max(ok) * 10) / 10


def main() -> None:
    import os

    windows = with_grounding(tune_windows())
    ratio = chosen_ratio(windows)
    ok = [w for w in windows if w["G"] >= WELL_GROUNDED]
    pf = [w["P"] / w["F"] for w in windows if w["F"]]
    wf = [w["W"] / w["F"] for w in windows if w["F"]]
    lines = [
        "# What a window may be asked to write from its envelope (TUNE split)", "",
        f"Generated {datetime.now(UTC).isoformat(timespec='minutes')} by "
        f"`python bench/thin_envelope.py` on {platform.machine()} (load "
        f"{os.getloadavg()[0]:.1f}), from the reference model's checkpointed windows on TUNE "
        "pages (`bench/results/quality-llm-runs`, `bench/results/quality-llm-man-runs`; "
        "the split is `bench/retrieval.py`'s). Method: the docstring of "
        "`bench/thin_envelope.py`.", "",
        f"- TUNE windows written: {len(windows)} "
        f"(pages: {', '.join(sorted({w['task'] for w in windows}))}); "
        f"grounded ≥ {WELL_GROUNDED:.0%} of their sentences: {len(ok)}.",
        f"- Envelope fact words F: {min(w['F'] for w in windows)}–"
        f"{max(w['F'] for w in windows)}; asked P / F: {min(pf):.2f}–{max(pf):.2f}; "
        f"written W / F: {min(wf):.2f}–{max(wf):.2f}.",
        f"- **Chosen ratio**: {ratio} asked words per envelope fact word (the largest P/F of "
        f"a well-grounded TUNE window, {max(w['P'] / w['F'] for w in ok):.3f}, rounded up): "
        f"`cdr.window.length.GROUNDED_WORDS_PER_FACT_WORD`.", "",
        "| task | arm | window | envelope fact words F | asked P | written W | P/F | W/F | "
        "grounding |", "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for w in windows:
        lines.append(f"| {w['task']} | {w['arm']} | {w['window']} | {w['F']} | {w['P']} | "
                     f"{w['W']} | {w['P'] / w['F']:.3f} | {w['W'] / w['F']:.3f} | "
                     f"{100 * w['G']:.1f}% |")
    out = RESULTS / "thin_envelope.md"
    out.write_text("\n".join(lines) + "\n", "utf-8")
    print(f"ratio {ratio}; {len(windows)} TUNE windows, {len(ok)} well grounded → {out}")


if __name__ == "__main__":
    main()
