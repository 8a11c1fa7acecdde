"""A gateway started the way users start it (`cdr serve`), on a private copy of the test CKF:
it refuses to start without a signing secret, sessions survive a restart, fuzzing every
operation of its OpenAPI schema (schemathesis, valid and invalid inputs) finds no 5xx, and
property tests send arbitrary chat tasks and arbitrary window texts through the real loop."""

from __future__ import annotations

import subprocess
import sys
from collections import defaultdict

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error

from tests.gateway_server import (
    OUTLINE,
    TASK,
    GatewayServer,
    base_env,
    child_env,
    copy_ckf,
    free_port,
)

pytest_plugins = ["tests.gateway_server"]


@pytest.fixture(scope="module")
def cli_gateway(gateway_ckf, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gateway-cli")
    ckf = copy_ckf(gateway_ckf, tmp / "ckf")
    env = base_env(tmp, CDR_MAX_BODY_BYTES="200000", CDR_MAX_WINDOWS_CAP="3")
    with GatewayServer(env, via_cli=True, ckf=ckf, workdir=tmp) as server:
        yield server


def test_serve_refuses_to_start_without_a_signing_secret(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "cdr.cli", "serve", "--ckf", str(tmp_path / "ckf"),
         "--port", str(free_port())],
        env=child_env({}), cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2  # a configuration error: one line, exit 2
    assert "CDR_SIGNING_SECRET is not set" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_sessions_survive_a_restart(cli_gateway):
    with cli_gateway.client() as c:
        r = c.post("/v1/sessions", json={"task": TASK, "outline": OUTLINE, "max_windows": 3})
        assert r.status_code == 201
        sid, token = r.json()["session_id"], r.json()["token"]
        env = c.post(f"/v1/sessions/{sid}/envelope",
                     headers={"Authorization": f"Bearer {token}"}).json()
    cli_gateway.restart()
    with cli_gateway.client() as c:
        # The pending envelope and the token both survived: the window completes.
        w = c.post(f"/v1/sessions/{sid}/windows", headers={"Authorization": f"Bearer {token}"},
                   json={"text": "## The try statement\n\n" + env["facts"][0]["content"],
                         "etag": env["etag"]})
        assert w.status_code == 200, w.text
        assert w.json()["window"] == 1
        trace = c.get(f"/v1/sessions/{sid}",
                      headers={"Authorization": f"Bearer {w.json()['token']}"}).json()
        assert [x["number"] for x in trace["windows"]] == [1]
        too_many = c.post("/v1/sessions", json={"task": TASK, "max_windows": 4})
        assert too_many.status_code == 422 and "cap of 3" in too_many.json()["error"]["message"]


def test_fuzzing_every_operation_finds_no_server_error(cli_gateway):
    """Valid and invalid inputs generated from `/openapi.json` for each operation; schemathesis
    drives hypothesis itself (its pytest plugin does not run on this pytest version)."""
    api = schemathesis.openapi.from_url(f"{cli_gateway.url}/openapi.json")
    failures: list[str] = []
    labels: list[str] = []
    statuses: dict[str, list[int]] = defaultdict(list)
    for result in api.get_all_operations():
        operation = result.ok()
        labels.append(operation.label)
        for mode, examples in ((GenerationMode.POSITIVE, 25), (GenerationMode.NEGATIVE, 10)):

            @given(case=operation.as_strategy(generation_mode=mode))
            @settings(max_examples=examples, deadline=None, derandomize=True, database=None,
                      suppress_health_check=list(HealthCheck))
            def fuzz(case: schemathesis.Case) -> None:
                response = case.call_and_validate(checks=[not_a_server_error], timeout=120)
                statuses[case.operation.label].append(response.status_code)

            try:
                fuzz()
            except Unsatisfiable:
                assert mode is GenerationMode.NEGATIVE  # nothing invalid to send (no input)
            except Exception as exc:  # collect every operation's failure, then report
                failures.append(f"{operation.label} ({mode.value}): {exc}")
    assert len(labels) >= 11, labels
    assert not failures, "\n\n".join(failures)
    print({k: sorted(set(v)) for k, v in statuses.items()})
    # The fuzzer got through validation too, not only bounced off it.
    assert 201 in statuses["POST /v1/sessions"]


text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=120)


@given(
    task=text.filter(str.strip),
    outline=st.none() | st.lists(text.filter(lambda x: x.strip() and "\n" not in x
                                             and "\r" not in x), min_size=1, max_size=4),
    max_windows=st.integers(1, 3),
    ranking=st.sampled_from(["cdr", "relevance", "mmr"]),
    stream=st.booleans(),
)
@settings(max_examples=12, deadline=None, database=None,
          suppress_health_check=list(HealthCheck))
def test_any_chat_task_gets_a_document_or_a_named_4xx(cli_gateway, task, outline, max_windows,
                                                     ranking, stream):
    body = {"model": "cdr", "messages": [{"role": "user", "content": task}], "stream": stream,
            "crp": {"outline": outline, "max_windows": max_windows, "ranking": ranking}}
    r = httpx.post(f"{cli_gateway.url}/v1/chat/completions", json=body, timeout=120)
    if r.status_code == 422:
        # Nothing in the CKF is relevant to the task (no outline given), or the outline had
        # no usable line once list markers were stripped (e.g. "- ").
        message = r.json()["error"]["message"]
        assert ("relevant" in message) if outline is None else ("outline" in message), message
        return
    assert r.status_code == 200, r.text
    if stream:
        assert r.text.endswith("data: [DONE]\n\n")
        return
    crp = r.json()["crp"]
    assert 1 <= crp["windows"] <= max_windows
    assert crp["status"] in ("task-complete", "limit-reached", "ckf-exhausted")
    assert r.headers["CRP-Context-Window"] == f"{crp['windows']}/{max_windows}"


window_text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=400) | (
    st.lists(st.sampled_from(["## The try statement", "", "except clause", "   ", "\t#",
                              "The with statement calls __enter__", "- item", "\u2028", "é"]),
             max_size=12).map("\n".join))


@given(text=window_text)
@settings(max_examples=15, deadline=None, database=None,
          suppress_health_check=list(HealthCheck))
def test_any_window_text_is_verified(cli_gateway, text):
    """Whatever an LLM returns (empty, markup only, odd Unicode), the window is accepted,
    verified and counted; the session stays consistent."""
    with cli_gateway.client() as c:
        r = c.post("/v1/sessions", json={"task": TASK, "outline": OUTLINE, "max_windows": 2})
        sid, token = r.json()["session_id"], r.json()["token"]
        env = c.post(f"/v1/sessions/{sid}/envelope",
                     headers={"Authorization": f"Bearer {token}"}).json()
        w = c.post(f"/v1/sessions/{sid}/windows", headers={"Authorization": f"Bearer {token}"},
                   json={"text": text, "etag": env["etag"]})
        assert w.status_code == 200, w.text
        res = w.json()
        assert res["window"] == 1 and 0.0 <= res["completeness"] <= 1.0
        assert all(0 < a["depth"] <= 0.9 for a in res["report"]["addressed"])
        trace = c.get(f"/v1/sessions/{sid}",
                      headers={"Authorization": f"Bearer {res['token']}"}).json()
        assert trace["windows"][0]["output"] == text
        c.delete(f"/v1/sessions/{sid}", headers={"Authorization": f"Bearer {res['token']}"})
