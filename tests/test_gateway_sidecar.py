"""The sidecar API against a real gateway process: a session driven to task-complete, the
same windows as the library's own loop, token checks (tampered, expired, replayed, other
session, other model), bad input, and that failed calls change nothing stored."""

from __future__ import annotations

import base64
import json
import time
from typing import Any

import httpx
import jsonschema
import pytest

from cdr.ckf.handle import CKF
from cdr.gateway.session_token import TokenSigner
from cdr.trace import TRACE_SCHEMA
from cdr.window.loop import GenerationConfig, Generator
from cdr.writers import get_writer
from tests.gateway_server import (
    CRP,
    MAX_BODY_BYTES,
    OUTLINE,
    SECRET,
    TASK,
    TOKEN_TTL,
    WINDOW_TOKENS,
    WORDS,
)

pytest_plugins = ["tests.gateway_server"]

MODEL = "sentence-transformers/all-MiniLM-L6-v2#title-section-short"  # the default recipe
START = {"task": TASK, **CRP}


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def payload(token: str) -> dict[str, Any]:
    head = token.split(".")[1]  # a JWT: header.payload.signature
    return json.loads(base64.urlsafe_b64decode(head + "=" * (-len(head) % 4)))


def write(envelope: dict[str, Any]) -> str:
    """The client's LLM: here the extractive writer, reading the messages an LLM would get."""
    return get_writer("extractive").generate(envelope["messages"], envelope["max_tokens"]).text


def start(client: httpx.Client, **overrides: Any) -> tuple[str, str]:
    r = client.post("/v1/sessions", json={**START, **overrides})
    assert r.status_code == 201, r.text
    return r.json()["session_id"], r.json()["token"]


def step(client: httpx.Client, sid: str, token: str) -> tuple[dict, dict]:
    env = client.post(f"/v1/sessions/{sid}/envelope", headers=bearer(token))
    assert env.status_code == 200, env.text
    e = env.json()
    win = client.post(f"/v1/sessions/{sid}/windows", headers={"CRP-Session": e["token"]},
                      json={"text": write(e), "etag": e["etag"]})
    assert win.status_code == 200, win.text
    return e, win.json()


@pytest.fixture()
def client(gateway):
    with gateway.client() as c:
        yield c


