"""End to end on the real reference model (Qwen2.5-Coder-1.5B-Instruct on llama.cpp).

Run by `make test-llm` (and `.ci/run` after `make llm`); deselected from `make test` by the
`llm` marker, and skipped with the reason when the model or its runtime is absent. Small
contexts (2,048 tokens) and short generations keep the tier to a few minutes on 2 cores.
Assertions are about structure and the loop's contracts — windows written, CRP headers, Stage 8
reports, exit reasons — never about the text, which a model may word any way it likes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import jsonschema
import pytest

from cdr.trace import TRACE_SCHEMA
from tests.conftest import BUILTIN_TYPES_OUTLINE, BUILTIN_TYPES_TASK
from tests.gateway_server import (
    OUTLINE,
    TASK,
    GatewayServer,
    base_env,
    child_env,
    delta_text,
    free_port,
    stop_process,
)

pytestmark = pytest.mark.llm
pytest_plugins = ["tests.gateway_server"]

N_CTX = 2048  # the model's context
# The envelope budget, in cl100k tokens: the model's tokenizer counts ~20% more on this text.
CONTEXT = 1536
EXITS = {"task-complete", "limit-reached", "ckf-exhausted"}
HEADERS = ("CRP-Context-Coverage-Score", "CRP-Context-Coverage-Depth", "CRP-Context-Window",
           "CRP-Context-Continuation-Status", "CRP-Quality-Completeness")


@pytest.fixture(scope="module")
def model_path() -> Path:
    from cdr.retrieval.models import ModelNotInstalledError, require_local_llm

    try:
        return require_local_llm()
    except ModelNotInstalledError as exc:
        pytest.skip(f"reference model absent: {exc}")


def test_cdr_generate_two_windows_with_the_local_writer(model_path, types_ckf_path, tmp_path):
    outline = tmp_path / "outline.md"
    outline.write_text(BUILTIN_TYPES_OUTLINE)
    trace_path, doc = tmp_path / "trace.json", tmp_path / "guide.md"
    env = {**os.environ, "CDR_LOCAL_MODEL": str(model_path), "CDR_LOCAL_N_CTX": str(N_CTX),
           "COLUMNS": "200"}
    proc = subprocess.run(
        [sys.executable, "-m", "cdr.cli", "generate", BUILTIN_TYPES_TASK, "--ckf",
         str(types_ckf_path), "--outline", str(outline), "--windows", "2", "--writer", "local",
         "--context-tokens", str(CONTEXT), "--generation-tokens", "160", "--trace",
         str(trace_path), "--out", str(doc)],
        capture_output=True, text=True, env=env, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    trace = json.loads(trace_path.read_text())
    jsonschema.validate(trace, TRACE_SCHEMA)
    windows = trace["windows"]
    assert 1 <= len(windows) <= 2 and trace["status"] in EXITS
    assert trace["status"] == "limit-reached" or len(windows) < 2
    assert windows[0]["output"].strip()  # the model wrote Window 1
    for w in windows:
        assert all(h in w["headers"] for h in HEADERS)
        assert w["headers"]["CRP-Context-Window"] == f"{w['number']}/2"
        # Stage 8 read the text: depth credited only to sub-queries of the task, in (0, 0.9].
        ids = {sq["id"] for sq in trace["sub_queries"]}
        assert all(a["id"] in ids and 0 < a["depth"] <= 0.9 for a in w["addressed"])
    assert windows[0]["addressed"], "Stage 8 attributed nothing in Window 1"
    assert doc.read_text().strip()
    # The default profile cites: whatever the model marked, every citation is to a fact its
    # window was given, the model's own refs are gone, and cited facts are listed at the end.
    for w in windows:
        if w["output"].strip():
            envelope = {f["fact_id"] for f in w["envelope"]}
            assert all(set(s["facts"]) <= envelope for s in w["citations"]["sentences"])
            assert "[F" not in w["output"]
    numbers = {n for w in windows for s in w.get("citations", {}).get("sentences", ())
               for n in s["numbers"]}
    assert [s["number"] for s in trace.get("sources", [])] == sorted(numbers)
    if numbers:
        assert "\n## Sources\n" in doc.read_text()


@pytest.fixture(scope="module")
def local_gateway(model_path, gateway_ckf, tmp_path_factory) -> Iterator[GatewayServer]:
    tmp = tmp_path_factory.mktemp("gw-local")
    env = base_env(tmp, CDR_WRITER="local", CDR_LOCAL_MODEL=str(model_path),
                   CDR_LOCAL_N_CTX=str(N_CTX))
    server = GatewayServer(env, ckf=gateway_ckf)
    server.start(timeout=180)
    yield server
    server.stop()


@pytest.mark.parametrize("repeats", [None, "drop"])
def test_gateway_streams_two_real_windows_to_the_openai_client(local_gateway, repeats):
    from openai import OpenAI

    client = OpenAI(base_url=local_gateway.openai_base_url, api_key="x", max_retries=0,
                    timeout=900)
    # The relay over the spec loop ("profile": "spec"; the faces default to focused).
    crp = {"outline": OUTLINE, "words": 300, "window_tokens": 128, "max_windows": 2,
           "context_tokens": CONTEXT, "profile": "spec"}
    if repeats:  # the opt-in repeat guard (cdr.window.repeat_guard) on the same relay
        crp["repeats"] = repeats
    raw = client.chat.completions.with_raw_response.create(
        model="cdr", messages=[{"role": "user", "content": TASK}], stream=True,
        extra_body={"crp": crp}, stream_options={"include_usage": True})
    assert raw.headers["content-type"].startswith("text/event-stream")
    chunks = list(raw.parse())
    text = delta_text(chunks)
    assert text.strip()
    extras = [c.model_extra.get("crp") for c in chunks]
    windows = [x for x in extras if x and x["event"] == "window"]
    (final,) = [x for x in extras if x and x["event"] == "final"]
    assert 1 <= len(windows) <= 2
    assert [w["window"] for w in windows] == list(range(1, len(windows) + 1))
    assert all(w["headers"]["CRP-Context-Window"] == f"{w['window']}/2" for w in windows)
    assert final["status"] in EXITS and final["windows"] == len(windows)
    assert final["headers"]["CRP-Set-Session"] == final["token"]
    # The session was updated: its trace holds the windows the stream reported.
    tr = httpx.get(f"{local_gateway.url}/v1/sessions/{final['session_id']}",
                   headers={"Authorization": f"Bearer {final['token']}"}, timeout=30)
    assert tr.status_code == 200
    trace = tr.json()
    assert len(trace["windows"]) == len(windows)
    assert trace["windows"][0]["output"].strip()
    # What was streamed is what the session kept: a window cut by the 128-token limit drops
    # its unfinished tail from the stream as well as from the stored window.
    from cdr.gateway.relay import assemble

    assert text == assemble([w["output"] for w in trace["windows"]])
    if repeats:  # the option is recorded; what the guard took out is reported as text
        assert trace["options"] == {"repeats": "drop"}
        assert all(isinstance(u, str) and u.strip() for w in trace["windows"]
                   for u in w.get("dropped", []))
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0


@pytest.fixture(scope="module")
def llama_server(model_path, tmp_path_factory) -> Iterator[str]:
    """`python -m llama_cpp.server` on a free loopback port, stopped by PID."""
    from cdr.writers.local import default_threads

    port = free_port()
    log = tmp_path_factory.mktemp("llama-server") / "server.log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen(
            [sys.executable, "-m", "llama_cpp.server", "--model", str(model_path),
             "--model_alias", "reference", "--host", "127.0.0.1", "--port", str(port),
             "--n_ctx", str(N_CTX), "--n_threads", str(default_threads())],
            stdout=fh, stderr=subprocess.STDOUT, env=child_env({}))
    base = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + 180
        while True:
            if proc.poll() is not None:
                pytest.fail(f"llama_cpp.server exited: {log.read_text()[-3000:]}")
            try:
                if httpx.get(f"{base}/models", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"llama_cpp.server not ready: {log.read_text()[-3000:]}")
            time.sleep(0.2)
        yield base
    finally:
        stop_process(proc, grace=20)


@pytest.mark.parametrize("stream", [True, False])
def test_openai_writer_against_the_served_reference_model(llama_server, stream):
    from cdr.writers import get_writer

    writer = get_writer("openai", base_url=llama_server, model="reference", stream=stream,
                        temperature=0.0, timeout=600, max_retries=0)
    messages = [{"role": "system", "content": "You write technical documentation."},
                {"role": "user", "content": "Explain Python lists in three paragraphs."}]
    pieces: list[str] = []
    result = writer.generate(messages, 48, on_delta=pieces.append)
    # 48 tokens cannot hold three paragraphs: the limit hits, and the writer keeps only
    # complete text, handing the unfinished rest back separately.
    assert result.finish_reason == "length"
    assert "".join(pieces).replace(" ", "").replace("\n", "") == (
        result.text + result.dropped_text).replace(" ", "").replace("\n", "")
    assert result.dropped_text.strip()
    assert result.usage["prompt_tokens"] > 0 and result.usage["completion_tokens"] > 0


def test_local_writer_in_process(model_path):
    from cdr.writers import get_writer

    writer = get_writer("local", n_ctx=N_CTX)
    pieces: list[str] = []
    result = writer.generate([{"role": "user", "content": "Name three Python types."}], 64,
                             on_delta=pieces.append)
    assert result.finish_reason in ("stop", "length") and pieces
    assert result.text.strip() and "estimated" not in result.usage
    assert result.usage["completion_tokens"] > 0
