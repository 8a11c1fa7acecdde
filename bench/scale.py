"""Scale-out benchmark (issue 12). This part: gateway replicas sharing sessions in PostgreSQL.
(The Ray-sharded index part joins this file when the FactIndex protocol lands.)

1. Store round trips: one thread doing `get` + `cas` on one session, SQLite (WAL, the
   default `synchronous=NORMAL`) vs PostgreSQL (defaults: fsync and synchronous_commit on),
   so the price of a shared store per session write is on record.
2. Envelope requests/s on the same synthetic CKF as `bench/gateway.py` (built once, cached in
   `bench/data/`): 1 replica on SQLite (reference), 1 replica on PostgreSQL, 2 replicas on
   PostgreSQL (`cdr serve` processes on two ports, one CKF). Clients are spread round-robin
   over the replicas, each with its own session one window in; each request is a real
   `POST /v1/sessions/{id}/envelope` (token check, session read from the store, Phase 1-3).
   Clients, replicas and PostgreSQL share this machine's cores: on 2 cores a second replica
   cannot add CPU, so the 2-replica row shows the cost of sharing, not a speed-up.
3. Concurrency check across replicas: sessions driven to their end by concurrent clients;
   each window's envelope comes from a random replica and its text is submitted twice at the
   same moment, to both replicas, with two different texts. Counted: windows accepted, racing
   duplicates refused (409), and — comparing every trace with what the clients were told was
   accepted — windows lost and windows duplicated (both must be 0).

PostgreSQL: `CDR_TEST_PG_DSN` if set, else a private server started like the tests' one (with
fsync on, as a deployment runs).

Usage: python bench/scale.py [--facts 50000] [--seconds 8] [--clients 8] [--sessions 16]
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from rich.console import Console

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(ROOT))  # tests.gateway_server / tests.pg_server: the tests' launchers
try:
    import cdr  # noqa: F401
except ImportError:  # a checkout without `pip install -e .`
    sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(BENCH))

from tests.gateway_server import GatewayServer, base_env  # noqa: E402
from tests.pg_server import LocalPostgres, find_bin_dir, fresh_schema  # noqa: E402

from _machine import cpu_name  # noqa: E402
from gateway import OUTLINE, TASK, build_ckf  # noqa: E402

RESULTS = BENCH / "results" / "scale.md"
CACHE = BENCH / "data"
console = Console()


def machine() -> str:
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    return (f"{cpu_name(platform.machine())}, {cpus} cores, Python "
            f"{platform.python_version()}, load average {load:.1f} at the start")


@contextmanager
def postgres() -> Iterator[tuple[str, str]]:
    """(DSN, description) of the server to use."""
    if dsn := os.environ.get("CDR_TEST_PG_DSN", "").strip():
        yield dsn, "the server in CDR_TEST_PG_DSN"
        return
    bin_dir = find_bin_dir()
    if bin_dir is None:
        raise SystemExit("no PostgreSQL: set CDR_TEST_PG_DSN or apt-get install postgresql")
    server = LocalPostgres(bin_dir, fsync=True).start()
    try:
        import psycopg

        with psycopg.connect(server.dsn) as conn:
            version = conn.execute("SHOW server_version").fetchone()[0]  # type: ignore[index]
        yield server.dsn, (f"a private PostgreSQL {version} on loopback, default settings "
                           "(fsync on, synchronous_commit on)")
    finally:
        server.stop()


# ----------------------------------------------------------------------- store round trips


def store_round_trips(store: Any, n: int) -> float:
    """Mean ms of one get + cas (a session write as the gateway does it)."""
    store.create("bench", "0" * 20_000)
    t0 = time.perf_counter()
    for _ in range(n):
        cur = store.get("bench")
        store.cas("bench", cur.version, cur.data)
    return (time.perf_counter() - t0) / n * 1000


# ------------------------------------------------------------------------- envelope load


@dataclass
class Load:
    label: str
    replicas: int
    clients: int
    requests: int
    seconds: float
    latencies: np.ndarray
    errors: int
    rss_mb: list[float]

    @property
    def rps(self) -> float:
        return self.requests / self.seconds

    def pct(self, q: float) -> float:
        return float(np.percentile(self.latencies, q) * 1000)


def one_window_in(url: str) -> tuple[str, str]:
    """A session on `url`, advanced by one window (Coverage Set, residual, blacklist set)."""
    from cdr.writers import get_writer

    with httpx.Client(base_url=url, timeout=180) as c:
        r = c.post("/v1/sessions", json={"task": TASK, "outline": OUTLINE,
                                         "max_windows": 20, "words": 6000})
        r.raise_for_status()
        sid, token = r.json()["session_id"], r.json()["token"]
        env = c.post(f"/v1/sessions/{sid}/envelope",
                     headers={"Authorization": f"Bearer {token}"}).json()
        text = get_writer("extractive").generate(env["messages"], env["max_tokens"]).text
        w = c.post(f"/v1/sessions/{sid}/windows", headers={"Authorization":
                                                          f"Bearer {env['token']}"},
                   json={"text": text}).json()
        return sid, w["token"]


def envelope_load(label: str, servers: list[GatewayServer], clients: int,
                  seconds: float) -> Load:
    urls = [servers[i % len(servers)].url for i in range(clients)]
    sessions = [one_window_in(u) for u in urls]
    stop = threading.Event()
    start = threading.Barrier(clients + 1)
    lat: list[list[float]] = [[] for _ in range(clients)]
    errors = [0]

    def client(i: int) -> None:
        sid, token = sessions[i]
        with httpx.Client(base_url=urls[i], timeout=180,
                          headers={"Authorization": f"Bearer {token}"}) as c:
            c.post(f"/v1/sessions/{sid}/envelope")  # warm the connection and the envelope
            start.wait()
            while not stop.is_set():
                t0 = time.perf_counter()
                r = c.post(f"/v1/sessions/{sid}/envelope")
                if r.status_code != 200:
                    errors[0] += 1
                lat[i].append(time.perf_counter() - t0)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    flat = np.array([x for per in lat for x in per])
    return Load(label, len(servers), clients, len(flat), wall, flat, errors[0],
                [rss_mb(s) for s in servers])


def rss_mb(server: GatewayServer) -> float:
    """Resident memory of a replica process (its share of the CKF's mapped pages included)."""
    assert server.proc is not None
    for line in Path(f"/proc/{server.proc.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


# ------------------------------------------------------------------- concurrency check


@dataclass
class Tally:
    sessions: int = 0
    accepted: int = 0
    refused: int = 0
    lost: int = 0
    duplicated: int = 0
    other: int = 0
    trace_windows: int = 0


def concurrency_check(servers: list[GatewayServer], sessions: int, clients: int,
                      seed: int = 7) -> Tally:
    from cdr.writers import get_writer

    writer = get_writer("extractive")
    tally = Tally(sessions=sessions)
    lock = threading.Lock()

    def run(i: int) -> None:
        rng = random.Random(seed + i)
        with ExitStack() as stack:
            cs = [stack.enter_context(httpx.Client(base_url=s.url, timeout=180))
                  for s in servers]
            r = cs[rng.randrange(len(cs))].post(
                "/v1/sessions", json={"task": TASK, "outline": OUTLINE[:3],
                                      "max_windows": 4, "words": 600})
            r.raise_for_status()
            sid, token = r.json()["session_id"], r.json()["token"]
            accepted: list[str] = []
            done = False
            with ThreadPoolExecutor(2) as pool:
                while not done:
                    env = cs[rng.randrange(len(cs))].post(
                        f"/v1/sessions/{sid}/envelope",
                        headers={"Authorization": f"Bearer {token}"}).json()
                    if env["done"]:
                        token = env["token"]
                        break
                    text = writer.generate(env["messages"], env["max_tokens"]).text
                    texts = [text, text + "\n\nThat is the short of it."]
                    barrier = threading.Barrier(2)

                    def submit(k: int, env: dict[str, Any] = env, texts: list[str] = texts,
                               barrier: threading.Barrier = barrier) -> httpx.Response:
                        barrier.wait()
                        return cs[k % len(cs)].post(
                            f"/v1/sessions/{sid}/windows",
                            headers={"Authorization": f"Bearer {env['token']}"},
                            json={"text": texts[k], "etag": env["etag"]})

                    pair = list(pool.map(submit, range(2)))
                    codes = [p.status_code for p in pair]
                    won = [k for k in range(2) if codes[k] == 200]
                    with lock:
                        tally.accepted += len(won)
                        tally.refused += codes.count(409)
                        tally.other += sum(c not in (200, 409) for c in codes)
                    if not won:
                        raise RuntimeError(f"no submission accepted: {[p.text for p in pair]}")
                    accepted += [texts[k] for k in won]
                    token, done = pair[won[0]].json()["token"], pair[won[0]].json()["done"]
            trace = cs[rng.randrange(len(cs))].get(
                f"/v1/sessions/{sid}", headers={"Authorization": f"Bearer {token}"}).json()
            outputs = [w["output"] for w in trace["windows"]]
            with lock:
                tally.trace_windows += len(outputs)
                tally.lost += sum(1 for t in accepted if t not in outputs)
                tally.duplicated += max(0, len(outputs) - len(accepted)) + sum(
                    outputs.count(t) - 1 for t in set(outputs) if outputs.count(t) > 1)

    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(run, range(sessions)))
    return tally


# ---------------------------------------------------------------------------------- main


def start_replicas(n: int, ckf: Path, session_db: str, root: Path) -> list[GatewayServer]:
    servers = []
    for i in range(n):
        tmp = root / f"replica-{i}-{time.monotonic_ns()}"
        tmp.mkdir(parents=True)
        servers.append(GatewayServer(base_env(tmp, CDR_SESSION_DB=session_db), via_cli=True,
                                     ckf=ckf, workdir=tmp).start(timeout=180))
    return servers


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--facts", type=int, default=50_000)
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--sessions", type=int, default=16, help="for the concurrency check")
    ap.add_argument("--round-trips", type=int, default=2000)
    ap.add_argument("--no-write", action="store_true", help="do not write the results file")
    args = ap.parse_args()
    env_machine = machine()
    ckf = build_ckf(CACHE / f"gateway-{args.facts // 1000}k.ckf", args.facts)
    root = Path(tempfile.mkdtemp(prefix="cdr-bench-scale-"))
    loads: list[Load] = []
    with postgres() as (pg_dsn, pg_what):
        from cdr.gateway.session_store import SQLiteSessionStore
        from cdr.gateway.session_store_postgres import PostgresSessionStore

        console.print("store round trips ...")
        with SQLiteSessionStore(root / "rt.sqlite3") as s:
            rt_sqlite = store_round_trips(s, args.round_trips)
        with fresh_schema(pg_dsn) as dsn, PostgresSessionStore(dsn) as s:
            rt_pg = store_round_trips(s, args.round_trips)
        with fresh_schema(pg_dsn, synchronous_commit="off") as dsn, \
                PostgresSessionStore(dsn) as s:
            rt_pg_async = store_round_trips(s, args.round_trips)

        plans = [("SQLite", 1, str(root / "sessions.sqlite3")), ("PostgreSQL", 1, None),
                 ("PostgreSQL", 2, None)]
        for store_name, n, db in plans:
            with fresh_schema(pg_dsn) as dsn:
                servers = start_replicas(n, ckf, db or dsn, root)
                try:
                    console.print(f"{store_name}, {n} replica(s), {args.clients} clients, "
                                  f"{args.seconds:g} s ...")
                    loads.append(envelope_load(store_name, servers, args.clients,
                                               args.seconds))
                finally:
                    for s in servers:
                        s.stop()
        with fresh_schema(pg_dsn) as dsn:
            servers = start_replicas(2, ckf, dsn, root)
            try:
                console.print(f"concurrency check: {args.sessions} sessions on 2 replicas ...")
                t0 = time.perf_counter()
                tally = concurrency_check(servers, args.sessions, args.clients)
                check_s = time.perf_counter() - t0
            finally:
                for s in servers:
                    s.stop()

    rows = [f"| {x.label} | {x.replicas} | {x.clients} | {x.requests:,} | {x.rps:.1f} | "
            f"{x.pct(50):.1f} | {x.pct(99):.1f} | {x.errors} | "
            f"{' + '.join(f'{m:.0f}' for m in x.rss_mb)} |" for x in loads]
    md = [
        "# Scale-out benchmark (`bench/scale.py`): gateway replicas",
        "",
        "The other half of issue 12, the sharded index on Ray (1 CKF vs 2 and 4 shards at 1M "
        "facts, ingest with 1 vs 2 Ray workers, a model of 100M facts over K machines), is in "
        "[scale_shards.md](scale_shards.md) (`bench/scale_shards.py`).",
        "",
        f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC — {env_machine}.",
        "",
        f"PostgreSQL: {pg_what}. CKF: {args.facts:,} synthetic facts (the `bench/gateway.py` "
        "CKF: real MiniLM sub-query vectors, 3% planted near them, the rest random), shared "
        "by all replicas. Clients, replicas and PostgreSQL all run on this machine's cores.",
        "",
        "## Store round trip (one thread, get + cas of a 20 kB session)",
        "",
        "| store | ms per get+cas |",
        "|---|---:|",
        f"| SQLite (WAL, synchronous=NORMAL) | {rt_sqlite:.2f} |",
        f"| PostgreSQL (loopback, synchronous_commit on: a WAL flush per commit) | "
        f"{rt_pg:.2f} |",
        f"| PostgreSQL (loopback, synchronous_commit off in the URL's options) | "
        f"{rt_pg_async:.2f} |",
        "",
        "## Envelope requests",
        "",
        f"`POST /v1/sessions/{{id}}/envelope`, window 2 of a {len(OUTLINE)}-sub-query "
        f"session, one session per client, {args.clients} keep-alive clients spread "
        f"round-robin over the replicas, {args.seconds:g} s per row.",
        "",
        "| store | replicas | clients | requests | req/s | p50 ms | p99 ms | errors | "
        "RSS per replica, MB |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        *rows,
        "",
        "## Concurrency check across 2 replicas",
        "",
        f"{tally.sessions} sessions ({args.clients} at a time) driven to their end; each "
        "window's envelope from a random replica, its text submitted twice at the same moment "
        "(one to each replica, two different texts). Lost = accepted (200) but missing from "
        "the session's trace; duplicated = in the trace more than once or beyond what was "
        f"accepted. Took {check_s:.0f} s.",
        "",
        "| windows accepted | racing duplicates refused (409) | other statuses | "
        "windows in traces | lost | duplicated |",
        "|---:|---:|---:|---:|---:|---:|",
        f"| {tally.accepted} | {tally.refused} | {tally.other} | {tally.trace_windows} | "
        f"{tally.lost} | {tally.duplicated} |",
        "",
        "Reading the numbers: clients, replicas and PostgreSQL share this machine's cores, "
        "so a second replica adds no CPU and the 2-replica row measures what sharing costs "
        "(a store round trip per request instead of a file read); on machines of their own, "
        "replicas add throughput up to what PostgreSQL serves. An envelope request that "
        "finds its window's envelope already prepared writes nothing, so these rows are "
        "read-bound on the store; each `/windows` submission is one compare-and-set write, "
        "whose price is the round-trip table above. With `synchronous_commit=on` (the "
        "default) every commit waits for a WAL flush to disk, which this shared disk makes "
        "slow.",
        "",
        f"Command: `python bench/scale.py --facts {args.facts} --seconds {args.seconds:g} "
        f"--clients {args.clients} --sessions {args.sessions}`",
        "",
    ]
    console.print("\n".join(md))
    if not args.no_write:
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text("\n".join(md), encoding="utf-8")
        console.print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
