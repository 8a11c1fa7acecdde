"""Named knowledge bases on one real `cdr serve`: `--kb NAME=PATH` (repeatable), a TOML file
of KBs, `/v1/kbs/{name}/...` routes, `model: "cdr/<name>"` / `crp.kb` on the relay,
`GET /v1/models` through the official `openai` client, and keys scoped to KBs: a key never
sees another KB's documents, stats, sessions, traces or jobs, and its 404 is the one of a KB
that does not exist."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from openai import OpenAI

from cdr.gateway.auth import hash_key
from tests.gateway_server import OUTLINE, SECRET, TASK, copy_ckf
from tests.kb_server import KbServer

pytest_plugins = ["tests.gateway_server", "tests.kb_server"]

DOCS_KEY = "cdr_docs_Hq7vR2mX9pL4wT6yK1nB8cJ3dF5gS0eZ"
HR_KEY = "cdr_hr_Wm3xQ8rT1vY6uN9oP2kL5hG7fD4sA0cVq"
ADMIN_KEY = "cdr_admin_Jp5tY2wQ9mR7uK1oL4nH8gF3dS6aZ0xB"
HR_ADMIN_KEY = "cdr_hradm_Tz4rE8wQ1yU6iO3pA9sD2fG7hJ5kL0xC"
DOCS = {"Authorization": f"Bearer {DOCS_KEY}"}
HR = {"Authorization": f"Bearer {HR_KEY}"}
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
HR_ADMIN = {"Authorization": f"Bearer {HR_ADMIN_KEY}"}
HR_TASK = "Write a guide to Python classes and imports"
HR_OUTLINE = ["Class definitions", "The import statement"]
SESSION = {"task": TASK, "outline": OUTLINE, "words": 300, "window_tokens": 300,
           "max_windows": 3}
HR_SESSION = {**SESSION, "task": HR_TASK, "outline": HR_OUTLINE}


def keys() -> str:
    return ",".join([f"generate@docs:{hash_key(DOCS_KEY)}", f"generate@hr:{hash_key(HR_KEY)}",
                     f"admin:{hash_key(ADMIN_KEY)}", f"admin@hr:{hash_key(HR_ADMIN_KEY)}"])


@pytest.fixture(scope="module")
def server(gateway_ckf: Path, hr_ckf: Path, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[KbServer]:
    tmp = tmp_path_factory.mktemp("gateway-kbs")
    docs = copy_ckf(gateway_ckf, tmp / "docs")
    hr = copy_ckf(hr_ckf, tmp / "hr")
    env = {"CDR_SIGNING_SECRET": SECRET, "CDR_API_KEYS": keys(),
           "CDR_SESSION_DB": str(tmp / "sessions.sqlite3")}
    with KbServer(env, ["--kb", f"docs={docs}", "--kb", f"hr={hr}"], tmp) as s:
        yield s


def error_of(r: httpx.Response) -> dict[str, Any]:
    assert r.headers["content-type"].startswith("application/json"), r.text
    return dict(r.json()["error"])


def same_404(r: httpx.Response, missing: httpx.Response, name: str, other: str) -> None:
    assert r.status_code == missing.status_code == 404, (r.text, missing.text)
    assert r.json() == json.loads(missing.text.replace(other, name))


def sources(docs: dict[str, Any]) -> set[str]:
    return {d["source"] for d in docs["documents"]}


# ------------------------------------------------------------------ routes per KB


def test_each_kb_has_its_own_documents_and_stats(server: KbServer) -> None:
    with server.client(headers=ADMIN) as c:
        docs = c.get("/v1/kbs/docs/documents")
        hr = c.get("/v1/kbs/hr/documents")
        assert docs.status_code == hr.status_code == 200
        assert sources(docs.json()) and sources(hr.json())
        assert not sources(docs.json()) & sources(hr.json())
        assert any("class" in s for s in sources(hr.json()))
        s_docs, s_hr = c.get("/v1/kbs/docs/stats").json(), c.get("/v1/kbs/hr/stats").json()
        assert s_docs["active_facts"] > s_hr["active_facts"] > 0


def test_a_key_sees_only_its_kbs(server: KbServer) -> None:
    with server.client() as c:
        for path in ("/documents", "/stats", "/jobs/" + "0" * 32):
            r = c.get(f"/v1/kbs/hr{path}", headers=DOCS)
            missing = c.get(f"/v1/kbs/nope{path}", headers=DOCS)
            same_404(r, missing, "hr", "nope")
            assert error_of(r)["code"] == "kb_not_found"
        assert c.get("/v1/kbs/docs/stats", headers=DOCS).status_code == 200
        assert c.get("/v1/kbs/hr/stats", headers=HR).status_code == 200
        # Metrics label by the whole route template, never by a KB name.
        metrics = c.get("/metrics").text
        assert 'route="/v1/kbs/{kb}/stats",status="200"' in metrics
        assert "docs" not in metrics.replace("/documents", "") and '"hr"' not in metrics
        # An admin of hr only: no writes to docs, and docs does not exist for it.
        r = c.post("/v1/kbs/docs/documents", headers=HR_ADMIN,
                   files={"file": ("x.md", b"# X\n\nThe docs knowledge base is not yours.\n" * 5)})
        same_404(r, c.post("/v1/kbs/nope/documents", headers=HR_ADMIN, files={
            "file": ("x.md", b"# X\n\nThe docs knowledge base is not yours.\n" * 5)}),
            "docs", "nope")


def test_uploads_go_to_their_kb_and_jobs_stay_there(server: KbServer) -> None:
    with server.client(headers=HR_ADMIN) as c:
        before_docs = server.client(headers=ADMIN).get("/v1/kbs/docs/stats").json()
        r = c.post("/v1/kbs/hr/documents", files={
            "file": ("handbook.md", b"# Handbook\n\nHolidays are booked through the portal.\n"
                     b"Each team keeps its own calendar of absences.\n" * 4)})
        assert r.status_code == 202, r.text
        job = r.json()["id"]
        assert r.headers["location"] == f"/v1/kbs/hr/jobs/{job}"
        deadline = time.monotonic() + 120
        while (st := c.get(f"/v1/kbs/hr/jobs/{job}").json()["status"]) in ("queued", "running"):
            assert time.monotonic() < deadline
            time.sleep(0.2)
        assert st == "succeeded"
        assert "upload/handbook.md" in sources(c.get("/v1/kbs/hr/documents").json())
    with server.client(headers=ADMIN) as c:
        # The job and the document are hr's: not docs', even for an admin of every KB.
        same_404(c.get(f"/v1/kbs/docs/jobs/{job}"), c.get(f"/v1/kbs/docs/jobs/{'f' * 32}"),
                 job, "f" * 32)
        assert "upload/handbook.md" not in sources(c.get("/v1/kbs/docs/documents").json())
        assert c.get("/v1/kbs/docs/stats").json()["active_facts"] == \
            before_docs["active_facts"]


def test_sessions_live_in_their_kb(server: KbServer) -> None:
    with server.client() as c:
        r = c.post("/v1/kbs/hr/sessions", json=HR_SESSION, headers=HR)
        assert r.status_code == 201, r.text
        sid, token = r.json()["session_id"], r.json()["token"]
        env = c.post(f"/v1/kbs/hr/sessions/{sid}/envelope", headers={**HR, "CRP-Session": token})
        assert env.status_code == 200, env.text
        assert all("class" in f["source"] or "import" in f["source"]
                   for f in env.json()["facts"])
        token = env.json()["token"]
        # Through another KB's routes, even with an admin key for both: not there.
        r = c.get(f"/v1/kbs/docs/sessions/{sid}", headers={**ADMIN, "CRP-Session": token})
        assert r.status_code == 404 and error_of(r)["message"].startswith(
            f"session {sid!r} does not exist")
        assert c.post("/v1/kbs/docs/sessions", json=SESSION, headers=HR).status_code == 404
        ok = c.get(f"/v1/kbs/hr/sessions/{sid}", headers={**ADMIN, "CRP-Session": token})
        assert ok.status_code == 200
        # The inspector: an admin of docs only would not see it; hr's admin does.
        assert c.get(f"/ui/api/sessions/{sid}", headers=HR_ADMIN).status_code == 200
        listed = c.get("/ui/api/sessions", headers=HR_ADMIN).json()["sessions"]
        assert sid in [s["id"] for s in listed]


# ------------------------------------------------------------------ the relay


def test_models_lists_the_kbs_a_key_may_use(server: KbServer) -> None:
    def ids(key: str) -> list[str]:
        client = OpenAI(base_url=server.openai_base_url, api_key=key, max_retries=0)
        return sorted(m.id for m in client.models.list())

    assert ids(DOCS_KEY) == ["cdr/docs"]
    assert ids(HR_KEY) == ["cdr/hr"]
    assert ids(ADMIN_KEY) == ["cdr/docs", "cdr/hr"]
    client = OpenAI(base_url=server.openai_base_url, api_key=HR_KEY, max_retries=0)
    model = client.models.retrieve("cdr/hr")
    assert model.id == "cdr/hr" and model.owned_by == "cdr"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("cdr/docs")


def test_the_model_picks_the_kb(server: KbServer) -> None:
    client = OpenAI(base_url=server.openai_base_url, api_key=ADMIN_KEY, max_retries=0,
                    timeout=120)
    crp = {"outline": HR_OUTLINE, "words": 200, "window_tokens": 300, "max_windows": 1}
    out = client.chat.completions.create(
        model="cdr/hr", messages=[{"role": "user", "content": HR_TASK}], extra_body={"crp": crp})
    sid = out.model_extra["crp"]["session_id"]
    token = out.model_extra["crp"]["token"]
    with server.client(headers={**ADMIN, "CRP-Session": token}) as c:
        trace = c.get(f"/v1/kbs/hr/sessions/{sid}")
        assert trace.status_code == 200, trace.text
        assert c.get(f"/v1/kbs/docs/sessions/{sid}").status_code == 404
    # crp.kb says the same thing; a KB the key does not reach is the unknown model's 404.
    hr = OpenAI(base_url=server.openai_base_url, api_key=HR_KEY, max_retries=0, timeout=120)
    out = hr.chat.completions.create(
        model="cdr", messages=[{"role": "user", "content": HR_TASK}],
        extra_body={"crp": {**crp, "kb": "hr"}})
    assert out.choices[0].message.content
    for model in ("cdr/docs", "cdr/nope"):
        with pytest.raises(openai.NotFoundError) as exc:
            hr.chat.completions.create(model=model,
                                       messages=[{"role": "user", "content": HR_TASK}])
        assert exc.value.body["code"] == "model_not_found"  # type: ignore[index]


# ------------------------------------------------------------------ configuration


def test_old_routes_serve_the_default_kb(gateway_ckf: Path, hr_ckf: Path,
                                         tmp_path: Path) -> None:
    """`--ckf` is the KB named `default`; `/v1/ckf/...` and `/v1/sessions` are its routes."""
    env = {"CDR_SIGNING_SECRET": SECRET, "CDR_API_KEYS": keys() + ","
           + f"generate@default:{hash_key('cdr_dflt_Lk9mN3bV7cX1zQ5wE8rT2yU6')}",
           "CDR_SESSION_DB": str(tmp_path / "s.sqlite3")}
    conf = tmp_path / "kbs.toml"
    conf.write_text('[kbs]\nhr = "hr"\n', encoding="utf-8")
    copy_ckf(hr_ckf, tmp_path / "hr")
    args = ["--ckf", str(gateway_ckf), "--kb-config", str(conf)]
    default_key = {"Authorization": "Bearer cdr_dflt_Lk9mN3bV7cX1zQ5wE8rT2yU6"}
    with KbServer(env, args, tmp_path) as s, s.client() as c:
        old = c.get("/v1/ckf/stats", headers=default_key)
        assert old.status_code == 200
        assert old.json() == c.get("/v1/kbs/default/stats", headers=default_key).json()
        assert c.get("/v1/kbs/hr/stats", headers=HR).status_code == 200  # from the file
        # A key without the default KB: the old routes are a KB it does not have.
        assert c.get("/v1/ckf/stats", headers=HR).status_code == 404
        r = c.post("/v1/sessions", json=SESSION, headers=default_key)
        assert r.status_code == 201, r.text
        sid = r.json()["session_id"]
        tok = {"CRP-Session": r.json()["token"]}
        assert c.get(f"/v1/kbs/default/sessions/{sid}", headers={**default_key, **tok}
                     ).status_code == 200
        assert c.get(f"/v1/kbs/hr/sessions/{sid}", headers={**ADMIN, **tok}).status_code == 404


@pytest.mark.parametrize(("args", "words"), [
    (["--kb", "docs"], "NAME=PATH"),
    (["--kb", "bad/name=/tmp"], "'bad/name'"),
    (["--kb", "a=/x", "--kb", "a=/y"], "twice"),
    (["--ckf", "/x", "--kb", "default=/y"], "twice"),
    (["--kb-config", "/nonexistent/kbs.toml"], "kbs.toml"),
])
def test_bad_kb_options_are_one_line_exit_2(tmp_path: Path, args: list[str], words: str,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The first case in a real `cdr serve` process, the others in this one
    (`cli_in_process`: refused before logging is configured, the same exit and stderr)."""
    import subprocess
    import sys

    from tests.gateway_server import child_env, cli_in_process

    env = {"CDR_DEV": "1", "CDR_SESSION_DB": str(tmp_path / "s.db")}
    if args == ["--kb", "docs"]:
        proc = subprocess.run([sys.executable, "-m", "cdr.cli", "serve", *args],
                              env=child_env(env), cwd=tmp_path, capture_output=True, text=True,
                              timeout=60)
        status, stderr = proc.returncode, proc.stderr
    else:
        status, _, stderr = cli_in_process(tmp_path, ["serve", *args], env, monkeypatch)
    assert status == 2, stderr
    assert len(stderr.strip().splitlines()) == 1 and words in stderr, stderr


def test_bad_kb_config_files(tmp_path: Path) -> None:
    from cdr.gateway.settings import GatewayConfigError, read_kb_config

    for text, words in (('[kbs\n', "not TOML"), ('kbs = 3\n', "[kbs] table"),
                        ('[kbs]\nx = 3\n', "a path"), ('[kbs]\n"a b" = "/x"\n', "'a b'")):
        path = tmp_path / "k.toml"
        path.write_text(text, encoding="utf-8")
        with pytest.raises(GatewayConfigError, match=r"k\.toml") as exc:
            read_kb_config(path)
        assert words in str(exc.value)
    path.write_text('[kbs]\ndocs = "rel/dir"\nray = "ray://10.0.0.1:10001/srv/x"\n',
                    encoding="utf-8")
    assert read_kb_config(path) == {"docs": str(tmp_path / "rel/dir"),
                                    "ray": "ray://10.0.0.1:10001/srv/x"}
