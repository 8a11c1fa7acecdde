"""Session owners on the PostgreSQL store, across replicas: a session made through one
replica with key A is reachable through the other only with key A or an admin key; key B,
holding A's token, gets the 404 of a missing session on every route, and the row in
PostgreSQL holds A's owner id, never the key (real PostgreSQL, two real `cdr serve`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.gateway_server import GatewayServer, copy_ckf
from tests.pg_server import fresh_schema
from tests.test_gateway_owner_hostile import (
    ADMIN,
    KEY_A,
    SESSION,
    A,
    B,
    key_env,
)

pytest_plugins = ["tests.gateway_server", "tests.pg_server"]


@pytest.fixture(scope="module")
def replicas(pg_dsn: str, gateway_ckf: Path, tmp_path_factory: pytest.TempPathFactory
             ) -> Iterator[tuple[str, list[GatewayServer]]]:
    root = tmp_path_factory.mktemp("owner-replicas")
    ckf = copy_ckf(gateway_ckf, root / "ckf")
    with fresh_schema(pg_dsn) as dsn:
        servers = []
        for i in range(2):
            tmp = root / f"r{i}"
            tmp.mkdir()
            servers.append(GatewayServer(key_env(tmp, CDR_SESSION_DB=dsn), via_cli=True,
                                         ckf=ckf, workdir=tmp))
        try:
            for s in servers:
                s.start()
            yield dsn, servers
        finally:
            for s in servers:
                s.stop()


def rows(dsn: str) -> list[tuple[str, int, bytes]]:
    import psycopg

    with psycopg.connect(dsn) as conn:
        return [(r[0], r[1], bytes(r[2])) for r in
                conn.execute("SELECT id, version, data FROM cdr_sessions ORDER BY id")]


def test_owner_checks_hold_across_replicas(replicas: tuple[str, list[GatewayServer]]) -> None:
    dsn, (one, two) = replicas
    with httpx.Client(base_url=one.url, timeout=120) as c1, \
            httpx.Client(base_url=two.url, timeout=120) as c2:
        r = c1.post("/v1/sessions", json=SESSION, headers=A)
        assert r.status_code == 201, r.text
        sid, token = r.json()["session_id"], r.json()["token"]
        before = rows(dsn)
        for method, path, body in [("GET", "", None), ("POST", "/envelope", None),
                                   ("POST", "/windows", {"text": "stolen " * 30}),
                                   ("DELETE", "", None)]:
            for c in (c1, c2):
                r = c.request(method, f"/v1/sessions/{sid}{path}", json=body,
                              headers={**B, "CRP-Session": token})
                assert r.status_code == 404, (path, r.text)
                assert r.json()["error"]["message"].startswith(f"session {sid!r} does not exist")
        assert c2.get(f"/ui/api/sessions/{sid}", headers={**B, "CRP-Session": token}
                      ).status_code == 404
        assert rows(dsn) == before
        data = dict((i, d) for i, _, d in rows(dsn))[sid].decode()
        assert KEY_A not in data
        from cdr.gateway.auth import hash_key

        digest = hash_key(KEY_A).removeprefix("sha256:")
        assert f'"owner":"{digest[:16]}"' in data and digest not in data
        # The owner goes on through the other replica; an admin reads it there too.
        env = c2.post(f"/v1/sessions/{sid}/envelope", headers={**A, "CRP-Session": token})
        assert env.status_code == 200, env.text
        assert c1.get(f"/v1/sessions/{sid}", headers={**ADMIN, "CRP-Session": token}
                      ).status_code == 200
