"""Units of the guards a real server exercises in tests/test_gateway_owner_hostile.py: the
access log's query redaction, dev mode's Host and cross-site checks, and KB-scoped keys'
required scopes."""

from __future__ import annotations

import logging

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cdr.gateway.access_log import REDACTED, RedactQuery, redact_query
from cdr.gateway.auth import required_scope
from cdr.gateway.dev_guard import loopback_host, refusal


@given(st.text(alphabet=st.characters(blacklist_characters="?"), max_size=30),
       st.text(max_size=60))
def test_redact_query_keeps_the_path_and_drops_every_query(path: str, query: str) -> None:
    out = redact_query(f"{path}?{query}")
    assert out == path + REDACTED
    assert redact_query(path) == path


def test_the_filter_rewrites_uvicorns_access_record() -> None:
    record = logging.LogRecord("uvicorn.access", logging.INFO, __file__, 1,
                               '%s - "%s %s HTTP/%s" %d',
                               ("127.0.0.1:5000", "GET", "/v1/ckf/stats?api_key=cdr_secret",
                                "1.1", 401), None)
    assert RedactQuery().filter(record)
    line = record.getMessage()
    assert line == '127.0.0.1:5000 - "GET /v1/ckf/stats?<redacted> HTTP/1.1" 401'


@pytest.mark.parametrize(("host", "ok"), [
    ("127.0.0.1", True), ("127.0.0.1:8088", True), ("127.9.9.9:1", True),
    ("localhost", True), ("LOCALHOST:80", True), ("[::1]", True), ("[::1]:8088", True),
    ("", False), (None, False), ("attacker.example", False), ("localhost.evil:80", False),
    ("127.0.0.1.nip.io", False), ("[::1]x", False), ("127.0.0.1:80x", False),
    ("0.0.0.0", False), ("10.0.0.1:8088", False), ("[::ffff:10.0.0.1]", False),
])
def test_loopback_host(host: str | None, ok: bool) -> None:
    assert loopback_host(host) is ok


def _scope(method: str, **headers: str) -> dict[str, object]:
    return {"type": "http", "method": method, "scheme": "http",
            "headers": [(k.lower().replace("_", "-").encode(), v.encode())
                        for k, v in headers.items()]}


def test_dev_guard_decisions() -> None:
    host = "127.0.0.1:8088"
    assert refusal(_scope("GET", host=host)) is None
    assert refusal(_scope("GET", host=host, origin="https://evil.example")) is None  # a read
    assert refusal(_scope("POST", host=host)) is None  # curl, scripts
    assert refusal(_scope("POST", host=host, origin=f"http://{host}")) is None
    assert refusal(_scope("POST", host=host, sec_fetch_site="same-origin")) is None
    for bad in ({"origin": "https://evil.example"}, {"origin": "null"},
                {"origin": "http://127.0.0.1:9999"}, {"sec_fetch_site": "cross-site"},
                {"sec_fetch_site": "same-site"}):
        err = refusal(_scope("DELETE", host=host, **bad))
        assert err is not None and err.status == 403 and err.code == "cross_site_write"
    err = refusal(_scope("GET", host="evil.example"))
    assert err is not None and err.code == "dev_mode_host"


@pytest.mark.parametrize(("method", "path", "scope"), [
    ("POST", "/v1/kbs/docs/documents", "admin"),
    ("DELETE", "/v1/kbs/docs/documents/abc", "admin"),
    ("GET", "/v1/kbs/docs/documents", "generate"),
    ("GET", "/v1/kbs/docs/jobs/1", "generate"),
    ("POST", "/v1/kbs/docs/sessions", "generate"),
    ("DELETE", "/v1/kbs/docs/sessions/abc", "generate"),
    ("POST", "/v1/kbs/sessions/documents", "admin"),  # a KB named `sessions`
    ("GET", "/v1/models", "generate"),
    ("GET", "/docs", None),  # open when on (CDR_API_DOCS=1); a 404 when off
    ("GET", "/openapi.json", None),
])
def test_required_scope_of_kb_routes(method: str, path: str, scope: str | None) -> None:
    assert required_scope(method, path) == scope
