"""The gateway's run inspector over HTTP (a real gateway process on loopback): who may read a
session's view, what the JSON carries, the security headers, and the admin list."""

from __future__ import annotations

import re
from html import escape

import httpx
import pytest

from tests.ui_fixtures import ADMIN_KEY, GENERATE_KEY, MARKUP, OUTLINE, TASK

pytest_plugins = ["tests.ui_fixtures"]

START = {"task": TASK, "outline": OUTLINE.splitlines(), "words": 600, "window_tokens": 400,
         "max_windows": 3, "profile": "spec"}  # 3 windows of the spec loop (default: focused)


def run_windows(client: httpx.Client, n: int) -> tuple[str, list[str]]:
    """A sidecar session with n windows written; every token it was handed, oldest first."""
    from cdr.writers import get_writer

    r = client.post("/v1/sessions", json=START)
    assert r.status_code == 201, r.text
    sid, tokens = r.json()["session_id"], [r.json()["token"]]
    for _ in range(n):
        env = client.post(f"/v1/sessions/{sid}/envelope", headers={"CRP-Session": tokens[-1]})
        assert env.status_code == 200, env.text
        e = env.json()
        tokens.append(e["token"])
        text = get_writer("extractive").generate(e["messages"], e["max_tokens"]).text
        win = client.post(f"/v1/sessions/{sid}/windows", headers={"CRP-Session": e["token"]},
                          json={"text": text, "etag": e["etag"]})
        assert win.status_code == 200, win.text
        tokens.append(win.json()["token"])
    return sid, tokens


@pytest.fixture(scope="module")
def client(ui_gateway):
    with ui_gateway.client(headers={"Authorization": f"Bearer {GENERATE_KEY}"}) as c:
        yield c


def test_session_view_needs_a_token_for_that_session(client):
    sid, tokens = run_windows(client, 1)
    _, other_tokens = run_windows(client, 0)
    url = f"/ui/api/sessions/{sid}"
    r = client.get(url)
    assert r.status_code == 401 and r.json()["error"]["code"] == "missing_token"
    assert client.get(url, headers={"CRP-Session": other_tokens[-1]}).status_code == 401
    bad = tokens[-1][:-3] + ("AAA" if not tokens[-1].endswith("AAA") else "BBB")
    assert client.get(url, headers={"CRP-Session": bad}).status_code == 401
    # Any token the session handed out reads the view (it only reads).
    for headers in ({"CRP-Session": tokens[0]}, {"CRP-Session": tokens[-1]}):
        r = client.get(url, headers=headers)
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["windows"] == 1 and body["status"] == "in-progress" and body["changed"]
        assert 'id="w1"' in body["html"] and "Window 1" in body["html"]
    unknown = client.get("/ui/api/sessions/nosuchsession",
                         headers={"CRP-Session": tokens[-1]})
    assert unknown.status_code == 401  # a token for another id proves nothing about this one


def test_view_reports_unchanged_until_a_window_arrives(client):
    sid, tokens = run_windows(client, 1)
    url = f"/ui/api/sessions/{sid}"
    first = client.get(url, headers={"CRP-Session": tokens[-1]}).json()
    same = client.get(url, params={"after": first["version"]},
                      headers={"CRP-Session": tokens[-1]}).json()
    assert same == {"version": first["version"], "status": "in-progress", "windows": 1,
                    "changed": False}
    sid_tokens = tokens[-1]
    env = client.post(f"/v1/sessions/{sid}/envelope", headers={"CRP-Session": sid_tokens})
    e = env.json()
    client.post(f"/v1/sessions/{sid}/windows", headers={"CRP-Session": e["token"]},
                json={"text": "Raising exceptions is done with the raise statement.",
                      "etag": e["etag"]}).raise_for_status()
    later = client.get(url, params={"after": first["version"]},
                       headers={"CRP-Session": tokens[-1]}).json()
    assert later["changed"] and later["windows"] == 2 and 'id="w2"' in later["html"]
    bad = client.get(url, params={"after": "x"}, headers={"CRP-Session": tokens[-1]})
    assert bad.status_code == 422


def test_view_escapes_document_text_and_hides_server_paths(client, hostile_ckf):
    sid, tokens = run_windows(client, 2)
    html = client.get(f"/ui/api/sessions/{sid}", headers={"CRP-Session": tokens[-1]}
                      ).json()["html"]
    assert any(escape(m) in html for m in MARKUP)
    assert "<script" not in html and "<img" not in html
    assert str(hostile_ckf.parent) not in html


def test_pages_and_api_carry_a_strict_csp(client):
    for path in ("/ui/", "/ui/sessions/abc", "/ui/api/sessions/abc"):
        r = client.get(path)
        csp = r.headers["content-security-policy"]
        assert "default-src 'none'" in csp and "frame-ancestors 'none'" in csp
        assert re.search(r"script-src 'sha256-[A-Za-z0-9+/=]+'", csp), csp
        assert "unsafe-inline" not in csp and "connect-src 'self'" in csp
        assert r.headers["x-content-type-options"] == "nosniff"
    page = client.get("/ui/sessions/abc")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert 'data-live="/ui/api/sessions/abc"' in page.text
    assert client.get("/ui/sessions/a%3Cb").status_code == 422  # ids are [A-Za-z0-9_-]


def test_session_list_is_for_admins(client, ui_dev_gateway):
    r = client.get("/ui/api/sessions")
    assert r.status_code == 403 and "admin" in r.json()["error"]["message"]
    admin = client.get("/ui/api/sessions", headers={"Authorization": f"Bearer {ADMIN_KEY}"})
    assert admin.status_code == 200 and admin.json()["total"] >= 1
    with ui_dev_gateway.client() as dev:
        sid, _ = run_windows(dev, 1)
        listed = dev.get("/ui/api/sessions").json()
        row = next(s for s in listed["sessions"] if s["id"] == sid)
        assert row["task"] == TASK and row["windows"] == 1 and row["status"] == "in-progress"
        assert row["mode"] == "sidecar" and 0 < row["completeness"] <= 1
        # In dev mode every caller is an admin, so views need no token either.
        assert dev.get(f"/ui/api/sessions/{sid}").status_code == 200


def test_page_shells_open_to_a_plain_browser_but_data_needs_a_key(ui_gateway):
    """A browser navigating to the inspector cannot send headers: the shells (which hold no
    data) load without a key, their JSON endpoints still refuse a caller without one."""
    with ui_gateway.client() as anon:
        for path in ("/ui/", "/ui/sessions/abc"):
            r = anon.get(path)
            assert r.status_code == 200, (path, r.text)
            assert "content-security-policy" in r.headers
        assert anon.get("/ui/api/sessions/abc").status_code == 401
        assert anon.get("/ui/api/sessions").status_code == 401
        assert anon.post("/ui/sessions/abc").status_code in (401, 405)
        assert anon.get("/ui/sessions/abc/x").status_code == 401
