"""A gateway whose writer is an upstream OpenAI-compatible LLM (tests/chat_server.py, a real
loopback server), starting with no CKF: safety-only pass-through, uploads and background
ingest, a grounded multi-window relay through the LLM, upstream failures as 502 (and as a
mid-stream error), and deleting documents.

The tests in this module run in order against one server: the CKF starts empty and the
upload test fills it.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import openai
import pytest
from openai import OpenAI

from cdr.trace import TRACE_SCHEMA
from cdr.writers import get_writer
from tests.chat_server import DEFAULT_BODY, ChatServer, digest
from tests.gateway_server import (
    CRP,
    OUTLINE,
    TASK,
    WINDOW_TOKENS,
    GatewayServer,
    base_env,
    delta_text,
)

pytest_plugins = ["tests.gateway_server"]



def extractive_reply(messages: list[dict[str, str]]) -> str:
    """The upstream 'LLM': writes from the facts in the prompt, as a faithful model would."""
    return get_writer("extractive").generate(messages, WINDOW_TOKENS).text


@pytest.fixture(scope="module")
def chat():
    with ChatServer() as server:
        yield server


@pytest.fixture(scope="module")
def llm_gateway(chat, tmp_path_factory) -> GatewayServer:
    tmp = tmp_path_factory.mktemp("gateway-llm")
    env = base_env(tmp, CDR_WRITER="openai", CDR_LLM_BASE_URL=chat.openai_base_url,
                   CDR_LLM_MODEL="upstream-model", CDR_LLM_API_KEY="sk-upstream")
    with GatewayServer(env, ckf=tmp / "ckf", workdir=tmp) as server:
        yield server


@pytest.fixture()
def http(llm_gateway, chat):
    chat.reset()
    with llm_gateway.client() as c:
        yield c


@pytest.fixture()
def oai(llm_gateway) -> OpenAI:
    return OpenAI(base_url=llm_gateway.openai_base_url, api_key="x", max_retries=0, timeout=120)


def crp_completion(oai: OpenAI, *, stream: bool = False) -> Any:
    """The gateway's CRP completion of TASK in the test outline: the whole reply, or with
    `stream` its chunk stream."""
    return oai.chat.completions.create(
        model="cdr", messages=[{"role": "user", "content": TASK}], extra_body={"crp": CRP},
        stream=stream)


def wait_for(http: httpx.Client, job_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        job = http.get(f"/v1/ckf/jobs/{job_id}").json()
        if job["status"] in ("succeeded", "failed"):
            return job
        time.sleep(0.1)
    raise AssertionError(f"job {job_id} did not finish")


def test_empty_ckf_answers_safety_only(http, oai, chat):
    h = http.get("/healthz")
    assert h.json()["ckf"] is None and h.json()["writer"] == "openai"
    assert h.headers["CRP-Context-Mode"] == "safety-only"
    assert h.headers["CRP-Onboarding-Hint"] == "ingest-documents-for-context-grounding"
    assert http.get("/v1/ckf/stats").json()["exists"] is False

    r = http.post("/v1/sessions", json={"task": TASK})
    assert r.status_code == 409 and "no CKF at" in r.json()["error"]["message"]
    assert r.headers["CRP-Context-Mode"] == "safety-only"

    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": TASK}]
    raw = oai.chat.completions.with_raw_response.create(model="cdr", messages=messages)
    comp = raw.parse()
    assert comp.choices[0].message.content == f"Reply {digest(TASK)}. {DEFAULT_BODY}"
    assert raw.headers["CRP-Context-Mode"] == "safety-only"
    assert raw.headers["CRP-Onboarding-Hint"] == "ingest-documents-for-context-grounding"
    assert comp.model_extra["crp"]["status"] == "safety-only"
    (sent,) = chat.requests
    assert sent.body["messages"] == messages and sent.body["model"] == "upstream-model"
    assert sent.headers["authorization"] == "Bearer sk-upstream"

    chat.fail_next(1, status=401, message="invalid upstream key")
    with pytest.raises(openai.APIStatusError) as e:
        oai.chat.completions.create(model="cdr", messages=messages)
    assert e.value.status_code == 502
    assert e.value.body["upstream_status"] == 401
    assert "invalid upstream key" in e.value.body["message"]


def _files(tmp: Path) -> list[tuple[str, tuple[str, bytes, str]]]:
    from pydoc_data.topics import topics

    return [("file", ("try.txt", topics["try"].encode(), "text/plain")),
            ("file", ("raise.md", topics["raise"].encode(), "text/markdown")),
            ("file", ("with.txt", topics["with"].encode(), "text/plain"))]


def test_uploads_are_checked_then_ingested_in_the_background(http, tmp_path):
    bad = http.post("/v1/ckf/documents", files=[("file", ("notes.docx", b"PK\x03\x04", "x"))])
    assert bad.status_code == 415 and "'.docx'" in bad.json()["error"]["message"]
    assert ".md" in bad.json()["error"]["message"]
    binary = http.post("/v1/ckf/documents", files=[("file", ("a.txt", b"ab\x00\x01" * 50, "x"))])
    assert binary.status_code == 422 and "binary" in binary.json()["error"]["message"]
    empty = http.post("/v1/ckf/documents", files=[("file", ("e.md", b"", "text/markdown"))])
    assert empty.status_code == 422 and "e.md" in empty.json()["error"]["message"]
    nofile = http.post("/v1/ckf/documents", data={"source_type": "user"})
    assert nofile.status_code == 422 and "file" in nofile.json()["error"]["message"]
    badtype = http.post("/v1/ckf/documents", files=_files(tmp_path)[:1],
                        data={"source_type": "rumour"})
    assert badtype.status_code == 422 and "rumour" in badtype.json()["error"]["message"]
    assert http.get("/v1/ckf/jobs/nope").status_code == 404

    r = http.post("/v1/ckf/documents", files=_files(tmp_path), data={"source_type": "official"})
    assert r.status_code == 202, r.text
    job = r.json()
    assert r.headers["Location"] == f"/v1/ckf/jobs/{job['id']}"
    assert job["files"] == ["try.txt", "raise.md", "with.txt"]
    done = wait_for(http, job["id"])
    assert done["status"] == "succeeded", done
    assert done["report"]["documents_new"] == 3 and done["report"]["facts_added"] > 10
    docs = {d["source"]: d for d in done["documents"]}
    assert set(docs) == {"upload/try.txt", "upload/raise.md", "upload/with.txt"}
    assert all(d["facts"] > 0 and d["doc_id"] for d in docs.values())
    stats = http.get("/v1/ckf/stats").json()
    assert stats["exists"] and stats["documents"] == 3
    assert stats["active_facts"] > 10
    assert stats["documents_by_source_type"] == {"official": 3}
    assert http.get("/healthz").headers["CRP-Context-Mode"] == "full"

    again = wait_for(http, http.post("/v1/ckf/documents", files=_files(tmp_path)).json()["id"])
    assert again["report"]["documents_unchanged"] == 3 and again["report"]["embedded"] == 0


def test_an_upload_that_adds_nothing_is_a_failed_job_with_the_reason(http):
    # Three words pass the upload's checks but make no fact; a bogus charset is no 500.
    files = [("file", ("three.md", b"Just three words", "text/markdown")),
             ("file", ("puny.html", b'<meta charset="punycode"><p>caf\xe9 au lait</p>',
                       "text/html"))]
    r = http.post("/v1/ckf/documents", files=files)
    assert r.status_code == 202, r.text
    done = wait_for(http, r.json()["id"])
    assert done["status"] == "failed", done
    assert done["error"] == ("nothing ingested: three.md: no facts: its text is under 10 "
                             "tokens; puny.html: no facts: its text is under 10 tokens")
    assert done["report"]["documents"] == 0 and done["documents"][0]["doc_id"] is None


def test_an_ingest_by_another_process_is_picked_up(http, llm_gateway):
    from pydoc_data.topics import topics

    from cdr.ckf.handle import CKF
    from cdr.ckf.ingest import ingest_texts

    with CKF.open(llm_gateway.ckf) as ckf:  # as `cdr ingest` in another process would
        report = ingest_texts(ckf, [("external/assert.txt", topics["assert"])])
    assert report.documents_new == 1
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        sources = {d["source"] for d in http.get("/v1/ckf/documents").json()["documents"]}
        if "external/assert.txt" in sources:
            break
        time.sleep(0.1)
    assert "external/assert.txt" in sources
    assert http.get("/v1/ckf/stats").json()["documents"] == 4


def test_relay_writes_every_window_through_the_upstream_llm(http, oai, chat):
    chat.reply = extractive_reply
    raw = oai.chat.completions.with_raw_response.create(
        model="cdr", messages=[{"role": "user", "content": TASK}], extra_body={"crp": CRP})
    comp = raw.parse()
    crp = comp.model_extra["crp"]
    n = crp["windows"]
    assert n >= 2 and crp["status"] == "task-complete"
    assert raw.headers["CRP-Context-Window"] == f"{n}/4"
    assert len(chat.requests) == n  # one upstream call per window, no outline call
    for req in chat.requests:
        prompt = req.body["messages"][-1]["content"]
        assert "Remaining sections to complete:" in prompt and req.body["stream"] is True
    for title in OUTLINE:
        assert f"## {title}" in comp.choices[0].message.content
    # Usage is what the upstream reported, summed over the windows.
    assert comp.usage.completion_tokens == sum(
        len(extractive_reply(r.body["messages"]).split()) for r in chat.requests)

    chat.reset()
    chat.reply = extractive_reply
    text = delta_text(crp_completion(oai, stream=True))
    assert text == comp.choices[0].message.content


def overlong_reply(messages: list[dict[str, str]]) -> str:
    """A model that writes past the token limit: its sections' paragraphs run on, so every
    window is cut mid-paragraph (finish "length")."""
    prompt = messages[-1]["content"]
    headings = [line for line in prompt.splitlines() if line.startswith("## ")] or ["## Notes"]
    body = " ".join(f"Sentence {i} about the topic ends here." for i in range(40))
    return "\n\n".join(f"{h}\n\n{body}\n\n{body}" for h in headings)


def test_a_streamed_window_cut_by_the_token_limit_carries_only_what_was_kept(http, oai, chat):
    """Issue 9: a window cut off by max_tokens keeps its last complete paragraph; the stream
    must not have shown the client the dropped tail, so streamed == non-streamed == stored."""
    chat.reply = overlong_reply
    comp = crp_completion(oai)
    whole = comp.choices[0].message.content
    assert chat.requests and all(
        len(overlong_reply(r.body["messages"]).split()) > r.body["max_tokens"]
        for r in chat.requests)  # every window really was cut by the limit
    chat.reset()
    chat.reply = overlong_reply
    text = delta_text(crp_completion(oai, stream=True))
    assert text == whole
    # No window's unfinished paragraph reached the client: every paragraph ends a sentence.
    paragraphs = [p for p in text.split("\n\n") if p and not p.startswith("#")]
    assert paragraphs and all(p.rstrip().endswith(".") for p in paragraphs)


def looping_reply(messages: list[dict[str, str]]) -> str:
    """A model that loops: under each heading one paragraph, then the same paragraph again
    until the token limit."""
    prompt = messages[-1]["content"]
    headings = [line for line in prompt.splitlines() if line.startswith("## ")] or ["## Notes"]
    said = f"The window {digest(prompt)} says this and nothing else."  # its own each window
    return "\n\n".join(f"{h}\n\n" + "\n\n".join([said] * 30) for h in headings)


def test_a_window_that_loops_keeps_one_copy_streamed_or_not(http, oai, chat):
    """The writer stops the upstream's loop at its second copy (cdr.text.self_repeat): the
    window keeps one copy, and the streamed document is the one the whole reply gives."""
    chat.reply = looping_reply
    whole = crp_completion(oai).choices[0].message.content
    paragraphs = [p for p in whole.split("\n\n") if p.startswith("The window")]
    assert chat.requests and len(paragraphs) == len(chat.requests)  # one copy a window
    chat.reset()
    chat.reply = looping_reply
    streamed = delta_text(crp_completion(oai, stream=True))
    assert streamed == whole


def test_upstream_failures_are_502_and_keep_the_session(http, oai, chat, llm_gateway):
    chat.fail_next(1, status=400, message="context length exceeded upstream")
    r = http.post("/v1/chat/completions", json={
        "model": "cdr", "messages": [{"role": "user", "content": TASK}], "crp": CRP})
    assert r.status_code == 502
    err = r.json()["error"]
    assert err["type"] == "upstream_error" and err["upstream_status"] == 400
    assert "context length exceeded upstream" in err["message"]
    # The failed window is stored: the trace (read with the 502's token) shows it.
    tr = http.get(f"/v1/sessions/{r.headers['CRP-Session-Id']}",
                  headers={"Authorization": f"Bearer {r.headers['CRP-Set-Session']}"}).json()
    assert tr["status"] == "upstream-error" and len(tr["windows"]) == 1
    jsonschema.validate(tr, TRACE_SCHEMA)  # a failed run's trace follows the schema too
    assert "context length exceeded upstream" in tr["windows"][0]["error"]

    # Streaming, failing before any text: still a plain 502.
    chat.fail_next(1, status=404, message="no such model upstream")
    with pytest.raises(openai.APIStatusError) as e:
        list(crp_completion(oai, stream=True))
    assert e.value.status_code == 502 and e.value.body["upstream_status"] == 404

    # Streaming, the upstream drops after sending text: an error event ends the stream.
    chat.cut_next(1, after=3)
    got: list[str] = []
    with pytest.raises(openai.APIError) as e:
        for c in crp_completion(oai, stream=True):
            if c.choices:
                got.append(c.choices[0].delta.content or "")
    assert "".join(got).startswith("Reply")
    assert "upstream" in str(e.value.message)


def test_delete_document(http):
    docs = http.get("/v1/ckf/documents").json()["documents"]
    target = next(d for d in docs if d["source"] == "upload/with.txt")
    before = http.get("/v1/ckf/stats").json()["active_facts"]
    r = http.delete(f"/v1/ckf/documents/{target['doc_id']}")
    assert r.status_code == 200 and r.json()["id"] == target["doc_id"]
    assert r.json()["facts_removed"] > 0
    stats = http.get("/v1/ckf/stats").json()
    assert stats["active_facts"] == before - r.json()["facts_removed"]
    again = http.delete(f"/v1/ckf/documents/{target['doc_id']}")
    assert again.status_code == 404 and target["doc_id"] in again.json()["error"]["message"]
    assert "upload/with.txt" not in {d["source"] for d in
                                     http.get("/v1/ckf/documents").json()["documents"]}
    unknown = http.delete("/v1/ckf/documents/doesnotexist")
    assert unknown.status_code == 404 and "doesnotexist" in unknown.json()["error"]["message"]
