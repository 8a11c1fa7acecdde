"""Seconds per window at length, taken apart (issue 22 §4): is a long run's slowdown ours or
the machine's?

A window's model seconds are its prompt evaluation plus its generation:

    seconds = E · p + C · g

with E the prompt tokens llama.cpp evaluated (the prompt less the prefix it kept from the
previous window), C the tokens generated, and p, g the seconds per evaluated and per generated
token. What the loop controls is E and C (and the prefix it keeps stable); what the machine's
load controls is p and g. So the last third's seconds over the first third's split exactly
into two factors:

- **work** — the last third's tokens priced at the first third's per-token costs, over the
  first third's seconds: what a longer document asks of the model. Above 1 when prompts grow
  with the window number (a prompt carrying the document so far) or the kept prefix shrinks;
  it does not move with the load.
- **rate** — the last third's seconds over its own tokens priced at the first third's costs:
  how much slower each token was. At equal prompt sizes it is the machine (load, other
  processes on the two cores), not the run.

work × rate = the seconds ratio. Beside them: the prompt tokens and the kept prefix of each
third (whether the prompt is bounded and the cache reused), the load average recorded at each
window's end and the process's CPU seconds per window where the run recorded them (CPU
seconds count only the time the process held a core, so they survive load much better than
wall seconds). Computed at report time from the run records; nothing here changes a run.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from window_rows import nan_mean, window_means


def costs(w: dict[str, Any]) -> tuple[int, int, float, float] | None:
    """(evaluated prompt tokens, generated tokens, prompt seconds, generation seconds) of a
    recorded window; None without timing. Runs recorded before the seconds were kept give
    them back from the tokens/s they stored (rounded to 0.01 tokens/s)."""
    pt, ct = w.get("prompt_tokens"), w.get("completion_tokens")
    if not pt or not ct:
        return None
    evaluated = max(0, pt - (w.get("reused_tokens") or 0))
    ps = w.get("prompt_s")
    if ps is None:
        ps = evaluated / w["prompt_tps"] if w.get("prompt_tps") else None
    gs = w.get("generation_s")
    if gs is None:
        gs = ct / w["gen_tps"] if w.get("gen_tps") else None
    if ps is None or gs is None:
        return None
    return evaluated, ct, float(ps), float(gs)


def _thirds(run: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]] | None:
    """(first third, last third) of the run's written windows that have timing, as
    `long_llm.seconds_ratio` cuts them; None below 3 such windows."""
    ws = [w for w in run["windows"] if w.get("words") and costs(w) is not None]
    k = len(ws) // 3
    return (ws[:k], ws[-k:]) if k >= 1 else None


def decompose(run: dict[str, Any]) -> dict[str, float] | None:
    """The run's last third against its first: `seconds` (model seconds ratio), `work`,
    `rate` (work × rate = seconds), `prompt_s_tok` and `gen_s_tok` (per-token cost ratios),
    the mean prompt tokens, kept prefix and generated tokens of each third, and — where the
    run recorded them — the mean load and CPU-seconds ratio. None below 3 timed windows."""
    cut = _thirds(run)
    if cut is None:
        return None
    first, last = ([costs(w) for w in part] for part in cut)
    e1, c1 = sum(c[0] for c in first), sum(c[1] for c in first)
    p1, g1 = sum(c[2] for c in first), sum(c[3] for c in first)
    if not e1 or not c1:
        return None
    p_tok, g_tok = p1 / e1, g1 / c1  # the first third's seconds per token
    k = len(first)
    base = (p1 + g1) / k
    seconds_last = statistics.fmean(c[2] + c[3] for c in last)
    work_last = statistics.fmean(c[0] * p_tok + c[1] * g_tok for c in last)
    e2, c2 = sum(c[0] for c in last), sum(c[1] for c in last)
    p2, g2 = sum(c[2] for c in last), sum(c[3] for c in last)
    out = {
        "seconds": seconds_last / base, "work": work_last / base, "rate": seconds_last / work_last,
        "prompt_s_tok": (p2 / e2) / p_tok if e2 else math.nan,
        "gen_s_tok": (g2 / c2) / g_tok,
        "prompt_first": statistics.fmean(w["prompt_tokens"] for w in cut[0]),
        "prompt_last": statistics.fmean(w["prompt_tokens"] for w in cut[1]),
        "reused_first": statistics.fmean(w.get("reused_tokens") or 0 for w in cut[0]),
        "reused_last": statistics.fmean(w.get("reused_tokens") or 0 for w in cut[1]),
        "gen_first": c1 / k, "gen_last": c2 / k,
        "load_first": nan_mean(w.get("load") for w in cut[0]),
        "load_last": nan_mean(w.get("load") for w in cut[1]),
    }
    cpu1 = [w.get("cpu_s") for w in cut[0]]
    cpu2 = [w.get("cpu_s") for w in cut[1]]
    out["cpu"] = (statistics.fmean(cpu2) / statistics.fmean(cpu1)
                  if all(x for x in cpu1 + cpu2) else math.nan)
    return out


def load_pauses(path: Path) -> list[tuple[datetime, datetime]]:
    """The intervals in which the runs' processes were stopped (SIGSTOP for another
    measurement's quiet timing), as recorded in `path` ({"intervals": [[start, end], ...]},
    ISO times in UTC); none when the file is absent. A stopped process's wall seconds keep
    running while its CPU seconds do not, so a window spanning a pause is slow by the pause,
    not by its work or the machine's load."""
    if not path.is_file():
        return []
    data = json.loads(path.read_text(encoding="utf-8"))
    return [(datetime.fromisoformat(a), datetime.fromisoformat(b))
            for a, b in data.get("intervals", [])]


