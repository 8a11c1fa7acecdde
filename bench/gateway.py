"""Gateway benchmark (issue 5): sidecar envelope requests per second and latency percentiles
on a 100k-fact CKF, with 1, 8 and 32 concurrent clients on loopback.

The CKF is synthetic but shaped like a real one for the task's query: real MiniLM vectors of
the task's sub-queries, a planted share of facts around them (cosine to a sub-query 0.6-0.95,
so a few thousand pass the relevance gate and Phase 2 ranks them), and the rest random unit
directions (cosine to the query ≈ 0, gated out as off-topic material is). Fact texts are 40-70
words drawn from the Python reference's vocabulary. It is built once with `CKF.append_raw` and
cached in `bench/data/` (gitignored).

The gateway runs as users run it (uvicorn in its own process, extractive writer, SQLite
session store in WAL mode). Each client has its own session, advanced by one window first, so
the measured envelope has a Coverage Set, a residual and an n-gram blacklist to rank against.
A client loops `POST /v1/sessions/{id}/envelope` with its token (keep-alive); each request
reads the session, runs Phase 1-3 over the CKF, stores the pending envelope (a CAS write when
it changed) and returns the envelope (~45 facts with text, the prompt messages).
Clients are threads of this process: on a 2-core machine they compete with the server for
CPU, so the numbers are a lower bound for a server on its own cores.

`--baseline REV` runs a second server from git revision REV's `src/` (extracted to a temp
directory) on the same CKF, and measures the two side by side, alternating per client level,
so both see the same machine load: the before/after of a change in one run. Each level also
reports the server process's CPU time per request (from /proc), which other processes on a
loaded machine disturb far less than wall time.

`--second-kb` (issue 23) measures a gateway serving one KB against the same gateway serving
a second, equally large KB beside it (`CDR_KBS=second=...`, another synthetic CKF with its
own seed), requests going to the first KB in both; levels alternate between the two servers
and may repeat (`--clients 1,1,1`) so both see the same load. The ratios (two KBs / one KB)
go to `bench/results/gateway-kbs.md`.

Usage: python bench/gateway.py [--facts 100000] [--seconds 10] [--clients 1,8,32]
       [--baseline main | --second-kb]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import httpx
import numpy as np
from rich.console import Console
from rich.table import Table

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(ROOT))  # tests.gateway_server: the same launcher the tests use
try:
    import cdr  # noqa: F401
except ImportError:  # a checkout without `pip install -e .`
    sys.path.insert(0, str(ROOT / "src"))

from tests.gateway_server import GatewayServer, base_env  # noqa: E402

RESULTS = BENCH / "results" / "gateway.md"
PROFILE_SECTION = "## Where the time goes"
CACHE = BENCH / "data"
TASK = "Write a guide to Python exception handling"
OUTLINE = ["The try statement and its except clauses", "Raising exceptions",
           "Cleanup with finally", "Context managers and the with statement",
           "Exception chaining", "Built-in exception classes"]
PLANTED_SHARE = 0.03
console = Console()


# ----------------------------------------------------------------------------------- data


def vocabulary() -> np.ndarray:
    from pydoc_data.topics import topics

    words = sorted({w for text in topics.values() for w in re.findall(r"[a-z]{3,12}", text)})
    return np.array(words)


def token_counts(texts_words: list[np.ndarray], vocab: np.ndarray) -> np.ndarray:
    """cl100k tokens per text, summed per word: the pre-tokenizer splits at each space, so
    a space-joined text costs its first word plus ' word' for every later one."""
    from cdr.text.tokens import count_tokens_batch

    first = np.asarray(count_tokens_batch(list(vocab)), dtype=np.int64)
    spaced = np.asarray(count_tokens_batch([" " + w for w in vocab]), dtype=np.int64)
    return np.array([first[w[0]] + spaced[w[1:]].sum() for w in texts_words], dtype=np.int64)


def build_ckf(path: Path, n: int, seed: int = 0) -> Path:
    from cdr.ckf.handle import CKF
    from cdr.retrieval.embed import default_embedder
    from cdr.retrieval.subject import task_topic
    from cdr.vectors import normalize

    marker = path / "bench.json"
    spec = {"facts": n, "seed": seed, "task": TASK, "outline": OUTLINE,
            "share": PLANTED_SHARE}
    if marker.exists() and json.loads(marker.read_text()) == spec:
        return path
    if path.exists():
        import shutil

        shutil.rmtree(path)
    t0 = time.perf_counter()
    rng = np.random.default_rng(seed)
    emb = default_embedder()
    vecs = emb.encode([task_topic(TASK), *OUTLINE])
    query = normalize(vecs[0] + normalize(vecs[1:].mean(axis=0), "c"), "q")
    d = emb.dim
    planted = int(n * PLANTED_SHARE)
    x = rng.standard_normal((n, d), dtype=np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    owner = rng.integers(0, len(OUTLINE), planted)
    sigma = rng.uniform(0.35, 1.3, planted).astype(np.float32)[:, None]
    x[:planted] = vecs[1:][owner] + sigma * x[:planted]
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    perm = rng.permutation(n)
    x = x[perm]
    vocab = vocabulary()
    lengths = rng.integers(40, 71, n)
    words = [rng.integers(0, len(vocab), k) for k in lengths]
    contents = [f"Fact {i}: " + " ".join(vocab[w]) for i, w in enumerate(words)]
    tokens = token_counts(words, vocab) + 4  # "Fact", " i", ":" (≤ 4 tokens for i < 10^6)
    console.print(f"building a {n:,}-fact CKF at {path} "
                  f"({int((x @ query >= 0.40).sum()):,} facts pass the 0.40 gate)")
    ckf = CKF.create(path, emb)
    chunk = 20_000
    for s in range(0, n, chunk):
        ckf.append_raw(contents[s:s + chunk], x[s:s + chunk], tokens=tokens[s:s + chunk],
                       source=f"synthetic-{s // chunk}")
    ckf.close()
    marker.write_text(json.dumps(spec))
    console.print(f"built in {time.perf_counter() - t0:.0f} s")
    return path


# ------------------------------------------------------------------------------- clients


@dataclass
class Run:
    clients: int
    requests: int
    seconds: float
    latencies: np.ndarray
    errors: int
    server_cpu: float = float("nan")  # seconds of the server process's CPU during the run
    label: str = ""
    client_cpu: float = float("nan")  # seconds of this (client) process's CPU during the run

    @property
    def cpu_ms(self) -> float:
        """Server CPU time per request, ms."""
        return self.server_cpu / max(self.requests, 1) * 1000

    @property
    def client_cpu_ms(self) -> float:
        """Client (httpx threads of this process) CPU time per request, ms."""
        return self.client_cpu / max(self.requests, 1) * 1000

    @property
    def rps(self) -> float:
        return self.requests / self.seconds

    def pct(self, q: float) -> float:
        return float(np.percentile(self.latencies, q) * 1000)


def prepare_sessions(url: str, k: int) -> list[tuple[str, str]]:
    """k sessions, each one window in (so coverage, residual and blacklist are non-empty)."""
    from cdr.writers import get_writer

    writer = get_writer("extractive")
    out = []
    with httpx.Client(base_url=url, timeout=120) as c:
        for _ in range(k):
            r = c.post("/v1/sessions", json={"task": TASK, "outline": OUTLINE,
                                             "max_windows": 20, "words": 6000})
            r.raise_for_status()
            sid, token = r.json()["session_id"], r.json()["token"]
            env = c.post(f"/v1/sessions/{sid}/envelope",
                         headers={"Authorization": f"Bearer {token}"}).json()
            text = writer.generate(env["messages"], env["max_tokens"]).text
            w = c.post(f"/v1/sessions/{sid}/windows",
                       headers={"Authorization": f"Bearer {env['token']}"},
                       json={"text": text}).json()
            assert w["status"] == "in-progress", w
            out.append((sid, w["token"]))
    return out


def process_cpu(pid: int | None) -> float:
    """User + system CPU seconds of a process so far (NaN where /proc is not there)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(url: str, sessions: list[tuple[str, str]], seconds: float,
            pid: int | None = None) -> Run:
    stop = threading.Event()
    start = threading.Barrier(len(sessions) + 1)
    lat: list[list[float]] = [[] for _ in sessions]
    errors = [0]

    def client(i: int, sid: str, token: str) -> None:
        with httpx.Client(base_url=url, timeout=120,
                          headers={"Authorization": f"Bearer {token}"}) as c:
            c.post(f"/v1/sessions/{sid}/envelope")  # warm the connection and the envelope
            start.wait()
            while not stop.is_set():
                t0 = time.perf_counter()
                r = c.post(f"/v1/sessions/{sid}/envelope")
                if r.status_code != 200:
                    errors[0] += 1
                lat[i].append(time.perf_counter() - t0)

    threads = [threading.Thread(target=client, args=(i, s, t))
               for i, (s, t) in enumerate(sessions)]
    for t in threads:
        t.start()
    start.wait()
    t0, c0, own0 = time.perf_counter(), process_cpu(pid), time.process_time()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join()
    wall, cpu = time.perf_counter() - t0, process_cpu(pid) - c0
    all_lat = np.array([x for per in lat for x in per])
    return Run(len(sessions), len(all_lat), wall, all_lat, errors[0], cpu,
               client_cpu=time.process_time() - own0)


