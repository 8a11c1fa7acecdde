"""Where an envelope request's time goes (issue 15): the sidecar's `POST
/v1/sessions/{id}/envelope` handler, in-process on the same 100k-fact CKF as
`bench/gateway.py`, split into its stages by cProfile's per-function cumulative times.

Why in-process: the stages are what the gateway itself spends (token check, session load,
Phase 1-3, prompt, serialisation); the HTTP server's share is the difference between this
total and the end-to-end p50 `bench/gateway.py` measures on a real uvicorn process.

The request profiled is the steady state the gateway benchmark measures (window 2 of a
session, asked again: the parsed session is cached and the pending envelope unchanged, so no
store write), plus, as separate rows, the costs a cache miss and a changed envelope add
(parse of the stored JSON, the compare-and-set write).

`--baseline REV` profiles git revision REV's `src/` too (in a child process, same CKF and
requests) and writes the two breakdowns side by side.

Usage: python bench/gateway_profile.py [--facts 100000] [--requests 40] [--baseline main]
       [--write]
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(BENCH.parent))
try:
    import cdr  # noqa: F401
except ImportError:  # a checkout without `pip install -e .`
    sys.path.insert(0, str(BENCH.parent / "src"))

import gateway as gwbench  # noqa: E402  (bench/gateway.py: the CKF and the task)

# (label, module file suffix, function name): the stages of one request, in request order.
STAGES = [
    ("token check (JWT decode + HKDF key)", "session_token.py", "verify"),
    ("session read (SQLite row)", "session_store.py", "get"),
    ("session parse (cache miss only)", "session_record.py", "from_json"),
    ("Phase 1 select", "snapshot.py", "select"),
    ("Phase 2 rank", "ranking.py", "rank"),
    ("budget (token counts of prompts)", "envelope.py", "make_budget"),
    ("Phase 3 pack", "envelope.py", "pack"),
    ("fact rows read (SQLite)", "snapshot.py", "facts"),
    ("plan", "loop.py", "_plan"),
    ("prompt build", "prompt.py", "build_user_prompt"),
    ("pending envelope to_dict (+ compare)", "loop.py", "to_dict"),
    ("stored JSON with new pending (changed only)", "session_record.py", "with_pending"),
    ("compare-and-set write (changed only)", "session_store.py", "cas"),
    ("new token (JWT encode + HKDF key)", "session_token.py", "issue"),
    ("response facts list", "sidecar.py", "_facts_out"),
    ("headers", "loop.py", "headers"),
    ("JSON response body", "responses.py", "render"),
]


def make_gateway(ckf: Path, tmp: Path):  # type: ignore[no-untyped-def]
    from cdr.gateway.app_state import Gateway
    from cdr.gateway.settings import load_settings

    os.environ.update({"CDR_DEV": "1", "CDR_SIGNING_SECRET": "profile-secret-0123456789abcdef",
                       "CDR_SESSION_DB": str(tmp / "sessions.sqlite3")})
    gw = Gateway(load_settings(), ckf=ckf)
    gw.kb.warm()
    return gw


def one_window_in(gw) -> tuple[str, str]:  # type: ignore[no-untyped-def]
    """A session with one window written (as `bench/gateway.py` prepares its sessions)."""
    from cdr.gateway import sidecar
    from cdr.gateway.schemas import SessionCreate, WindowSubmit

    body, _ = sidecar.create_session(gw, SessionCreate(
        task=gwbench.TASK, outline=gwbench.OUTLINE, max_windows=20, words=6000), None)
    sid, token = body["session_id"], body["token"]
    env, _ = sidecar.envelope(gw, sid, token, None)
    text = gw.writer.generate(env["messages"], env["max_tokens"]).text
    w, _ = sidecar.submit_window(gw, sid, env["token"], WindowSubmit(text=text), None)
    return sid, w["token"]


def request(gw, sid: str, token: str) -> bytes:  # type: ignore[no-untyped-def]
    """What the route does: the handler, then the JSON response's body."""
    from fastapi.responses import JSONResponse

    from cdr.gateway import sidecar

    body, headers = sidecar.envelope(gw, sid, token, None)
    return JSONResponse(body, headers=headers).body


def stage_times(stats: pstats.Stats, n: int) -> dict[str, float]:
    """ms per request of each stage (cumulative time of its function / n)."""
    out: dict[str, float] = {}
    for label, file, name in STAGES:
        total = sum(v[3] for (f, _line, fn), v in stats.stats.items()  # type: ignore[attr-defined]
                    if fn == name and f.endswith(file))
        out[label] = total / n * 1000
    return out


def baseline(args: argparse.Namespace) -> dict[str, float]:
    """This script's numbers for git revision `args.baseline`'s src/ (a child process)."""
    tmp = Path(tempfile.mkdtemp(prefix="cdr-profile-base-"))
    src = gwbench.baseline_src(args.baseline, tmp)
    out = tmp / "stages.json"
    env = {**os.environ, "PYTHONPATH": str(src)}
    subprocess.run([sys.executable, __file__, "--facts", str(args.facts), "--requests",
                    str(args.requests), "--top", "0", "--json", str(out),
                    *(["--wall"] if args.wall else [])], env=env, check=True)
    return json.loads(out.read_text())


