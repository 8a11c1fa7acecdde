"""A long document through the gateway (issue 22 §5): one streamed chat completion of 5,000
words asked, written by the reference model, read with the official `openai` client.

`python bench/long_gateway.py [--task datetime.html] [--words 5000] [--profile focused]`;
`make bench-long-gateway` runs it. The gateway runs as users run it: its own uvicorn process
on loopback (`cdr.gateway.app`, dev mode: no keys on loopback; access control is the hostile
tests'), the `local` writer in the server process (one llama.cpp thread), the long
benchmark's Python-docs CKF (`bench/retrieval.py`) and its context and generation budget
(`bench/long_llm.py`, 3,072 / 1,024). The request names the task, its outline and the words;
everything else is the gateway's default (`--profile focused`).

Checked, as the real-model tier checks a short run: every window has its `crp` chunk with the
CRP headers, windows are numbered 1..n, the final chunk names an exit, and the streamed
document is the session's stored windows assembled. Measured: words delivered against asked
(LongBench-Write's length score), windows, each window's words and its seconds as the client
saw them (from one window's `crp` chunk to the next), and the time to the first text.

The run is one request (~15 min on this machine's one core): it is not checkpointed, an
interrupted run starts again. Results: `bench/results/long-gateway.json` and `.md`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _paths import ROOT

sys.path.insert(0, str(ROOT))  # tests.gateway_server: the same launcher the tests use

from tests.gateway_server import GatewayServer, base_env

from cdr.gateway.relay import assemble
from cdr.window.length import length_score, within_tolerance
from long_llm import CONTEXT_TOKENS, GENERATION_TOKENS, MAX_WINDOWS, RESULTS

OUT_JSON = RESULTS / "long-gateway.json"
OUT_MD = RESULTS / "long-gateway.md"
# The headers every written window carries (`cdr.window.headers.crp_headers` with its envelope)
HEADERS = ("CRP-Context-Coverage-Score", "CRP-Context-Coverage-Depth",
           "CRP-Context-NGram-Guard-Activations", "CRP-Context-Continuation-Status",
           "CRP-Context-Mode", "CRP-Quality-Completeness", "CRP-Context-Window",
           "CRP-Envelope-ETag", "CRP-Envelope-Facts", "CRP-Envelope-Saturation")
EXITS = {"task-complete", "limit-reached", "ckf-exhausted", "safety-budget"}


def task_and_ckf(name: str) -> tuple[Any, Path]:
    from cdr.retrieval.fact_recipe import DEFAULT_RECIPE
    from retrieval import pydocs_corpus

    data = pydocs_corpus((DEFAULT_RECIPE,))
    ckf = data.ckfs[DEFAULT_RECIPE]
    tasks = [t for split in data.tasks.values() for t in split
             if name in (t.name, t.name.rsplit("/", 1)[-1])]
    if not tasks:
        raise SystemExit(f"no Python-docs task named {name!r}")
    return tasks[0], Path(ckf.path)


def run(task: Any, ckf: Path, words: int, profile: str | None) -> dict[str, Any]:
    import httpx
    from openai import OpenAI

    from cdr.retrieval.models import require_local_llm

    work = Path(tempfile.mkdtemp(prefix="cdr-long-gw-"))
    env = base_env(work, CDR_WRITER="local", CDR_LOCAL_MODEL=str(require_local_llm()),
                   CDR_LOCAL_N_CTX=str(max(4096, round(CONTEXT_TOKENS * 1.3))),
                   CDR_LOCAL_THREADS="1", CDR_BLAS_THREADS="1", CDR_EMBED_THREADS="1")
    crp: dict[str, Any] = {"outline": task.outline_text, "words": words,
                           "window_tokens": GENERATION_TOKENS, "max_windows": MAX_WINDOWS,
                           "context_tokens": CONTEXT_TOKENS}
    if profile:
        crp["profile"] = profile
    with GatewayServer(env, ckf=ckf, workdir=work) as server:
        client = OpenAI(base_url=server.openai_base_url, api_key="x", max_retries=0,
                        timeout=7200)
        started = time.perf_counter()
        raw = client.chat.completions.with_raw_response.create(
            model="cdr", messages=[{"role": "user", "content": task.text}], stream=True,
            extra_body={"crp": crp})
        chunks, marks, first_text = [], [], None
        for c in raw.parse():
            chunks.append(c)
            now = time.perf_counter() - started
            if first_text is None and c.choices and c.choices[0].delta.content:
                first_text = now
            extra = (c.model_extra or {}).get("crp")
            if extra and extra.get("event") == "window":
                marks.append(now)
                print(f"window {extra['window']}: {now:.0f} s", flush=True)
        total = time.perf_counter() - started
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        extras = [(c.model_extra or {}).get("crp") for c in chunks]
        windows = [x for x in extras if x and x.get("event") == "window"]
        finals = [x for x in extras if x and x.get("event") == "final"]
        final = finals[-1] if finals else {}
        trace = httpx.get(f"{server.url}/v1/sessions/{final.get('session_id')}",
                          headers={"Authorization": f"Bearer {final.get('token')}"},
                          timeout=60).json() if final else {}
    outputs = [w["output"] for w in trace.get("windows", [])]
    delivered = len(text.split())
    checks = {
        "every window has its crp chunk with the CRP headers":
            bool(windows) and all(all(h in w["headers"] for h in HEADERS) for w in windows),
        "windows numbered 1..n": [w["window"] for w in windows]
            == list(range(1, len(windows) + 1)),
        "the final chunk names an exit": final.get("status") in EXITS
            and final.get("windows") == len(windows),
        "the stream is the session's stored windows": bool(outputs)
            and text == assemble(outputs) and len(outputs) == len(windows),
    }
    seconds = [b - a for a, b in zip([0.0, *marks], marks, strict=False)]
    return {"task": task.name, "words": words, "profile": profile or "(gateway default)",
            "options": trace.get("options"), "status": final.get("status"),
            "windows": len(windows), "delivered": delivered,
            "ratio": round(delivered / words, 4),
            "length_score": round(length_score(words, delivered), 2),
            "within_tolerance": within_tolerance(words, delivered),
            "window_words": [len(o.split()) for o in outputs],
            "window_seconds": [round(s, 1) for s in seconds],
            "first_text_s": None if first_text is None else round(first_text, 1),
            "total_s": round(total, 1), "checks": checks,
            "load": [round(x, 2) for x in os.getloadavg()]}


def render(r: dict[str, Any]) -> str:
    lines = ["# A long document through the gateway", "",
             f"Generated {r['generated']} by `python bench/long_gateway.py` at library commit "
             f"{r['commit']}: one streamed chat completion to the gateway (uvicorn on loopback, "
             "the `local` writer in the server, one llama.cpp thread), read with the official "
             f"`openai` client; the Python-docs task `{r['task']}`, {r['words']:,} words asked, "
             f"context {CONTEXT_TOKENS} / generation {GENERATION_TOKENS}, at most {MAX_WINDOWS} "
             f"windows, profile {r['profile']} (session options {r['options']}). Load average "
             f"at the end: {', '.join(str(x) for x in r['load'])}.", "",
             "| words delivered | ratio | length score | windows | exit | first text | total |",
             "|---:|---:|---:|---:|---|---:|---:|",
             f"| {r['delivered']:,} | {r['ratio']:.2f} | {r['length_score']:.1f} | "
             f"{r['windows']} | {r['status']} | {r['first_text_s']} s | "
             f"{r['total_s'] / 60:.1f} min |", "",
             "| check | held |", "|---|---|"]
    lines += [f"| {k} | {'yes' if v else '**no**'} |" for k, v in r["checks"].items()]
    lines += ["", "| window | words | seconds (as the client saw them) |", "|---:|---:|---:|"]
    for i, (w, s) in enumerate(zip(r["window_words"], r["window_seconds"], strict=False), 1):
        lines.append(f"| {i} | {w} | {s} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    from datetime import UTC, datetime

    from retrieval import library_commit

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--task", default="datetime.html")
    ap.add_argument("--words", type=int, default=5000)
    ap.add_argument("--profile", default=None, help="the gateway's default when not given")
    ap.add_argument("--report-only", action="store_true")
    args = ap.parse_args(argv)
    if args.report_only:
        r = json.loads(OUT_JSON.read_text(encoding="utf-8"))
    else:
        task, ckf = task_and_ckf(args.task)
        r = run(task, ckf, args.words, args.profile)
        r.update(generated=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M+00:00"),
                 commit=library_commit())
        OUT_JSON.write_text(json.dumps(r, indent=1) + "\n", encoding="utf-8")
    OUT_MD.write_text(render(r), encoding="utf-8")
    print(f"{r['delivered']}/{r['words']} words in {r['windows']} windows, {r['status']}; "
          f"checks {'all held' if all(r['checks'].values()) else 'FAILED'}; "
          f"report: {OUT_MD.relative_to(ROOT)}")
    return 0 if all(r["checks"].values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
