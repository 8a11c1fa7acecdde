"""The per-window table a run prints (the CLI's `generate`, the demo): what each window packed,
its headers' numbers, and the repetition measures of `cdr.report.quality`."""

from __future__ import annotations

from collections.abc import Sequence

from rich.table import Table

from cdr.report.quality import cwr6, fact_reuse
from cdr.window.loop import WindowEvent


def window_table(events: Sequence[WindowEvent], title: str = "") -> Table:
    """window, facts packed, Coverage-Score, n-gram activations, CWR6, completeness, how the
    writer ended, status."""
    table = Table(title=title or None, caption="cov = CRP-Context-Coverage-Score, ngram = "
                  "NGram-Guard-Activations, reuse = facts sent in an earlier window, end = the "
                  "writer's finish (length: cut at the token limit; repetition: stopped where "
                  "the model began to repeat itself)")
    for col in ("win", "facts", "cov", "ngram", "CWR6", "reuse", "complete", "end", "status"):
        table.add_column(col, justify="left" if col in ("end", "status") else "right",
                         no_wrap=col in ("end", "status"))
    repeats = cwr6([e.output for e in events])
    reuse = fact_reuse([e.prepared.envelope.fact_ids for e in events])
    for e, rep, ru in zip(events, repeats, reuse, strict=True):
        h = e.headers
        table.add_row(
            str(e.number), str(len(e.prepared.envelope)), h["CRP-Context-Coverage-Score"],
            h["CRP-Context-NGram-Guard-Activations"], f"{rep:.1%}", f"{ru:.0%}",
            f"{e.completeness:.2f}", e.finish_reason, e.status,
        )
    return table