def write_section(lines: list[str], kind: str, columns: list[tuple[str, dict[str, float]]],
                  args: argparse.Namespace) -> None:
    """The breakdown as the last section of bench/results/gateway.md."""
    from datetime import UTC, datetime

    path = gwbench.RESULTS
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    if gwbench.PROFILE_SECTION in text:
        text = text[:text.index(gwbench.PROFILE_SECTION)]
    section = [
        gwbench.PROFILE_SECTION, "",
        f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC — {gwbench.machine()}.", "",
        f"One envelope request's handler in-process (`bench/gateway_profile.py`), the steady "
        f"state the table above measures, split by cProfile ({kind} time per request, "
        f"{args.requests} requests; the profiler itself inflates the Python-heavy stages). "
        "Unprofiled p50 per request: " + "; ".join(
            f"{n}: {c['unprofiled p50 CPU']:.1f} ms CPU, {c['unprofiled p50 wall']:.1f} ms wall"
            for n, c in columns) + ". Rows marked *cache miss only* / *changed only* are paid "
        "once per window (a restarted or evicted session; a new pending envelope), not on "
        "every request; the rest of the server CPU per request in the table above is the "
        "HTTP stack (uvicorn, FastAPI routing, middleware).", "",
        *lines, "",
        f"Command: `python bench/gateway_profile.py --facts {args.facts} --requests "
        f"{args.requests}{' --baseline ' + args.baseline if args.baseline else ''} --write`",
        "",
    ]
    path.write_text(text.rstrip("\n") + "\n\n" + "\n".join(section), encoding="utf-8")
    print(f"wrote {path}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--facts", type=int, default=100_000)
    ap.add_argument("--requests", type=int, default=40)
    ap.add_argument("--top", type=int, default=25, help="also print the top functions")
    ap.add_argument("--baseline", default=None, metavar="REV",
                    help="also profile git revision REV's src/ and show both")
    ap.add_argument("--json", type=Path, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--write", action="store_true",
                    help=f"replace the '{gwbench.PROFILE_SECTION}' section of "
                    "bench/results/gateway.md with this run's table")
    ap.add_argument("--wall", action="store_true",
                    help="profile wall time (default: this thread's CPU time, which the other "
                    "processes on a loaded machine disturb far less)")
    args = ap.parse_args()
    from threadpoolctl import threadpool_limits

    threadpool_limits(1)  # as the gateway runs (CDR_BLAS_THREADS=1)
    timer = time.perf_counter if args.wall else time.thread_time
    ckf = gwbench.build_ckf(gwbench.CACHE / f"gateway-{args.facts // 1000}k.ckf", args.facts)
    gw = make_gateway(ckf, Path(tempfile.mkdtemp(prefix="cdr-profile-")))
    sid, token = one_window_in(gw)
    request(gw, sid, token)  # warm
    wall, cpu = [], []
    for _ in range(args.requests):
        t0, c0 = time.perf_counter(), time.process_time()
        request(gw, sid, token)
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    print(f"handler, unprofiled: p50 {np.median(wall) * 1000:.1f} ms wall, "
          f"{np.median(cpu) * 1000:.1f} ms CPU per request ({args.requests} requests), "
          f"load average {os.getloadavg()[0]:.1f}")

    prof = cProfile.Profile(timer)
    prof.enable()
    for _ in range(args.requests):
        request(gw, sid, token)
    prof.disable()
    # The cold paths, once each: parse on a cache miss, then a changed pending envelope.
    miss = cProfile.Profile(timer)
    gw.sessions.discard(sid)
    miss.enable()
    request(gw, sid, token)
    miss.disable()
    changed = cProfile.Profile(timer)
    stored = gw.store.get(sid)
    assert stored is not None
    from cdr.gateway.session_record import with_pending

    gw.store.cas(sid, stored.version, with_pending(stored.data, None))
    gw.sessions.discard(sid)
    changed.enable()
    request(gw, sid, token)
    changed.disable()

    stats = pstats.Stats(prof)
    total = stats.total_tt / args.requests * 1000  # type: ignore[attr-defined]
    steady = stage_times(stats, args.requests)
    cold = stage_times(pstats.Stats(miss), 1)
    write = stage_times(pstats.Stats(changed), 1)
    kind = "wall" if args.wall else "CPU"
    print(f"\nprofiled steady-state request: {total:.1f} ms {kind} (cProfile inflates "
          "Python-heavy stages)\n")
    ms: dict[str, float] = {}
    for label, _f, _n in STAGES:
        ms[label] = (cold[label] if "cache miss" in label
                     else write[label] if "changed only" in label else steady[label])
    per_request = [v for k, v in ms.items() if "only" not in k]
    ms["rest of the handler (glue)"] = total - sum(per_request)
    ms["**total (steady state)**"] = total
    ms["unprofiled p50 CPU"] = float(np.median(cpu) * 1000)
    ms["unprofiled p50 wall"] = float(np.median(wall) * 1000)
    if args.json is not None:
        args.json.write_text(json.dumps(ms))
        return
    columns = [("this tree", ms)]
    if args.baseline:
        columns.insert(0, (f"{args.baseline} (before)", baseline(args)))
    lines = ["| stage | " + " | ".join(f"{name}, ms" for name, _ in columns) + " |",
             "|---|" + "---:|" * len(columns)]
    for label in ms:
        if label.startswith("unprofiled"):
            continue
        lines.append(f"| {label} | " + " | ".join(f"{c.get(label, float('nan')):.2f}"
                                                  for _, c in columns) + " |")
    print("\n".join(lines))
    print("unprofiled p50 CPU / wall ms: " + "; ".join(
        f"{n}: {c['unprofiled p50 CPU']:.1f} / {c['unprofiled p50 wall']:.1f}"
        for n, c in columns))
    if args.write:
        write_section(lines, kind, columns, args)
    if args.top:
        print()
        stats.sort_stats("tottime").print_stats(args.top)


if __name__ == "__main__":
    main()
