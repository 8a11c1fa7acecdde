"""A gateway replica SIGKILLed mid-upload does not leave its job `running` forever.

Real parts: `cdr serve` processes sharing one PostgreSQL (jobs table with leases) and one
CKF. Replica A accepts an upload of twelve documents (committed a few facts at a time) and
is killed by PID once some documents are committed and the job is `running`. Replica B,
started after A's lease (2 s) ran out, marks the job failed on start — before any client
asks — with an error saying the lease expired. The documents A committed are in the CKF
once; uploading the same files again through B finishes the job: the committed ones are
recognised unchanged (no fact added twice), the rest are added.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.gateway_server import GatewayServer, base_env, copy_ckf
from tests.pg_server import fresh_schema

pytest_plugins = ["tests.gateway_server", "tests.pg_server"]

LEASE = 2
N_FILES = 12
WORDS = ("harbour", "lantern", "granite", "meadow", "copper", "willow", "falcon", "quartz",
         "orchard", "tundra", "saffron", "glacier", "cobalt", "juniper", "basalt", "heron")


def document(k: int) -> bytes:
    """A markdown file of 30 paragraphs, every sentence unique across files (no fact is
    shared between documents, so per-document fact counts add up)."""
    paras = []
    for i in range(30):
        w = [WORDS[(k * 7 + i * 3 + j) % len(WORDS)] for j in range(6)]
        paras.append(f"Record {k}-{i}: the {w[0]} survey found {w[1]} beside the {w[2]} "
                     f"near marker {k * 100 + i}. Surveyors noted the {w[3]} and the {w[4]} "
                     f"while mapping the {w[5]} district in season {i}.")
    return (f"# Field notes {k}\n\n" + "\n\n".join(paras) + "\n").encode()


FILES = [(f"notes-{k:02d}.md", document(k)) for k in range(N_FILES)]


def upload(server: GatewayServer) -> str:
    r = httpx.post(f"{server.url}/v1/ckf/documents", timeout=120,
                   files=[("file", (n, b, "text/markdown")) for n, b in FILES])
    assert r.status_code == 202, r.text
    return str(r.json()["id"])


def committed_uploads(ckf: Path) -> dict[str, int]:
    """source -> facts, of the uploaded documents committed in the CKF right now."""
    from cdr.ckf.snapshot import CKFSnapshot

    with CKFSnapshot.open(ckf) as snap:
        return {d["source"]: int(d["n_facts"]) for d in snap.documents()
                if d["source"].startswith("upload/")}


def replica(tmp: Path, dsn: str, ckf: Path) -> GatewayServer:
    tmp.mkdir(parents=True, exist_ok=True)
    env = base_env(tmp, CDR_SESSION_DB=dsn, CDR_JOB_LEASE_SECONDS=str(LEASE),
                   CDR_UPLOAD_COMMIT_FACTS="8")
    return GatewayServer(env, via_cli=True, ckf=ckf, workdir=tmp)


@pytest.fixture
def shared(pg_dsn: str, gateway_ckf: Path, tmp_path: Path) -> Iterator[tuple[str, Path]]:
    ckf = copy_ckf(gateway_ckf, tmp_path / "ckf")
    with fresh_schema(pg_dsn) as dsn:
        yield dsn, ckf


def test_a_replica_killed_mid_upload_has_its_job_failed_and_nothing_lost(
        shared: tuple[str, Path], tmp_path: Path) -> None:
    from cdr.gateway.session_store_postgres import PostgresSessionStore

    dsn, ckf = shared
    base_facts = _active_facts(ckf)
    doomed = replica(tmp_path / "a", dsn, ckf).start()
    try:
        job_id = upload(doomed)
        deadline = time.monotonic() + 300
        while True:  # wait until some documents are committed while the job still runs
            assert time.monotonic() < deadline, "the upload never committed a document"
            done = committed_uploads(ckf)
            status = httpx.get(f"{doomed.url}/v1/ckf/jobs/{job_id}", timeout=60).json()
            assert status["status"] in ("queued", "running"), (
                f"the job ended ({status['status']}) before the kill; make it longer")
            if done and status["status"] == "running":
                break
            time.sleep(0.05)
        assert doomed.proc is not None
        os.kill(doomed.proc.pid, signal.SIGKILL)
        doomed.proc.wait(timeout=30)
        killed_at = time.monotonic()
    finally:
        doomed.stop()

    kept = committed_uploads(ckf)  # what A committed before it died
    assert 1 <= len(kept) < N_FILES, kept
    assert all(n >= 20 for n in kept.values()), kept  # whole documents, not parts
    time.sleep(max(0.0, LEASE + 0.5 - (time.monotonic() - killed_at)))

    survivor = replica(tmp_path / "b", dsn, ckf).start()
    try:
        # Failed on B's start, before any client asked.
        with PostgresSessionStore(dsn) as store:
            raw = json.loads(store.job_store().get(job_id).data)
        assert raw["status"] == "failed", raw
        assert raw["error"].startswith("lease_expired:"), raw["error"]
        seen = httpx.get(f"{survivor.url}/v1/ckf/jobs/{job_id}", timeout=60)
        assert seen.status_code == 200 and seen.json()["status"] == "failed"
        assert "upload the same files again" in seen.json()["error"]
        assert committed_uploads(ckf) == kept  # nothing rolled back, nothing added

        again = upload(survivor)
        deadline = time.monotonic() + 300
        while (job := httpx.get(f"{survivor.url}/v1/ckf/jobs/{again}", timeout=60).json()
               )["status"] in ("queued", "running"):
            assert time.monotonic() < deadline, job
            time.sleep(0.2)
    finally:
        survivor.stop()
    assert job["status"] == "succeeded", job
    rep = job["report"]
    assert rep["documents_unchanged"] == len(kept)
    assert rep["documents_new"] == N_FILES - len(kept)
    final = committed_uploads(ckf)
    assert len(final) == N_FILES and all(final[s] == n for s, n in kept.items())
    assert rep["facts_added"] == sum(n for s, n in final.items() if s not in kept)
    # No fact held twice: the active facts are the base plus each document's own, once.
    assert _active_facts(ckf) == base_facts + sum(final.values())


def _active_facts(ckf: Path) -> int:
    from cdr.ckf.snapshot import CKFSnapshot

    with CKFSnapshot.open(ckf) as snap:
        return int(snap.active.sum())
