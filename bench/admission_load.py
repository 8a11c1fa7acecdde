"""The gateway at and past its capacity: chat completions per second, latency percentiles and
refusals at 1x, 2x and 4x the runs it admits, with `/readyz` probed throughout.

A real gateway (uvicorn in its own process, extractive writer, SQLite sessions) on the
gateway tests' CKF (ten Python-reference topics, ~100 facts) admits `--threads` runs writing
and `--waiting` more waiting (`CDR_CHAT_THREADS`, `CDR_MAX_WAITING_RUNS`): its capacity is
their sum. For each load level, that many client threads of this process loop non-streamed
chat completions for `--seconds` (a refused request is counted, then retried after 50 ms: a
client that ignored `Retry-After`, the hardest case), while one more thread asks `/readyz`
every 100 ms. Printed and written to `bench/results/admission.md`: completions per second,
p50 / p95 of the completed ones, refusals per second, and `/readyz`'s p50 / p99 / max.
The load stops by itself; the server is stopped by PID.

Usage: `python bench/admission_load.py [--threads 2] [--waiting 2] [--seconds 15]`.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx
import numpy as np

from _machine import cpu_name
from _paths import BENCH, ROOT

sys.path.insert(0, str(ROOT))
from tests.gateway_server import (
    CRP,
    TASK,
    GatewayServer,
    base_env,
    build_ckf,
    write_topics,
)

RESULTS = BENCH / "results" / "admission.md"


def load(url: str, clients: int, seconds: float) -> dict[str, float]:
    done: list[float] = []
    refused = [0]
    errors = [0]
    probes: list[float] = []
    stop = time.monotonic() + seconds
    lock = threading.Lock()
    body = {"model": "cdr", "messages": [{"role": "user", "content": TASK}], "crp": CRP}

    def client() -> None:
        with httpx.Client(base_url=url, timeout=120) as http:
            while time.monotonic() < stop:
                t0 = time.monotonic()
                r = http.post("/v1/chat/completions", json=body)
                with lock:
                    if r.status_code == 200:
                        done.append(time.monotonic() - t0)
                    elif r.status_code in (429, 503) and "Retry-After" in r.headers:
                        refused[0] += 1
                    else:
                        errors[0] += 1
                if r.status_code != 200:
                    time.sleep(0.05)

    def probe() -> None:
        with httpx.Client(base_url=url, timeout=30) as http:
            while time.monotonic() < stop:
                t0 = time.monotonic()
                http.get("/readyz")
                probes.append(time.monotonic() - t0)
                time.sleep(0.1)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    threads.append(threading.Thread(target=probe))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    lat = np.array(done) if done else np.array([np.nan])
    pr = np.array(probes) if probes else np.array([np.nan])
    return {"completed_per_s": len(done) / seconds, "p50": float(np.percentile(lat, 50)),
            "p95": float(np.percentile(lat, 95)), "refused_per_s": refused[0] / seconds,
            "errors": errors[0], "ready_p50": float(np.percentile(pr, 50)),
            "ready_p99": float(np.percentile(pr, 99)), "ready_max": float(pr.max())}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--waiting", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=15.0)
    args = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="cdr-bench-admission-"))
    ckf = build_ckf(tmp / "ckf", write_topics(tmp / "docs"))
    capacity = args.threads + args.waiting
    env = base_env(tmp, CDR_CHAT_THREADS=str(args.threads),
                   CDR_MAX_WAITING_RUNS=str(args.waiting))
    rows = []
    with GatewayServer(env, ckf=ckf, workdir=tmp) as server:
        for factor in (1, 2, 4):
            print(f"{factor}x capacity: {factor * capacity} clients, {args.seconds:g} s ...",
                  flush=True)
            rows.append((factor, load(server.url, factor * capacity, args.seconds)))
    lines = [
        "# The gateway at and past its capacity", "",
        f"`python bench/admission_load.py --threads {args.threads} --waiting {args.waiting} "
        f"--seconds {args.seconds:g}` on {datetime.now(UTC):%Y-%m-%d}, {cpu_name()}, "
        f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.1f} at the end; capacity "
        f"{capacity} runs ({args.threads} writing, {args.waiting} waiting); clients are "
        "threads of the benchmark's process on the same cores.", "",
        "| load | clients | completed/s | p50 s | p95 s | refused/s (503/429 with Retry-After)"
        " | other errors | /readyz p50 ms | p99 ms | max ms |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for factor, r in rows:
        lines.append(
            f"| {factor}x | {factor * capacity} | {r['completed_per_s']:.1f} | {r['p50']:.2f} "
            f"| {r['p95']:.2f} | {r['refused_per_s']:.1f} | {r['errors']} "
            f"| {1000 * r['ready_p50']:.0f} | {1000 * r['ready_p99']:.0f} "
            f"| {1000 * r['ready_max']:.0f} |")
    report = "\n".join(lines) + "\n"
    print(report)
    RESULTS.write_text(report, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