def baseline_src(rev: str, into: Path) -> Path:
    """`src/` of git revision `rev`, extracted under `into` (for the side-by-side run)."""
    out = into / f"baseline-{re.sub(r'[^A-Za-z0-9_.-]', '_', rev)}"
    out.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "src"],
                             check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(out)], input=archive, check=True)
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", rev], check=True,
                            capture_output=True, text=True).stdout.strip()
    (out / "COMMIT").write_text(commit)
    return out / "src"


# ------------------------------------------------------------------------------- report


def machine() -> str:
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    load = os.getloadavg() if hasattr(os, "getloadavg") else (0, 0, 0)
    return (f"{platform.processor() or platform.machine()}, {cpus} cores, Python "
            f"{platform.python_version()}, load average {load[0]:.1f} at the start")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--facts", type=int, default=100_000)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--clients", default="1,8,32")
    ap.add_argument("--ckf", type=Path, default=None, help="where to build/cache the CKF")
    ap.add_argument("--no-write", action="store_true", help="do not write the results file")
    ap.add_argument("--env", action="append", default=[], help="NAME=VALUE for the server")
    ap.add_argument("--baseline", default=None, metavar="REV",
                    help="also run git revision REV's src/ side by side (before/after)")
    ap.add_argument("--second-kb", action="store_true",
                    help="one KB vs the same gateway with a second KB of the same size")
    args = ap.parse_args()
    from cdr import settings

    settings.export({"CDR_EMBED_CACHE": ""})  # time the model, never vectors kept by a run
    if args.baseline and args.second_kb:
        ap.error("--baseline and --second-kb are two different comparisons: pick one")
    levels = [int(x) for x in args.clients.split(",")]
    ckf = build_ckf(args.ckf or CACHE / f"gateway-{args.facts // 1000}k.ckf", args.facts)
    env_machine = machine()
    tmp = Path(tempfile.mkdtemp(prefix="cdr-bench-gw-"))
    extra = dict(x.split("=", 1) for x in args.env)
    arms: list[tuple[str, dict[str, str]]] = []
    if args.baseline:
        src = baseline_src(args.baseline, tmp)
        commit = (src.parent / "COMMIT").read_text()
        arms.append((f"before ({args.baseline} {commit})", {"PYTHONPATH": str(src)}))
    if args.second_kb:
        second = build_ckf(CACHE / f"gateway-{args.facts // 1000}k-second.ckf", args.facts,
                           seed=1)
        arms.append(("one KB", {}))
        arms.append(("two KBs", {"CDR_KBS": f"second={second}"}))
    else:
        arms.append(("after (this tree)" if args.baseline else "", {}))
    runs: list[Run] = []
    servers = []
    try:
        prepared = []
        for i, (label, env) in enumerate(arms):
            work = tmp / f"arm{i}"
            work.mkdir()
            server = GatewayServer(base_env(work, **extra, **env), ckf=ckf, workdir=work)
            servers.append(server.start())
            sessions = prepare_sessions(server.url, max(levels))
            first = httpx.post(f"{server.url}/v1/sessions/{sessions[0][0]}/envelope",
                               headers={"Authorization": f"Bearer {sessions[0][1]}"},
                               timeout=60)
            prepared.append((label, server, sessions, first.json()))
        etags = {body["etag"] for *_, body in prepared}
        if len(etags) != 1:
            console.print(f"[red]the arms' envelopes differ: etags {sorted(etags)}[/red]")
        body0 = prepared[-1][3]
        n_facts = len(body0["facts"])
        size_kb = len(json.dumps(body0)) / 1024
        for k in levels:
            for label, server, sessions, _ in prepared:
                console.print(f"{label or 'server'}: {k} client(s), {args.seconds:.0f} s ...")
                pid = server.proc.pid if server.proc is not None else None
                run = measure(server.url, sessions[:k], args.seconds, pid)
                run.label = label
                runs.append(run)
    finally:
        for server in servers:
            server.stop()
    compared = bool(args.baseline or args.second_kb)
    cols = (["server"] if compared else []) + [
        "clients", "requests", "req/s", "p50 ms", "p99 ms", "server CPU ms/req",
        "client CPU ms/req", "errors"]
    table = Table(title=f"Envelope requests, {args.facts:,}-fact CKF (loopback, "
                        f"{n_facts} facts/envelope, {size_kb:.0f} KB responses)")
    for col in cols:
        table.add_column(col, justify="right")
    rows = []
    for r in runs:
        row = (([r.label] if compared else [])
               + [str(r.clients), f"{r.requests:,}", f"{r.rps:.1f}", f"{r.pct(50):.1f}",
                  f"{r.pct(99):.1f}", f"{r.cpu_ms:.1f}", f"{r.client_cpu_ms:.1f}",
                  str(r.errors)])
        rows.append(row)
        table.add_row(*row)
    console.print(table)
    ratio_lines = []
    if args.baseline:
        for k in levels:
            b, a = [r for r in runs if r.clients == k]
            ratio_lines.append(
                f"| {k} | {b.pct(50) / a.pct(50):.2f}× | {a.rps / b.rps:.2f}× | "
                f"{b.cpu_ms / a.cpu_ms:.2f}× |")
        console.print("after vs before (p50 faster, req/s higher, CPU/req lower):")
        for line in ratio_lines:
            console.print(line)
    if args.second_kb:
        second_kb_report(args, runs, levels, env_machine, n_facts, size_kb, cols, rows)
        return
    console.print(env_machine)
    console.print(f"load average at the end: {os.getloadavg()[0]:.1f}")
    if args.no_write:
        return
    md = [
        "# Gateway benchmark (`bench/gateway.py`)",
        "",
        f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC — {env_machine}.",
        "",
        f"`POST /v1/sessions/{{id}}/envelope` on a {args.facts:,}-fact CKF (window 2 of a "
        f"{len(OUTLINE)}-sub-query session: token check, session read, Phase 1 select over "
        f"all facts, CDR rank, pack, prompt), {n_facts} facts per envelope, {size_kb:.0f} KB "
        f"responses; one session per client, keep-alive httpx clients on loopback, "
        f"{args.seconds:.0f} s per level. Clients run on the same cores as the server. A "
        "client asking again for the same window's envelope finds its parsed session in the "
        "gateway's cache and its pending envelope unchanged, so no store write happens; the "
        "first envelope of each window (after `/windows`) also hits the session cache, which "
        "`/windows` fills. Since issue 15 the gateway also keeps each session's Phase 1 "
        "selection (its query vector is fixed, so every window of it selects the same rows "
        "from a snapshot): only a session's first envelope on a CKF snapshot scans the CKF; "
        "Phase 2-3, the prompt and the response are computed on every request. Server CPU "
        "per request is the gateway process's CPU time over the level divided by its "
        "requests (/proc), client CPU the same for this benchmark's httpx threads: on a "
        "loaded machine they say more than wall times, which wait for the other processes.",
        "",
        f"Server environment: {' '.join(args.env) or 'defaults'} (BLAS held to one thread "
        "per request; `--env CDR_BLAS_THREADS=0` shows OpenBLAS's default threads).",
        "",
        f"| {' | '.join(cols)} |",
        "|" + "---:|" * len(cols),
        *[f"| {' | '.join(r)} |" for r in rows],
        "",
        *(["After vs before, same run (p50 ratio: before/after; req/s ratio: after/before; "
           "CPU per request ratio: before/after):", "",
           "| clients | p50 faster | req/s higher | server CPU/req lower |",
           "|---:|---:|---:|---:|", *ratio_lines, ""] if ratio_lines else []),
        f"Load average {os.getloadavg()[0]:.1f} at the end of the run.",
        "",
        f"Command: `python bench/gateway.py --facts {args.facts} --seconds "
        f"{args.seconds:g} --clients {args.clients}"
        f"{' --baseline ' + args.baseline if args.baseline else ''}`",
        "",
    ]
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    kept = ""  # bench/gateway_profile.py's breakdown, written by that script
    if RESULTS.exists() and PROFILE_SECTION in (old := RESULTS.read_text(encoding="utf-8")):
        kept = old[old.index(PROFILE_SECTION):]
    RESULTS.write_text("\n".join(md) + ("\n" + kept if kept else ""), encoding="utf-8")
    console.print(f"wrote {RESULTS}")