def test_session_runs_to_task_complete_like_the_library_loop(client, gateway_ckf):
    r = client.post("/v1/sessions", json=START)
    assert r.status_code == 201
    body = r.json()
    sid, token = body["session_id"], body["token"]
    assert r.headers["CRP-Set-Session"] == token
    assert r.headers["CRP-Session-Id"] == sid
    assert r.headers["CRP-Context-Window"] == "0/4"
    assert r.headers["CRP-Context-Mode"] == "full"
    assert [q["text"] for q in body["sub_queries"]] == OUTLINE
    assert body["embedding_model"] == MODEL
    p = payload(token)
    assert (p["sid"], p["mid"], p["w"], p["r"]) == (sid, MODEL, 0, ["sq-1", "sq-2", "sq-3"])
    assert p["exp"] - p["iat"] == TOKEN_TTL

    texts, envelopes, results = [], [], []
    for number in range(1, 5):
        env = client.post(f"/v1/sessions/{sid}/envelope", headers=bearer(token))
        assert env.status_code == 200, env.text
        e = env.json()
        assert e["window"] == number and not e["done"]
        assert env.headers["CRP-Context-Window"] == f"{number}/4"
        assert env.headers["CRP-Envelope-ETag"] == e["etag"]
        assert int(env.headers["CRP-Envelope-Facts"]) == len(e["facts"]) > 0
        assert [f["ref"] for f in e["facts"]] == [f"F{i + 1}" for i in range(len(e["facts"]))]
        # Asking again before writing returns the same envelope (and a token still valid).
        again = client.post(f"/v1/sessions/{sid}/envelope", headers=bearer(e["token"])).json()
        assert again["etag"] == e["etag"] and again["facts"] == e["facts"]
        text = write(e)
        w = client.post(f"/v1/sessions/{sid}/windows", headers=bearer(again["token"]),
                        json={"text": text, "etag": e["etag"]})
        assert w.status_code == 200, w.text
        res = w.json()
        assert res["window"] == number
        assert w.headers["CRP-Set-Session"] == res["token"]
        assert w.headers["CRP-Context-Window"] == f"{number}/4"
        assert w.headers["CRP-Quality-Completeness"] == f"{res['completeness']:.2f}"
        assert payload(res["token"])["w"] == number
        assert payload(res["token"])["r"] == res["residual"]
        texts.append(text)
        envelopes.append(e)
        results.append(res)
        token = res["token"]
        if res["done"]:
            break
    final = results[-1]
    assert final["status"] == final["exit_reason"] == "task-complete"
    assert final["completeness"] >= 0.92 and final["residual"] == []
    assert len(results) >= 2  # a multi-window document

    # The sidecar ran exactly the library's loop: same envelopes, same texts, same exits.
    with CKF.open(gateway_ckf) as ckf:
        gen = Generator(ckf, get_writer("extractive"), GenerationConfig(
            max_windows=4, words=WORDS, generation_tokens=WINDOW_TOKENS))
        events = list(gen.run(TASK, "\n".join(OUTLINE)))
    assert [ev.output for ev in events] == texts
    assert [ev.prepared.envelope.etag for ev in events] == [e["etag"] for e in envelopes]
    assert [ev.status for ev in events] == [r["status"] for r in results]

    tr = client.get(f"/v1/sessions/{sid}", headers=bearer(token))
    assert tr.status_code == 200
    trace = tr.json()
    jsonschema.validate(trace, TRACE_SCHEMA)
    assert trace["status"] == "task-complete" and trace["session_id"] == sid
    assert [w["number"] for w in trace["windows"]] == list(range(1, len(texts) + 1))
    assert [w["output"] for w in trace["windows"]] == texts
    for w, e in zip(trace["windows"], envelopes, strict=True):
        assert [x["fact_id"] for x in w["envelope"]] == [f["fact_id"] for f in e["facts"]]
    assert tr.headers["CRP-Context-Window"] == f"{len(texts)}/4"

    ended = client.post(f"/v1/sessions/{sid}/envelope", headers=bearer(token))
    assert ended.status_code == 409 and ended.json()["error"]["code"] == "session_ended"
    d = client.delete(f"/v1/sessions/{sid}", headers=bearer(token))
    assert d.status_code == 200 and d.json() == {"id": sid, "deleted": True}
    gone = client.get(f"/v1/sessions/{sid}", headers=bearer(token))
    assert gone.status_code == 404 and sid in gone.json()["error"]["message"]


def _flip(token: str, index: int) -> str:
    c = token[index]
    return token[:index] + ("A" if c != "A" else "B") + token[index + 1:]