def mark_paused(runs: Sequence[dict[str, Any]],
                pauses: Sequence[tuple[datetime, datetime]]) -> int:
    """Set `paused` on every window whose wall time (its end less its seconds) overlaps a
    pause; windows recorded without an end time (bench version 1) are never marked. Returns
    the windows marked."""
    from datetime import timedelta

    marked = 0
    for r in runs:
        for w in r["windows"]:
            if not w.get("ended") or w.get("seconds") is None:
                continue
            end = datetime.fromisoformat(w["ended"])
            start = end - timedelta(seconds=float(w["seconds"]))
            w["paused"] = any(start < b and a < end for a, b in pauses)
            marked += w["paused"]
    return marked


def paused_windows(run: dict[str, Any]) -> list[int]:
    """The run's windows (1-based) marked by `mark_paused`."""
    return [i for i, w in enumerate(run["windows"], 1) if w.get("paused")]


def without_paused(run: dict[str, Any]) -> dict[str, Any]:
    """The run with its paused windows left out, for the seconds measures only (its thirds
    are then cut from the windows that ran unpaused)."""
    return {**run, "windows": [w for w in run["windows"] if not w.get("paused")]}


def cache_restarts(run: dict[str, Any]) -> list[int]:
    """Windows after the first that kept no prefix at all: the model process started afresh
    there (a run resumed from its checkpoint in a new process), so its cache was empty."""
    return [i for i, w in enumerate(run["windows"], 1)
            if i > 1 and w.get("prompt_tokens") and not w.get("reused_tokens")]


def _f(x: float, fmt: str) -> str:
    return "–" if x is None or math.isnan(x) else format(x, fmt)


def render_speed(runs: Sequence[dict[str, Any]], arms: Sequence[str]) -> list[str]:
    """The report's section: the decomposition per run, and the per-window costs."""
    lines = ["", "## Speed at length: what the seconds are made of", "",
             "A window's model seconds are E·p + C·g: E prompt tokens evaluated (the prompt "
             "less the prefix llama.cpp kept from the previous window), C tokens generated, "
             "p and g the seconds per token. The last third's seconds over the first third's "
             "split into **work** (the last third's tokens at the first third's per-token "
             "costs: what the longer document asks of the model; load does not move it) × "
             "**rate** (how much slower each token ran: the machine, at equal prompt sizes). "
             "Load is the 1-minute average at each window's end (the run's own model thread "
             "counts 1 of it); CPU is the process's CPU seconds, which count only time on a "
             "core. Both were recorded from the runs after the decomposition was added "
             "(bench/long_llm_speed.py); earlier runs show their end-of-run load. A run with "
             "windows that span a pause of its process (stopped for another measurement's "
             "quiet timing: their wall seconds include the pause, their CPU seconds do not) "
             "has a second row with those windows left out.", "",
             "| task | arm | asked | windows | seconds ratio | = work | × rate | prompt s/token "
             "| gen s/token | prompt tokens (first → last third) | kept prefix | generated | "
             "load (first → last third) | CPU ratio |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---|---|---|---|---:|"]
    rows = []
    for r in sorted(runs, key=lambda r: (r["words"], r["task"], r["arm"])):
        rows.append((r, r["task"]))
        if paused := paused_windows(r):
            rows.append((without_paused(r), f"{r['task']} without W{', W'.join(map(str, paused))}"
                         " (paused)"))
    for r, name in rows:
        d = decompose(r)
        if d is None:
            continue
        load = (f"{_f(d['load_first'], '.1f')} → {_f(d['load_last'], '.1f')}"
                if not math.isnan(d["load_first"]) else
                f"run end {r['load'][0]:.1f}" if r.get("load") else "–")
        restarts = cache_restarts(r)
        kept = f"{d['reused_first']:.0f} → {d['reused_last']:.0f}" + (
            f" (W{', W'.join(map(str, restarts))}: 0, new process)" if restarts else "")
        lines.append(
            f"| {name} | {r['arm']} | {r['words']:,} | {len(r['windows'])} | "
            f"{d['seconds']:.2f}× | {d['work']:.2f}× | {d['rate']:.2f}× | "
            f"{_f(d['prompt_s_tok'], '.2f')}× | {d['gen_s_tok']:.2f}× | "
            f"{d['prompt_first']:,.0f} → {d['prompt_last']:,.0f} | {kept} | "
            f"{d['gen_first']:.0f} → {d['gen_last']:.0f} | {load} | {_f(d['cpu'], '.2f')} |")
    lines += ["", "Per window, means over the runs that reached it (written windows with "
              "timing): prompt tokens, the prefix kept from the previous window, tokens "
              "generated, milliseconds per evaluated prompt token and per generated token, "
              "load at the window's end, CPU seconds.", "",
              "| window | arm | n | prompt tokens | kept prefix | generated | ms/prompt token | "
              "ms/generated token | load | CPU s |",
              "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    timed = [{**r, "windows": [_with_costs(w) for w in r["windows"]]} for r in runs]
    for n, arm, count, m in window_means(timed, arms, written_only=True):
        if math.isnan(m("ms_prompt")):
            continue
        lines.append(
            f"| {n} | {arm} | {count} | {m('prompt_tokens'):,.0f} | "
            f"{m('reused_tokens'):.0f} | {m('completion_tokens'):.0f} | "
            f"{m('ms_prompt'):.1f} | {m('ms_gen'):.0f} | {_f(m('load'), '.1f')} | "
            f"{_f(m('cpu_s'), '.0f')} |")
    return lines


def _with_costs(w: dict[str, Any]) -> dict[str, Any]:
    c = costs(w)
    if c is None:
        return w
    e, ct, ps, gs = c
    return {**w, "ms_prompt": 1000 * ps / e if e else math.nan, "ms_gen": 1000 * gs / ct}