def second_kb_report(args: argparse.Namespace, runs: list[Run], levels: list[int],
                     env_machine: str, n_facts: int, size_kb: float, cols: list[str],
                     rows: list[list[str]]) -> None:
    """One KB against two, side by side: per level (runs alternate one, two), the ratios
    two/one of p50 latency and of server CPU per request, and their medians over levels of
    the same client count."""
    pairs = [(runs[i], runs[i + 1]) for i in range(0, len(runs), 2)]
    lines = [f"| {one.clients} | {one.pct(50):.1f} | {two.pct(50):.1f} | "
             f"{two.pct(50) / one.pct(50):.3f} | {one.cpu_ms:.1f} | {two.cpu_ms:.1f} | "
             f"{two.cpu_ms / one.cpu_ms:.3f} |" for one, two in pairs]
    summary = []
    for k in dict.fromkeys(levels):
        mine = [(o, t) for o, t in pairs if o.clients == k]
        p50 = float(np.median([t.pct(50) / o.pct(50) for o, t in mine]))
        cpu = float(np.median([t.cpu_ms / o.cpu_ms for o, t in mine]))
        summary.append(f"| {k} | {len(mine)} | {p50:.3f} | {cpu:.3f} |")
    head = ("| clients | one KB p50 ms | two KBs p50 ms | p50 two/one | one KB CPU ms/req | "
            "two KBs CPU ms/req | CPU two/one |")
    console.print(head)
    for line in lines:
        console.print(line)
    console.print("| clients | pairs | median p50 two/one | median CPU/req two/one |")
    for line in summary:
        console.print(line)
    console.print(env_machine)
    console.print(f"load average at the end: {os.getloadavg()[0]:.1f}")
    if args.no_write:
        return
    out = BENCH / "results" / "gateway-kbs.md"
    md = [
        "# A second knowledge base (`bench/gateway.py --second-kb`)",
        "",
        f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC — {env_machine}.",
        "",
        f"`POST /v1/sessions/{{id}}/envelope` on a {args.facts:,}-fact CKF (the default KB), "
        f"{n_facts} facts per envelope, {size_kb:.0f} KB responses, served by a gateway with "
        f"that one KB and by a gateway with a second {args.facts:,}-fact KB beside it. The "
        "two servers run at once and the levels alternate between them, so both see the "
        f"same machine load; {args.seconds:g} s per level. Target (issue 23): the second KB "
        "keeps the first's envelope p50 within 10%.",
        "",
        f"| {' | '.join(cols)} |",
        "|" + "---:|" * len(cols),
        *[f"| {' | '.join(r)} |" for r in rows],
        "",
        head, "|---:|---:|---:|---:|---:|---:|---:|", *lines, "",
        "| clients | pairs | median p50 two/one | median CPU/req two/one |",
        "|---:|---:|---:|---:|", *summary, "",
        f"Load average {os.getloadavg()[0]:.1f} at the end of the run.",
        "",
        f"Command: `python bench/gateway.py --second-kb --facts {args.facts} --seconds "
        f"{args.seconds:g} --clients {args.clients}`",
        "",
    ]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(md), encoding="utf-8")
    console.print(f"wrote {out}")


if __name__ == "__main__":
    main()
