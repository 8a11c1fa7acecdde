"""Resuming a begun section (`resume`): ``"prompt"`` (spec: a window that continues a section
an earlier window began is told so in its prompt) or ``"prefill"``: with a writer that can
continue a begun answer, the local model, that window's answer starts with the section's heading
and the last words written for it, and the model goes on from them."""

from __future__ import annotations

from cdr.rules.rule import Rule

RULE = Rule(
    name="resume",
    choices=("prompt", "prefill"),
    meaning=("prefill: a writer that can (the local model) starts a window that "
             "continues a begun section with its heading and last written words, and "
             "goes on from them."),
    module="cdr.window.resume",
    profiles={},
    ranked_on_shards=frozenset({"prompt", "prefill"}),
    why=("Not in focused: chosen on the two largest TUNE pages (restating in windows 2+ "
         "13.3% -> 4.5%, bench/results/long-tune.md), it did not hold on the report "
         "tasks (restating 14.6% -> 14.3%, the reference model looping in 12 windows "
         "instead of 7; bench/results/long.md), so it stays an opt-in (docs/length.md)."),
)
