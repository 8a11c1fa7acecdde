"""Isolation between two tenants on one real `cdr serve` (property test).

Two KBs, `kbalpha` and `kbbeta`, each with a `generate` key and an `admin` key that reach
only their own KB. Each tenant made a live session, a session it then deleted (its token is
still validly signed), an upload job and a document. Hypothesis then drives one tenant's keys
through every route with the other tenant's ids and stolen tokens and compares each answer
with the answer for something that does not exist: the other tenant's deleted session, a
random job or document id, a KB name nobody serves. They must be identical (status and body,
the id named in the message aside), and after it all, nothing of either tenant has changed.
"""

from __future__ import annotations

import json
import sqlite3
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cdr.gateway.auth import hash_key
from tests.gateway_server import OUTLINE, SECRET, TASK, copy_ckf
from tests.kb_server import KbServer

pytest_plugins = ["tests.gateway_server", "tests.kb_server"]

NAMES = ("kbalpha", "kbbeta")
NOPE = "kbnope"
KEYS = {
    ("kbalpha", "generate"): "cdr_alpha_gen_Hq7vR2mX9pL4wT6yK1nB8cJ3d",
    ("kbalpha", "admin"): "cdr_alpha_adm_Wm3xQ8rT1vY6uN9oP2kL5hG7f",
    ("kbbeta", "generate"): "cdr_beta_gen_Jp5tY2wQ9mR7uK1oL4nH8gF3dS",
    ("kbbeta", "admin"): "cdr_beta_adm_Tz4rE8wQ1yU6iO3pA9sD2fG7hJ",
}
SESSION = {"task": TASK, "outline": OUTLINE, "words": 300, "window_tokens": 300,
           "max_windows": 3}


@dataclass
class Tenant:
    kb: str
    sid: str  # live
    token: str
    gone: str  # deleted; its token is still validly signed
    gone_token: str
    job: str
    doc: str


def auth(kb: str, scope: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS[(kb, scope)]}"}


def _tenant(c: httpx.Client, kb: str) -> Tenant:
    gen = auth(kb, "generate")
    made = []
    for _ in range(2):
        r = c.post(f"/v1/kbs/{kb}/sessions", json=SESSION, headers=gen)
        assert r.status_code == 201, r.text
        made.append((r.json()["session_id"], r.json()["token"]))
    (sid, token), (gone, gone_token) = made
    env = c.post(f"/v1/kbs/{kb}/sessions/{sid}/envelope", headers={**gen, "CRP-Session": token})
    assert env.status_code == 200, env.text
    token = env.json()["token"]
    assert c.delete(f"/v1/kbs/{kb}/sessions/{gone}",
                    headers={**gen, "CRP-Session": gone_token}).status_code == 200
    adm = auth(kb, "admin")
    r = c.post(f"/v1/kbs/{kb}/documents", headers=adm, files={
        "file": (f"{kb}.md", f"# {kb}\n\nThe {kb} team keeps its own notes here.\n".encode()
                 * 5)})
    assert r.status_code == 202, r.text
    job = r.json()["id"]
    deadline = time.monotonic() + 120
    while c.get(f"/v1/kbs/{kb}/jobs/{job}", headers=adm).json()["status"] in ("queued",
                                                                             "running"):
        assert time.monotonic() < deadline
        time.sleep(0.2)
    docs = c.get(f"/v1/kbs/{kb}/documents", headers=gen).json()["documents"]
    return Tenant(kb, sid, token, gone, gone_token, job, docs[0]["doc_id"])


@pytest.fixture(scope="module")
def world(gateway_ckf: Path, hr_ckf: Path, tmp_path_factory: pytest.TempPathFactory
          ) -> Iterator[tuple[KbServer, dict[str, Tenant]]]:
    tmp = tmp_path_factory.mktemp("gateway-isolation")
    keys = ",".join(f"{scope}@{kb}:{hash_key(key)}" for (kb, scope), key in KEYS.items())
    env = {"CDR_SIGNING_SECRET": SECRET, "CDR_API_KEYS": keys,
           "CDR_SESSION_DB": str(tmp / "sessions.sqlite3")}
    args = ["--kb", f"kbalpha={copy_ckf(gateway_ckf, tmp / 'a')}",
            "--kb", f"kbbeta={copy_ckf(hr_ckf, tmp / 'b')}"]
    with KbServer(env, args, tmp) as server, server.client() as c:
        yield server, {kb: _tenant(c, kb) for kb in NAMES}


def snapshot(server: KbServer) -> dict[str, Any]:
    """Everything a tenant owns, as stored and as its own keys see it."""
    with sqlite3.connect(Path(server.env["CDR_SESSION_DB"])) as conn:
        rows = conn.execute("SELECT id, version, data FROM sessions ORDER BY 1").fetchall()
    out: dict[str, Any] = {"sessions": rows}
    with server.client() as c:
        for kb in NAMES:
            out[kb] = (c.get(f"/v1/kbs/{kb}/documents", headers=auth(kb, "admin")).json(),
                       c.get(f"/v1/kbs/{kb}/stats", headers=auth(kb, "admin")).json())
    return out


ROUTES = ("trace", "envelope", "window", "delete", "inspect", "stats", "documents", "job",
          "delete_doc", "upload", "create", "chat", "model")


