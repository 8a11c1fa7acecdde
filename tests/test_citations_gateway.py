"""A citing run through the gateway with the official `openai` client: the message carries
annotations over the content, the response its sources (made public), and the streamed
response the same text and the same annotations in its final chunk."""

from __future__ import annotations

import re

import pytest
from openai import OpenAI

from tests.gateway_server import CRP, TASK

pytest_plugins = ["tests.gateway_server"]

CITING = {**CRP, "profile": "focused"}


@pytest.fixture(scope="module")
def client(gateway) -> OpenAI:
    return OpenAI(base_url=gateway.openai_base_url, api_key="x", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def completion(client):
    return client.chat.completions.create(
        model="cdr", messages=[{"role": "user", "content": TASK}], extra_body={"crp": CITING})


def test_annotations_point_at_cited_spans_of_the_content(completion):
    message = completion.choices[0].message
    content = message.content
    notes = message.annotations
    assert notes, "a citing run's message carries annotations"
    sources = completion.model_extra["crp"]["sources"]
    by_number = {s["number"]: s for s in sources}
    for note in notes:
        assert note.type == "url_citation"
        cite = note.url_citation
        extra = cite.model_extra
        assert 0 <= cite.start_index < cite.end_index <= len(content)
        assert content[cite.start_index:cite.end_index].strip()
        # the marker the reader sees follows the span and holds the annotation's number
        after = content[cite.end_index:cite.end_index + 40]
        assert f"[{extra['number']}]" in re.match(r"(\[\d+\])+", after).group(0)
        entry = by_number[extra["number"]]
        assert entry["fact_id"] == extra["fact_id"] and cite.url == entry["source"]
    assert [s["number"] for s in sources] == list(range(1, len(sources) + 1))
    assert completion.model_extra["citations"] == [s["source"] for s in sources]
    for s in sources:  # a server path is never shown
        assert not s["source"].startswith("/") and s["title"]


def test_the_stream_gives_the_same_text_and_annotations(client, completion):
    chunks = list(client.chat.completions.create(
        model="cdr", messages=[{"role": "user", "content": TASK}], extra_body={"crp": CITING},
        stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == completion.choices[0].message.content
    final = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(final) == 1
    streamed = final[0].choices[0].delta.model_extra["annotations"]
    assert streamed == [n.model_dump() for n in completion.choices[0].message.annotations]
    assert final[0].model_extra["citations"] == completion.model_extra["citations"]


def test_the_sidecar_cites_what_the_clients_model_wrote(gateway):
    with gateway.client() as http:
        made = http.post("/v1/sessions", json={"task": TASK, "profile": "focused",
                                               "words": 600, "max_windows": 3})
        assert made.status_code == 201, made.text
        sid, token = made.json()["session_id"], made.json()["token"]
        env = http.post(f"/v1/sessions/{sid}/envelope",
                        headers={"Authorization": f"Bearer {token}"}).json()
        assert "cite the facts" in env["messages"][-1]["content"]
        first = env["facts"][0]
        text = (f"## {env['plan'][0]['title']}\n\n{first['content']} [F1, F999]\n")
        done = http.post(f"/v1/sessions/{sid}/windows",
                         headers={"Authorization": f"Bearer {env['token']}"},
                         json={"text": text, "etag": env["etag"]})
        assert done.status_code == 200, done.text
        body = done.json()
    assert body["citations"]["invalid"] == 1 and body["citations"]["cited"] >= 1
    assert "[1]" in body["text"] and "F999" not in body["text"] and "[F1" not in body["text"]
    (src,) = [s for s in body["sources"] if s["number"] == 1]
    assert src["fact_id"] == first["fact_id"] and not src["source"].startswith("/")


def test_the_session_trace_shows_sources_by_public_name(gateway, completion):
    import httpx

    crp = completion.model_extra["crp"]
    trace = httpx.get(f"{gateway.url}/v1/sessions/{crp['session_id']}",
                      headers={"Authorization": f"Bearer {crp['token']}"}, timeout=60).json()
    assert trace["sources"] and [s["number"] for s in trace["sources"]] == [
        s["number"] for s in crp["sources"]]
    assert all(not s["source"].startswith("/") for s in trace["sources"])
