"""Gateway metrics: values reach the exposition text; each app has its own registry."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from cdr.gateway.metrics import GatewayMetrics, render_metrics


def samples(metrics: GatewayMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    body, content_type = render_metrics(metrics.registry)
    assert content_type.startswith("text/plain")
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(body.decode())
        for s in family.samples
    }


def test_counters_and_histogram_appear_with_exact_values() -> None:
    m = GatewayMetrics()
    m.observe_request("/v1/sessions/{session_id}/envelope", "post", 200, 0.004)
    m.observe_request("/v1/sessions/{session_id}/envelope", "POST", 200, 0.2)
    m.observe_request("/v1/chat/completions", "POST", 502, 3.0)
    m.window_done(ngram_activations=3)
    m.window_done()
    m.session_exit("task-complete")
    m.session_exit("task-complete")
    m.session_exit("max-windows")
    got = samples(m)
    route = ("route", "/v1/sessions/{session_id}/envelope")
    assert got[("cdr_http_requests_total", (("method", "POST"), route, ("status", "200")))] == 2
    chat = (("method", "POST"), ("route", "/v1/chat/completions"), ("status", "502"))
    assert got[("cdr_http_requests_total", chat)] == 1
    lat = (("method", "POST"), route)
    assert got[("cdr_http_request_duration_seconds_count", lat)] == 2
    assert abs(got[("cdr_http_request_duration_seconds_sum", lat)] - 0.204) < 1e-12
    assert got[("cdr_http_request_duration_seconds_bucket", (("le", "0.005"), *lat))] == 1
    assert got[("cdr_http_request_duration_seconds_bucket", (("le", "0.25"), *lat))] == 2
    assert got[("cdr_windows_generated_total", ())] == 2
    assert got[("cdr_ngram_activations_total", ())] == 3
    assert got[("cdr_session_exits_total", (("reason", "task-complete"),))] == 2
    assert got[("cdr_session_exits_total", (("reason", "max-windows"),))] == 1


def test_two_apps_have_independent_registries() -> None:
    a, b = GatewayMetrics(), GatewayMetrics()
    a.window_done()
    assert samples(a)[("cdr_windows_generated_total", ())] == 1
    assert samples(b)[("cdr_windows_generated_total", ())] == 0
