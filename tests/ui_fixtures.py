"""Fixtures for the report and inspector tests: a CKF whose facts carry hostile markup, real
traces generated from it, and real gateways serving it (one with tokens only, one in dev
mode). Pull them in with `pytest_plugins = ["tests.ui_fixtures"]`.

PYTEST_DONT_REWRITE
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.gateway_server import GatewayServer, base_env, build_ckf, write_topics

# Markup a page must show as text: if any of it ran, window.__pwned would be set.
HOSTILE = [
    "The try statement catches exceptions <script>window.__pwned = 1</script> raised in its "
    "suite, and an except clause names the exception class it handles so that the error does "
    "not propagate.",
    'An except clause <img src="x" onerror="window.__pwned = 2"> may bind the exception '
    "instance to a name with the as keyword, and a finally clause always runs when the try "
    "statement exits.",
]
TRY_OPENING = 'The "try" statement specifies exception handlers'
TRY_HOSTILE = 'The "try" statement <script>window.__pwned = 1</script> specifies exception handlers'
# What a written window may carry from those facts (parsers may drop some inline HTML).
MARKUP = ("<script>window.__pwned = 1</script>", '<img src="x" onerror="window.__pwned = 2">')
HOSTILE_HEADING = "Handling errors <script>window.__pwned = 3</script>"
GENERATE_KEY = "ui-test-generate-key-Kq3v9TzR2mXw"
ADMIN_KEY = "ui-test-admin-key-Hn7pL4cY8sJd2"
TASK = "Write a guide to Python exception handling"
OUTLINE = "The try statement\nRaising exceptions\nThe with statement\n"


def write_hostile_docs(root: Path) -> Path:
    docs = write_topics(root)
    # The top facts for the task's first sub-query carry a script, so the written text does.
    try_doc = docs / "try.txt"
    text = try_doc.read_text(encoding="utf-8")
    assert TRY_OPENING in text, "pydoc's try topic changed: update TRY_OPENING"
    text = text.replace(TRY_OPENING, TRY_HOSTILE, 1)
    # ... and so do the try topic's many "except" clause paragraphs, whichever get written.
    text = text.replace('"except" clause', '"except" clause <script>window.__pwned = 1</script>')
    try_doc.write_text(text, encoding="utf-8")
    body = "\n\n".join(HOSTILE)
    (docs / "hostile.md").write_text(f"# {HOSTILE_HEADING}\n\n{body}\n", encoding="utf-8")
    (docs / "hostile-plain.txt").write_text(body.replace("catches", "traps") + "\n",
                                            encoding="utf-8")
    return docs


@pytest.fixture(scope="session")
def hostile_ckf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hostile-ckf")
    return build_ckf(root / "ckf", write_hostile_docs(root / "docs"))


def run_trace(ckf_path: Path, ranking: str, windows: int = 3) -> dict:
    from cdr.ckf import CKF
    from cdr.trace import build_trace
    from cdr.window.loop import GenerationConfig, Generator
    from cdr.writers import get_writer

    gen = Generator(CKF.open(ckf_path), get_writer("extractive"),
                    GenerationConfig(max_windows=windows, words=600, ranking=ranking,
                                     generation_tokens=400))
    session = gen.start(TASK, OUTLINE)
    events = list(gen.run(TASK, session=session))
    return build_trace(session, events)


@pytest.fixture(scope="session")
def hostile_traces(hostile_ckf: Path, tmp_path_factory: pytest.TempPathFactory
                   ) -> dict[str, Path]:
    """Trace files of the same task ranked by CDR and by relevance only."""
    root = tmp_path_factory.mktemp("traces")
    out = {}
    for ranking in ("cdr", "relevance"):
        path = root / f"trace-{ranking}.json"
        path.write_text(json.dumps(run_trace(hostile_ckf, ranking)), encoding="utf-8")
        out[ranking] = path
    return out


@pytest.fixture(scope="session")
def ui_gateway(hostile_ckf: Path, tmp_path_factory: pytest.TempPathFactory
               ) -> Iterator[GatewayServer]:
    """With API keys (not dev mode): session views need the session's token (and, from the
    auth middleware, a `generate` key); the list needs an admin key."""
    tmp = tmp_path_factory.mktemp("ui-gateway")
    env = {k: v for k, v in base_env(tmp).items() if k != "CDR_DEV"}
    env["CDR_API_KEYS"] = f"generate:{GENERATE_KEY},admin:{ADMIN_KEY}"
    with GatewayServer(env, ckf=hostile_ckf, workdir=tmp) as server:
        yield server


@pytest.fixture(scope="session")
def ui_dev_gateway(hostile_ckf: Path, tmp_path_factory: pytest.TempPathFactory
                   ) -> Iterator[GatewayServer]:
    """Dev mode: every caller is an admin (loopback only)."""
    tmp = tmp_path_factory.mktemp("ui-dev-gateway")
    env = {"CDR_DEV": "1", "CDR_SESSION_DB": str(tmp / "sessions.sqlite3")}
    with GatewayServer(env, ckf=hostile_ckf, workdir=tmp) as server:
        yield server
