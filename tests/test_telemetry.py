"""OpenTelemetry (the `otel` extra): a server span per gateway request and a span per window
with the window's CRP headers as attributes, caught by the SDK's in-memory exporter around a
real app (Starlette's TestClient drives the ASGI app in this process)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("opentelemetry.sdk", reason="the otel extra is not installed")

from fastapi.testclient import TestClient
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from cdr.gateway.app import create_app
from cdr.gateway.auth import hash_key
from cdr.gateway.settings import GatewaySettings
from cdr.window.telemetry import crp_attributes
from tests.gateway_server import CRP, SECRET, TASK

pytest_plugins = ["tests.gateway_server"]

_EXPORTER = InMemorySpanExporter()
KEY = "cdr_oTeLkEyQ7vT9LmP2wR8sK4nB7yH1cJ6"


@pytest.fixture(scope="module")
def exporter() -> InMemorySpanExporter:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(_EXPORTER))
    trace.set_tracer_provider(provider)  # once per process: OpenTelemetry refuses a second
    if trace.get_tracer_provider() is not provider:
        pytest.skip("another tracer provider was set first in this process")
    return _EXPORTER


def test_request_and_window_spans_carry_crp_headers(exporter, gateway_ckf: Path,
                                                    tmp_path: Path) -> None:
    settings = GatewaySettings(api_keys=f"generate:{hash_key(KEY)}", signing_secret=SECRET,
                               session_db=tmp_path / "s.sqlite3")
    exporter.clear()
    with TestClient(create_app(settings, ckf=gateway_ckf)) as client:
        r = client.post("/v1/chat/completions?note=sk-queryvalue-123456789",
                        headers={"X-Request-ID": "otel-1", "Authorization": f"Bearer {KEY}"},
                        json={"model": "cdr", "messages": [{"role": "user", "content": TASK}],
                              "crp": CRP})
        assert r.status_code == 200
    spans = exporter.get_finished_spans()
    windows = [s for s in spans if s.name == "cdr.window"]
    n = r.json()["crp"]["windows"]
    assert len(windows) == n >= 2
    assert [s.attributes["cdr.window.number"] for s in windows] == list(range(1, n + 1))
    last = windows[-1].attributes
    assert last["crp.context.window"] == r.headers["CRP-Context-Window"]
    assert last["crp.context.continuation.status"] == "task-complete"
    assert last["cdr.window.status"] == "task-complete"
    assert "crp.set.session" not in last  # the token is a credential
    assert all(s.end_time >= s.start_time for s in windows)
    (request,) = [s for s in spans if s.name == "HTTP POST /v1/chat/completions"]
    attrs = request.attributes
    assert attrs["http.response.status_code"] == 200 and attrs["cdr.request_id"] == "otel-1"
    assert attrs["url.path"] == "/v1/chat/completions"
    assert attrs["crp.context.window"] == r.headers["CRP-Context-Window"]
    values = [f"{s.name} {k}={v}" for s in spans for k, v in s.attributes.items()]
    assert not [v for v in values if "sk-queryvalue" in v or KEY in v]


def test_crp_attribute_names() -> None:
    assert crp_attributes({"CRP-Context-Coverage-Score": "0.91", "CRP-Set-Session": "jwt"}) == {
        "crp.context.coverage.score": "0.91"}