def request_for(route: str, kb: str, sid: str, token: str, job: str, doc: str,
                text: str) -> tuple[str, str, dict[str, Any]]:
    """(method, path, httpx keyword arguments) of one call on `route`."""
    s = f"/v1/kbs/{kb}/sessions/{sid}"
    tok = {"CRP-Session": token}
    return {
        "trace": ("GET", s, {"headers": tok}),
        "envelope": ("POST", f"{s}/envelope", {"headers": tok}),
        "window": ("POST", f"{s}/windows", {"headers": tok, "json": {"text": text or "x"}}),
        "delete": ("DELETE", s, {"headers": tok}),
        "inspect": ("GET", f"/ui/api/sessions/{sid}", {"headers": tok}),
        "stats": ("GET", f"/v1/kbs/{kb}/stats", {}),
        "documents": ("GET", f"/v1/kbs/{kb}/documents", {}),
        "job": ("GET", f"/v1/kbs/{kb}/jobs/{job}", {}),
        "delete_doc": ("DELETE", f"/v1/kbs/{kb}/documents/{doc}", {}),
        "upload": ("POST", f"/v1/kbs/{kb}/documents",
                   {"files": {"file": ("planted.md", b"# P\n\nPlanted by another team.\n" * 5)}}),
        "create": ("POST", f"/v1/kbs/{kb}/sessions", {"json": SESSION}),
        "chat": ("POST", "/v1/chat/completions",
                 {"json": {"model": f"cdr/{kb}", "messages": [{"role": "user", "content": TASK}],
                           "crp": {**SESSION, "max_windows": 1, "outline": OUTLINE}}}),
        "model": ("GET", f"/v1/models/cdr/{kb}", {}),
    }[route]


def call(c: httpx.Client, key: dict[str, str], req: tuple[str, str, dict[str, Any]]
         ) -> httpx.Response:
    method, path, kw = req
    kw = dict(kw)
    kw["headers"] = {**key, **kw.get("headers", {})}
    return c.request(method, path, **kw)


def same(r: httpx.Response, baseline: httpx.Response, swaps: dict[str, str]) -> None:
    text = r.text
    for real, fake in swaps.items():
        text = text.replace(real, fake)
    assert r.status_code == baseline.status_code, (r.text, baseline.text)
    assert r.status_code >= 400, r.text  # nothing of the other tenant is ever served
    assert json.loads(text) == baseline.json()


@settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck))
@given(attacker=st.sampled_from(NAMES), scope=st.sampled_from(("generate", "admin")),
       route=st.sampled_from(ROUTES), own_token=st.booleans(),
       text=st.text(max_size=40))
def test_nothing_of_one_tenant_reaches_the_other(
        world: tuple[KbServer, dict[str, Tenant]], attacker: str, scope: str, route: str,
        own_token: bool, text: str) -> None:
    server, tenants = world
    me = tenants[attacker]
    victim = tenants[NAMES[1 - NAMES.index(attacker)]]
    key = auth(attacker, scope)
    before = snapshot(server)
    fake_job, fake_doc = uuid.uuid4().hex, uuid.uuid4().hex[:12]
    # Through the victim's KB routes, with the victim's ids and stolen tokens (or the
    # attacker's own token, which is bound to another session) ...
    token = me.token if own_token else victim.token
    gone_token = me.token if own_token else victim.gone_token
    real = request_for(route, victim.kb, victim.sid, token, victim.job, victim.doc, text)
    # ... answered exactly as for a KB nobody serves, with ids that do not exist.
    fake = request_for(route, NOPE, victim.gone, gone_token, fake_job, fake_doc, text)
    with server.client() as c:
        same(call(c, key, real), call(c, key, fake),
             {victim.kb: NOPE, victim.sid: victim.gone, victim.job: fake_job,
              victim.doc: fake_doc})
        # Through the attacker's own KB routes, with the victim's session: the answer of
        # the victim's deleted session, there too.
        if route in ("trace", "envelope", "window", "delete"):
            mine = request_for(route, me.kb, victim.sid, token, victim.job, victim.doc, text)
            base = request_for(route, me.kb, victim.gone, gone_token, fake_job, fake_doc,
                               text)
            same(call(c, key, mine), call(c, key, base), {victim.sid: victim.gone})
    after = snapshot(server)
    assert after == before


def test_each_tenant_still_reaches_its_own(world: tuple[KbServer, dict[str, Tenant]]) -> None:
    """The refusals above are not everything refused: each tenant's own calls work."""
    server, tenants = world
    with server.client() as c:
        for t in tenants.values():
            gen = auth(t.kb, "generate")
            r = c.get(f"/v1/kbs/{t.kb}/sessions/{t.sid}", headers={**gen, "CRP-Session": t.token})
            assert r.status_code == 200, r.text
            assert c.get(f"/v1/kbs/{t.kb}/jobs/{t.job}", headers=gen).status_code == 200
            assert c.get(f"/v1/models/cdr/{t.kb}", headers=gen).status_code == 200
            assert c.get(f"/ui/api/sessions/{t.sid}", headers=auth(t.kb, "admin")
                         ).status_code == 200
