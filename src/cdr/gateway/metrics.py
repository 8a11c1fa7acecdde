"""Prometheus metrics for `GET /metrics`.

Each app owns a `GatewayMetrics` on its own `CollectorRegistry`, never the process-global
one: tests start several apps in one process, and registering the same metric name twice in
the global registry raises. Label values must come from small fixed sets (the route template
such as `/v1/sessions/{session_id}`, never the raw path; exit reasons from SPEC-024 §5) so the
number of time series stays bounded.
"""

from __future__ import annotations

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

__all__ = ["LATENCY_BUCKETS", "GatewayMetrics", "render_metrics"]

METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
OTHER = "other"

# Envelope requests take ~1-50 ms; chat completions with an upstream LLM take seconds.
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class GatewayMetrics:
    """The gateway's metrics, registered on `registry` (a fresh one by default)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.requests = Counter(
            "cdr_http_requests",
            "HTTP requests handled, by route template, method and status code.",
            ["route", "method", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "cdr_http_request_duration_seconds",
            "Time from request received to response ready, by route template and method.",
            ["route", "method"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.windows = Counter(
            "cdr_windows_generated",
            "Windows written (chat completions) or reported (sidecar).",
            registry=self.registry,
        )
        self.exits = Counter(
            "cdr_session_exits",
            "Window loops ended, by exit reason (SPEC-024 §5).",
            ["reason"],
            registry=self.registry,
        )
        self.runs_admitted = Gauge(
            "cdr_runs_admitted",
            "Chat completion runs admitted: writing or waiting for a chat thread.",
            registry=self.registry,
        )
        self.runs_waiting = Gauge(
            "cdr_runs_waiting",
            "Admitted chat completion runs waiting for a chat thread (the queue's depth).",
            registry=self.registry,
        )
        self.runs_refused = Counter(
            "cdr_runs_refused",
            "Chat completion runs refused at admission: busy (503) or the key's bound (key, "
            "429).",
            ["reason"],
            registry=self.registry,
        )
        self.ngram_activations = Counter(
            "cdr_ngram_activations",
            "Candidate facts penalised by the n-gram output guard.",
            registry=self.registry,
        )

    def observe_request(self, route: str | None, method: str, status: int,
                        seconds: float) -> None:
        """Count a request. `route` must be a registered route template or None (no route
        matched: `other`); a method outside the standard ones is `other`, and a status
        outside 100-599 is `other`: a client cannot make up a label value."""
        m = method.upper() if method.upper() in METHODS else OTHER
        r = route or OTHER
        code = str(status) if 100 <= status <= 599 else OTHER
        self.requests.labels(route=r, method=m, status=code).inc()
        self.latency.labels(route=r, method=m).observe(seconds)

    def admission(self, admitted: int, waiting: int) -> None:
        self.runs_admitted.set(admitted)
        self.runs_waiting.set(waiting)

    def refused(self, reason: str) -> None:
        self.runs_refused.labels(reason=reason if reason in ("busy", "key") else OTHER).inc()

    def window_done(self, ngram_activations: int = 0) -> None:
        self.windows.inc()
        if ngram_activations:
            self.ngram_activations.inc(ngram_activations)

    def session_exit(self, reason: str) -> None:
        self.exits.labels(reason=reason).inc()


def render_metrics(registry: CollectorRegistry) -> tuple[bytes, str]:
    """The Prometheus text exposition of `registry` and its content type."""
    return generate_latest(registry), CONTENT_TYPE_LATEST
