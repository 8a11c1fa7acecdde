"""The official `openai` client against a real gateway: a multi-window document with the CRP
headers, streamed and not, the stream equal to the non-streamed content, and the trace."""

from __future__ import annotations

import base64
import json

import httpx
import jsonschema
import openai
import pytest
from openai import OpenAI

from cdr.trace import TRACE_SCHEMA
from cdr.window.length import length_score
from tests.gateway_server import CRP, OUTLINE, TASK

pytest_plugins = ["tests.gateway_server"]

MESSAGES = [{"role": "system", "content": "You are a helpful technical writer."},
            {"role": "user", "content": "Hello"},
            {"role": "assistant", "content": "Hi. What shall I write?"},
            {"role": "user", "content": TASK}]


def token_window(token: str) -> int:
    head = token.split(".")[1]  # a JWT: header.payload.signature
    return json.loads(base64.urlsafe_b64decode(head + "=" * (-len(head) % 4)))["w"]


@pytest.fixture(scope="module")
def client(gateway) -> OpenAI:
    return OpenAI(base_url=gateway.openai_base_url, api_key="x", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def completion(client):
    raw = client.chat.completions.with_raw_response.create(
        model="cdr", messages=MESSAGES, extra_body={"crp": CRP})
    return raw, raw.parse()


def test_completion_is_a_multi_window_document_with_crp_headers(completion, gateway):
    raw, comp = completion
    h = raw.headers
    assert comp.object == "chat.completion" and comp.model == "cdr"
    choice = comp.choices[0]
    assert choice.message.role == "assistant" and choice.finish_reason == "stop"
    crp = comp.model_extra["crp"]
    n = crp["windows"]
    assert n >= 2 and crp["status"] == "task-complete"
    assert h["CRP-Context-Window"] == f"{n}/4"
    assert h["CRP-Context-Continuation-Status"] == "task-complete"
    assert h["CRP-Context-Mode"] == "full"
    assert float(h["CRP-Quality-Completeness"]) >= 0.92
    assert h["CRP-Quality-Completeness"] == f"{crp['completeness']:.2f}"
    assert h["CRP-Session-Id"] == crp["session_id"]
    assert h["CRP-Set-Session"] == crp["token"] and token_window(crp["token"]) == n
    for name in ("CRP-Context-Coverage-Score", "CRP-Context-Coverage-Depth",
                 "CRP-Context-NGram-Guard-Activations", "CRP-Envelope-ETag"):
        assert crp["headers"][name] == h[name]
    # Every planned section is in the document, under its heading.
    content = choice.message.content
    for title in OUTLINE:
        assert f"## {title}" in content
    usage = comp.usage
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens > 0

    # The trace holds the windows, and the document is exactly their texts joined.
    tr = httpx.get(f"{gateway.url}/v1/sessions/{crp['session_id']}",
                   headers={"Authorization": f"Bearer {crp['token']}"}, timeout=30)
    assert tr.status_code == 200
    trace = tr.json()
    jsonschema.validate(trace, TRACE_SCHEMA)
    assert len(trace["windows"]) == n and trace["task"] == TASK
    outputs = [w["output"].strip() for w in trace["windows"] if w["output"].strip()]
    assert content == "\n\n".join(outputs)
    assert len(outputs) >= 2
    # The session view says how long the run is, as the CLI's trace does.
    length = trace["length"]
    assert length["asked"] == sum(sq["expected_words"] for sq in trace["sub_queries"])
    assert length["delivered"] == sum(len(w["output"].split()) for w in trace["windows"])
    assert length["score"] == round(length_score(length["asked"], length["delivered"]), 2)


def test_stream_sends_the_same_document_window_by_window(client, completion):
    _, comp = completion
    raw = client.chat.completions.with_raw_response.create(
        model="cdr", messages=MESSAGES, stream=True, extra_body={"crp": CRP},
        stream_options={"include_usage": True})
    h = raw.headers
    assert h["content-type"].startswith("text/event-stream")
    assert h["CRP-Context-Window"] == "0/4" and token_window(h["CRP-Set-Session"]) == 0
    chunks = list(raw.parse())
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == comp.choices[0].message.content  # deterministic writer: same document

    extras = [c.model_extra.get("crp") for c in chunks]
    windows = [x for x in extras if x and x["event"] == "window"]
    finals = [x for x in extras if x and x["event"] == "final"]
    assert [w["window"] for w in windows] == list(range(1, len(windows) + 1))
    assert len(windows) == comp.model_extra["crp"]["windows"]
    assert [w["status"] for w in windows][-1] == "task-complete"
    assert all(w["headers"]["CRP-Context-Window"] == f"{w['window']}/4" for w in windows)
    (final,) = finals
    assert final["status"] == "task-complete" and final["windows"] == len(windows)
    assert final["headers"]["CRP-Set-Session"] == final["token"]
    assert token_window(final["token"]) == len(windows)
    assert final["headers"]["CRP-Session-Id"] == h["CRP-Session-Id"]
    finish = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finish[-1] == "stop" and set(finish[:-1]) == {None}
    assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens > 0


def test_window_limit_and_chat_errors(client):
    comp = client.chat.completions.create(
        model="cdr", messages=[{"role": "user", "content": TASK}],
        extra_body={"crp": {**CRP, "max_windows": 1}})
    assert comp.choices[0].finish_reason == "length"  # cut by the window limit
    assert comp.model_extra["crp"]["status"] == "limit-reached"

    with pytest.raises(openai.UnprocessableEntityError) as e:
        client.chat.completions.create(model="cdr", messages=[{"role": "system", "content": "x"}])
    assert "user message" in e.value.body["message"]
    with pytest.raises(openai.UnprocessableEntityError) as e:
        client.chat.completions.create(model="cdr", messages=MESSAGES,
                                       extra_body={"crp": {"max_windows": 0}})
    assert "max_windows" in e.value.body["message"]
    with pytest.raises(openai.UnprocessableEntityError) as e:
        client.chat.completions.create(model="cdr", messages=MESSAGES,
                                       extra_body={"crp": {"color": "blue"}})
    assert "color" in e.value.body["message"]


def test_max_tokens_caps_the_whole_document_streamed_or_not(client, completion):
    """`max_tokens` is a cap over every window: the run stops when it is spent, says
    `length`, and leaves the session in progress; the stream sends what the response holds."""
    completion = completion[1]
    whole = completion.usage.completion_tokens
    cap = max(8, whole // 3)
    comp = client.chat.completions.create(model="cdr", messages=MESSAGES, max_tokens=cap,
                                          extra_body={"crp": CRP})
    assert comp.choices[0].finish_reason == "length"
    assert 0 < comp.usage.completion_tokens <= cap < whole
    assert comp.model_extra["crp"]["status"] == "in-progress"  # resumable, not ended
    assert len(comp.choices[0].message.content) < len(completion.choices[0].message.content)
    newer = client.chat.completions.create(model="cdr", messages=MESSAGES, max_tokens=whole * 9,
                                           max_completion_tokens=cap, extra_body={"crp": CRP})
    assert newer.choices[0].message.content == comp.choices[0].message.content
    chunks = list(client.chat.completions.create(
        model="cdr", messages=MESSAGES, max_tokens=cap, stream=True, extra_body={"crp": CRP}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == comp.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"


def test_one_model_id_and_the_openai_fields_it_cannot_honour_are_refused(client, completion):
    completion = completion[1]
    assert [m.id for m in client.models.list()] == ["cdr"]
    assert client.models.retrieve("cdr").id == "cdr"
    assert completion.model == "cdr"
    for model in ("gpt-4o", "cdr/", "cdr/nope"):
        with pytest.raises(openai.NotFoundError) as e:
            client.chat.completions.create(model=model, messages=MESSAGES,
                                           extra_body={"crp": CRP})
        assert e.value.body["code"] == "model_not_found" and e.value.body["param"] == "model"
    with pytest.raises(openai.UnprocessableEntityError) as e:
        client.chat.completions.create(model="cdr", messages=MESSAGES, n=2,
                                       extra_body={"crp": CRP})
    assert "n=2" in e.value.body["message"]
    for bad in (0, -5, "200"):
        with pytest.raises(openai.UnprocessableEntityError) as e:
            client.chat.completions.create(model="cdr", messages=MESSAGES, max_tokens=bad,
                                           extra_body={"crp": CRP})
        assert "max_tokens" in json.dumps(e.value.body)
    one = client.chat.completions.create(model="cdr", messages=MESSAGES, n=1,
                                         extra_body={"crp": CRP})
    assert one.choices[0].message.content == completion.choices[0].message.content