def test_tampered_expired_replayed_and_foreign_tokens_are_refused(client):
    sid, token = start(client)
    other_sid, other_token = start(client)
    url = f"/v1/sessions/{sid}/envelope"

    def err(resp: httpx.Response, status: int, code: str | None) -> dict:
        assert resp.status_code == status, resp.text
        e = resp.json()["error"]
        assert e["code"] == code, e
        return e

    err(client.post(url), 401, "missing_token")
    err(client.post(url, headers=bearer("not-a-token")), 401, "invalid_token")
    err(client.post(url, headers=bearer(_flip(token, len(token) - 5))), 401, "invalid_token")
    err(client.post(url, headers=bearer(_flip(token, 10))), 401, "invalid_token")
    err(client.post(url, headers=bearer(other_token)), 401, "invalid_token")

    signer = TokenSigner.from_secret(SECRET)
    expired = TokenSigner.from_secret(SECRET, clock=lambda: time.time() - 10_000)
    e = err(client.post(url, headers=bearer(expired.issue(sid, MODEL, 0))), 401,
            "expired_token")
    assert "expired" in e["message"]
    e = err(client.post(url, headers=bearer(signer.issue(sid, "acme/embed-v9", 0))), 409,
            "embedding_model_mismatch")
    assert MODEL in e["message"] and "acme/embed-v9" in e["message"]
    assert (e["expected"], e["got"]) == (MODEL, "acme/embed-v9")
    wrong_key = TokenSigner.from_secret("another-secret-0123456789abcdef")
    err(client.post(url, headers=bearer(wrong_key.issue(sid, MODEL, 0))), 401, "invalid_token")

    # Replay: after window 1, the token for window 0 is stale (409) on every endpoint that
    # writes; the trace (a read) answers it, with the current token.
    _, res = step(client, sid, token)
    for method, path, kw in (("POST", url, {}),
                             ("POST", f"/v1/sessions/{sid}/windows", {"json": {"text": "x"}}),
                             ("DELETE", f"/v1/sessions/{sid}", {})):
        e = err(client.request(method, path, headers=bearer(token), **kw), 409, "stale_token")
        assert "window 0" in e["message"] and "window 1" in e["message"]
    read = client.get(f"/v1/sessions/{sid}", headers=bearer(token))
    assert read.status_code == 200
    assert signer.verify(read.headers["CRP-Set-Session"], session_id=sid).window == 1
    # A token from the future (signed, but ahead of the stored state) is refused too.
    err(client.post(url, headers=bearer(signer.issue(sid, MODEL, 5))), 409, "stale_token")
    # The valid token still works, via either header, and nothing was changed by the above.
    ok = client.post(url, headers={"CRP-Session": res["token"]})
    assert ok.status_code == 200 and ok.json()["window"] == 2
    tr = client.get(f"/v1/sessions/{sid}", headers=bearer(ok.json()["token"])).json()
    assert len(tr["windows"]) == 1
    # An unknown session with a validly signed token for it: 404 naming it.
    ghost = "0" * 32
    e = err(client.get(f"/v1/sessions/{ghost}", headers=bearer(signer.issue(ghost, MODEL, 0))),
            404, None)
    assert ghost in e["message"]
    client.delete(f"/v1/sessions/{other_sid}", headers=bearer(other_token))


