"""How a run's material spreads over documents, window by window (the trace's optional
`documents` field, the report's per-window line).

A task drawing on ten documents should not spend its windows on the two that match it best; a
reader checks that by the documents sent so far and each one's share of the facts sent so far.
Computed from the trace's own window records (each envelope fact carries its `source`), so a
trace read later, without the knowledge base, shows the same figures, and each face shows the
sources as it shows them in its envelopes.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any


def documents_per_window(windows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """For each window record in order: `{"sent": distinct documents sent so far, "new":
    documents first sent in this window, "shares": {source: share of the facts sent so far}}`,
    shares largest first (ties by source). A fact counts once, the first time it is sent; a
    window counts as sent when the writer wrote from it (its output is not empty)."""
    facts: Counter[str] = Counter()
    seen: set[str] = set()
    out: list[dict[str, Any]] = []
    for w in windows:
        before = set(facts)
        if str(w.get("output", "")).strip():
            for f in w.get("envelope", ()):
                fid = str(f.get("fact_id", ""))
                if fid not in seen:
                    seen.add(fid)
                    facts[str(f.get("source", ""))] += 1
        total = sum(facts.values())
        shares = {s: round(n / total, 4)
                  for s, n in sorted(facts.items(), key=lambda kv: (-kv[1], kv[0]))}
        out.append({"sent": len(facts), "new": len(set(facts) - before), "shares": shares})
    return out
