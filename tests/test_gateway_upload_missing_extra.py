"""A document kind whose optional extra is missing, refused by a real gateway process.

`tests/test_document_kinds.py` checks the refusal in-process, by swapping the PDF entry of the
kinds' registry for one whose module does not exist. Here the server is a real `cdr serve`
subprocess in which pypdf really cannot be imported: a `sitecustomize` first on its
PYTHONPATH marks the module absent (`sys.modules["pypdf"] = None`), so `import pypdf` fails
and `importlib.util.find_spec("pypdf")` (what `DocumentKind.available` asks) answers None, as
on an installation without the `pdf` extra. An upload of a real PDF must get HTTP 415 with a
JSON error naming the kind and the extra, and the knowledge base must not change: not its
facts, not its documents, not its generation on disk, and not through the other files of the
same request either.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cdr.ckf import CKF, ingest
from tests.conftest import write_docs
from tests.gateway_server import SRC, GatewayServer, base_env, child_env
from tests.test_ckf_parse import _pdf

HIDE_PYPDF = ('import sys\n\n'
              '# What an installation without the `pdf` extra sees: no pypdf to import.\n'
              'sys.modules["pypdf"] = None\n')
EXTRA = "pip install 'cdr-retrieval[pdf]'"
DOCS = {  # the knowledge base the server starts with
    "wal.md": "# Write-ahead log\n\nEvery change is written to the log before the data files, "
              "so a crash loses no committed transaction.\n",
    "index.md": "# B-tree indexes\n\nA B-tree index keeps keys sorted, so equality and range "
                "lookups read a few pages instead of the whole table.\n",
}
GUIDE = (b"# Vacuum\n\nVacuum reclaims storage occupied by dead tuples and should run regularly "
         b"on busy tables; autovacuum automates it so that an administrator rarely runs it by "
         b"hand.\n")


def _real_pdf() -> bytes:
    """A PDF this test process can parse (so the server refuses a readable file)."""
    words = GUIDE.decode().split()
    return _pdf([[" ".join(words[i:i + 10]) for i in range(2, len(words), 10)]],
                [("Vacuum", 0)])


def _on_disk(ckf: Path) -> dict[str, Any]:
    """What the store holds, read from its files (not through the server)."""
    with CKF.open(ckf) as index:
        return {"rows": index.n_rows, "generation": index.latest_generation(),
                "documents": sorted(d["source"] for d in index.documents())}


@pytest.fixture(scope="module")
def no_pdf(tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[tuple[GatewayServer, Path, dict[str, str]]]:
    pytest.importorskip("pypdf")  # the test process builds and parses a real PDF
    tmp = tmp_path_factory.mktemp("gateway-no-pdf")
    shim = write_docs(tmp / "shim", {"sitecustomize.py": HIDE_PYPDF})
    ckf = tmp / "kb.ckf"
    with CKF.create(ckf) as index:
        report = ingest(index, [str(write_docs(tmp / "docs", DOCS))])
        assert report.facts_added >= 2 and not report.skipped, report
    env = base_env(tmp, PYTHONPATH=os.pathsep.join([str(shim), str(SRC)]))
    with GatewayServer(env, via_cli=True, ckf=ckf, workdir=tmp) as server:
        yield server, ckf, env


def test_the_servers_environment_really_lacks_pypdf(
        no_pdf: tuple[GatewayServer, Path, dict[str, str]]) -> None:
    """The shim is what the server runs with: there, pypdf does not import and the registry
    calls PDF unavailable; here (no shim) both are the other way round."""
    server, _, env = no_pdf
    probe = ("import cdr.ckf.kinds as k; print(k.REGISTRY['pdf'].available); import pypdf")
    proc = subprocess.run([sys.executable, "-c", probe], env=child_env(env), cwd=server.workdir,
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode != 0 and proc.stdout.split() == ["False"], proc
    assert "No module named 'pypdf'" in proc.stderr or "import of pypdf halted" in proc.stderr
    from cdr.ckf.kinds import REGISTRY

    assert REGISTRY["pdf"].available


def test_a_pdf_upload_is_refused_with_415_naming_the_kind_and_the_extra(
        no_pdf: tuple[GatewayServer, Path, dict[str, str]]) -> None:
    server, ckf, _ = no_pdf
    before_disk = _on_disk(ckf)
    pdf = _real_pdf()
    with server.client() as c:
        before = (c.get("/v1/ckf/stats").json(), c.get("/v1/ckf/documents").json())
        r = c.post("/v1/ckf/documents", files={"file": ("manual.pdf", pdf, "application/pdf")})
        assert r.status_code == 415, r.text
        assert r.headers["content-type"].startswith("application/json")
        err = r.json()["error"]
        assert err["code"] == "unsupported_file_type" and err["param"] == "file"
        assert err["message"] == f"manual.pdf: PDF support needs pypdf: {EXTRA}"
        # A Markdown file in the same request is not ingested either: the request is refused
        # whole, before anything is staged.
        r = c.post("/v1/ckf/documents", files=[
            ("file", ("guide.md", GUIDE, "text/markdown")),
            ("file", ("manual.pdf", pdf, "application/pdf"))])
        assert r.status_code == 415 and EXTRA in r.json()["error"]["message"], r.text
        # An unknown type's refusal lists what this server reads: not .pdf.
        r = c.post("/v1/ckf/documents", files={"file": ("data.xyz", b"text", "text/plain")})
        assert r.status_code == 415, r.text
        supported = r.json()["error"]["message"].partition("supported: ")[2].split(", ")
        assert ".md" in supported and ".pdf" not in supported
        time.sleep(0.5)  # a job wrongly started would have begun committing by now
        assert (c.get("/v1/ckf/stats").json(), c.get("/v1/ckf/documents").json()) == before
    assert _on_disk(ckf) == before_disk


def test_the_same_server_ingests_a_kind_it_can_read(
        no_pdf: tuple[GatewayServer, Path, dict[str, str]]) -> None:
    """The refusal above is the missing extra's, not a server that ingests nothing."""
    server, ckf, _ = no_pdf
    before = _on_disk(ckf)
    with server.client() as c:
        r = c.post("/v1/ckf/documents", files={"file": ("guide.md", GUIDE, "text/markdown")})
        assert r.status_code == 202, r.text
        job = r.json()
        deadline = time.monotonic() + 120
        while job["status"] in ("queued", "running") and time.monotonic() < deadline:
            time.sleep(0.2)
            job = c.get(f"/v1/ckf/jobs/{job['id']}").json()
        assert job["status"] == "succeeded", job
    after = _on_disk(ckf)
    [new] = sorted(set(after["documents"]) - set(before["documents"]))
    assert Path(new).name == "guide.md" and len(after["documents"]) == len(before["documents"]) + 1
    assert after["rows"] > before["rows"] and after["generation"] != before["generation"]