def test_bad_requests_get_named_4xx_errors_and_change_nothing(client):
    sid, token = start(client)
    _, r1 = step(client, sid, token)
    token = r1["token"]
    before = client.get(f"/v1/sessions/{sid}", headers=bearer(token)).json()

    def check(resp: httpx.Response, status: int, *words: str) -> None:
        assert resp.status_code == status, resp.text
        body = resp.json()
        assert set(body) == {"error"} and body["error"]["type"]
        for w in words:
            assert w in body["error"]["message"], (w, body)

    win = f"/v1/sessions/{sid}/windows"
    check(client.post(win, headers=bearer(token), json={"text": "x"}), 409, "envelope first")
    check(client.post(win, headers={**bearer(token), "content-type": "application/json"},
                      content=b'{"text": '), 400, "not valid JSON")
    check(client.post(win, headers=bearer(token), json={}), 422, "text")
    check(client.post(win, headers=bearer(token), json={"text": 7}), 422, "text")
    check(client.post(win, headers=bearer(token), json={"text": "x", "extra": 1}), 422, "extra")
    check(client.post("/v1/sessions", json={"outline": OUTLINE}), 422, "task")
    check(client.post("/v1/sessions", json={**START, "max_windows": "many"}), 422,
          "max_windows")
    check(client.post("/v1/sessions", json={**START, "max_windows": 21}), 422, "max_windows")
    check(client.post("/v1/sessions", json={**START, "ranking": "random"}), 422, "ranking")
    check(client.post("/v1/sessions", json={**START, "repeats": "hide"}), 422, "repeats")
    check(client.post("/v1/sessions", json={**START, "subject": "title"}), 422, "subject")
    check(client.post("/v1/sessions", json={**START, "lexical": "tfidf"}), 422, "lexical")
    check(client.post("/v1/sessions", json={**START, "stale": "skip"}), 422, "stale")
    check(client.post("/v1/sessions", json={**START, "documents": "all"}), 422, "documents")
    check(client.post("/v1/sessions", json={**START, "resume": "always"}), 422, "resume")
    check(client.post("/v1/sessions", json={**START, "outline": ["ok", " "]}), 422, "outline")
    check(client.post("/v1/sessions", json={**START, "task": "   "}), 422, "task")
    check(client.post("/v1/sessions", json=[1, 2]), 422)
    check(client.get("/v1/sessions/bad%20id", headers=bearer(token)), 422, "session_id")
    check(client.get("/v1/nowhere"), 404, "/v1/nowhere")
    check(client.put("/healthz"), 405, "PUT")
    big = {"text": "word " * (MAX_BODY_BYTES // 5 + 10)}
    check(client.post(win, headers=bearer(token), json=big), 413, str(MAX_BODY_BYTES))

    def chunks():  # no Content-Length: the limit is enforced while reading
        for _ in range(MAX_BODY_BYTES // 10_000 + 2):
            yield b" " * 10_000

    check(client.post(win, headers={**bearer(token), "content-type": "application/json"},
                      content=chunks()), 413, "exceeds")
    e2 = client.post(f"/v1/sessions/{sid}/envelope", headers=bearer(token)).json()
    check(client.post(win, headers=bearer(token), json={"text": "x", "etag": "f" * 32}), 409,
          "etag")

    after = client.get(f"/v1/sessions/{sid}", headers=bearer(token)).json()
    assert after == before  # failed calls stored nothing
    ok = client.post(win, headers=bearer(token), json={"text": write(e2), "etag": e2["etag"]})
    assert ok.status_code == 200 and ok.json()["window"] == 2


def test_nothing_relevant_left_ends_the_session_at_the_envelope(client):
    sid, token = start(client, task="Write about the migration of arctic terns",
                       outline=["Breeding colonies of arctic terns", "Their flight routes"])
    r = client.post(f"/v1/sessions/{sid}/envelope", headers=bearer(token))
    assert r.status_code == 200
    e = r.json()
    assert e["done"] and e["status"] == "ckf-exhausted"
    assert e["facts"] == [] and e["messages"] == []  # do not ask an LLM for ungrounded text
    assert r.headers["CRP-Context-Mode"] == "ckf-exhausted"
    assert r.headers["CRP-Onboarding-Hint"] == "ingest-more-documents-for-continued-quality"
    assert r.headers["CRP-Context-Window"] == "1/4"
    trace = client.get(f"/v1/sessions/{sid}", headers=bearer(e["token"])).json()
    assert trace["status"] == "ckf-exhausted" and len(trace["windows"]) == 1
    jsonschema.validate(trace, TRACE_SCHEMA)
    assert trace["windows"][0]["envelope"] == [] and trace["windows"][0]["output"] == ""


def test_health_metrics_openapi_and_default_headers(client):
    sid, token = start(client)
    step(client, sid, token)
    h = client.get("/healthz")
    assert h.status_code == 200 and h.json()["status"] == "ok"
    assert h.json()["ckf"]["model_id"] == MODEL and h.json()["ckf"]["active_facts"] > 50
    assert h.headers["CRP-Context-Mode"] == "full"
    text = client.get("/metrics").text
    assert 'cdr_http_requests_total{method="POST",route="/v1/sessions/{session_id}/envelope",' \
           'status="200"}' in text
    assert "cdr_windows_generated_total" in text
    assert "cdr_http_request_duration_seconds_bucket" in text
    spec = client.get("/openapi.json").json()
    paths = spec["paths"]
    assert {"/v1/chat/completions", "/v1/sessions", "/v1/sessions/{session_id}/envelope",
            "/v1/sessions/{session_id}/windows", "/v1/sessions/{session_id}",
            "/v1/ckf/documents", "/v1/ckf/jobs/{job_id}", "/v1/ckf/stats",
            "/v1/ckf/documents/{doc_id}", "/healthz", "/metrics"} <= set(paths)
    assert set(paths["/v1/sessions/{session_id}"]) == {"get", "delete"}


def test_repeats_drop_takes_a_restated_window_out_of_the_stored_session(client):
    """A sidecar client whose LLM writes the same paragraph twice: with `repeats: "drop"` the
    second window keeps only what is new, and the trace says what was taken out."""
    sid, token = start(client, repeats="drop", max_windows=3)
    said = ("Built-in numeric types are int, float and complex, and integers have "
            "unlimited precision in every Python version.")
    new = "Dictionaries map hashable keys to arbitrary values and keep insertion order."
    for text in (said, f"{said}\n\n{new}"):
        env = client.post(f"/v1/sessions/{sid}/envelope", headers=bearer(token))
        assert env.status_code == 200, env.text
        e = env.json()
        win = client.post(f"/v1/sessions/{sid}/windows", headers={"CRP-Session": e["token"]},
                          json={"text": text, "etag": e["etag"]})
        assert win.status_code == 200, win.text
        token = win.json()["token"]
    trace = client.get(f"/v1/sessions/{sid}", headers=bearer(token)).json()
    jsonschema.validate(trace, TRACE_SCHEMA)
    assert trace["options"] == {"repeats": "drop"}
    first, second = trace["windows"]
    assert said in first["output"] and "dropped" not in first
    assert second["dropped"] == [said] and second["output"].strip() == new


def _finished_ids(gateway: Any, sid: str) -> list[str]:
    """The sections the stored session counts as written whole (the length contract)."""
    import sqlite3
    from pathlib import Path

    with sqlite3.connect(Path(gateway.env["CDR_SESSION_DB"])) as conn:
        (data,) = conn.execute("SELECT data FROM sessions WHERE id = ?", (sid,)).fetchone()

    def find(node: Any) -> list[str] | None:
        if isinstance(node, dict):
            if "finished_ids" in node:
                return list(node["finished_ids"])
            for v in node.values():
                if (got := find(v)) is not None:
                    return got
        return None

    return find(json.loads(data)) or []


def test_a_window_cut_at_max_tokens_is_continued_not_counted_as_finished(client, gateway):
    """The sidecar takes the client's `finish_reason`: under the length contract a window cut
    at `length` leaves its last section open for the next window, as the library's own writers
    do; the same text ended with `stop` (or with none, as before) finishes it."""
    finished = {}
    for reason in ("stop", "length", None):
        sid, token = start(client, length="contract", max_windows=3)
        e = client.post(f"/v1/sessions/{sid}/envelope", headers=bearer(token)).json()
        body = {"text": write(e), "etag": e["etag"]}
        if reason is not None:
            body["finish_reason"] = reason
        win = client.post(f"/v1/sessions/{sid}/windows", headers=bearer(e["token"]), json=body)
        assert win.status_code == 200, win.text
        finished[reason] = _finished_ids(gateway, sid)
    assert finished["stop"] == finished[None] and finished["stop"]
    assert len(finished["length"]) == len(finished["stop"]) - 1
    assert set(finished["length"]) < set(finished["stop"])
    sid, token = start(client, length="contract")
    e = client.post(f"/v1/sessions/{sid}/envelope", headers=bearer(token)).json()
    before = _stored_row(gateway, sid)
    bad = client.post(f"/v1/sessions/{sid}/windows", headers=bearer(e["token"]),
                      json={"text": "x", "finish_reason": "truncated"})
    assert bad.status_code == 422 and "finish_reason" in bad.text
    assert _stored_row(gateway, sid) == before  # the refusal changed nothing stored


def _stored_row(gateway: Any, sid: str) -> tuple[Any, ...]:
    import sqlite3
    from pathlib import Path

    with sqlite3.connect(Path(gateway.env["CDR_SESSION_DB"])) as conn:
        return tuple(conn.execute("SELECT * FROM sessions WHERE id = ?", (sid,)).fetchone())
