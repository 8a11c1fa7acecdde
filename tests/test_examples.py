"""The scripts under examples/ run as a user runs them (a subprocess, from another directory)
against the extractive writer, a real gateway or a real loopback OpenAI-compatible server, and
each README or docs snippet is the code of one of them (`mypy --strict` on them is in
tests/test_typing.py, in one run with the package's)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from cdr import EXIT_REASONS
from cdr.writers import get_writer
from tests.chat_server import ChatServer
from tests.gateway_server import OUTLINE, TASK

pytest_plugins = ["tests.gateway_server"]

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
STATUS = "|".join(re.escape(s) for s in EXIT_REASONS)


def run_example(name: str, *args: str, cwd: Path, env: dict[str, str] | None = None
                ) -> list[str]:
    proc = subprocess.run([sys.executable, str(EXAMPLES / name), *args], cwd=cwd,
                          capture_output=True, text=True, timeout=900,
                          env={**os.environ, **(env or {})})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.splitlines()


def readme_regions() -> dict[str, tuple[str, str]]:
    """tag -> (example file, code between its `# [readme: tag]` markers, dedented)."""
    out = {}
    for path in sorted(EXAMPLES.glob("*.py")):
        for m in re.finditer(r"\n *# \[readme: (\w+)\]\n(.*?)\n *# \[/readme\]",
                             path.read_text(encoding="utf-8"), re.S):
            out[m.group(1)] = (path.name, textwrap.dedent(m.group(2)) + "\n")
    return out


def test_every_readme_snippet_is_an_example():
    regions = readme_regions()
    assert set(regions) == {"library", "gateway", "langchain", "llamaindex"}
    # The README shows the library's; the guide pages in docs/ show the others.
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    blocks = [b for page in pages
              for b in re.findall(r"```python\n(.*?)```", page.read_text(), re.S)]
    for tag, (name, code) in regions.items():
        assert any(code in block for block in blocks), f"no page shows {name}'s [{tag}] code"
    readme = (ROOT / "README.md").read_text()
    assert regions["library"][1] in readme


def test_library_loop(tmp_path: Path):
    lines = run_example("library_loop.py", str(tmp_path / "work"), cwd=tmp_path)
    assert 1 <= len(lines) <= 4
    for i, line in enumerate(lines, 1):
        assert re.fullmatch(rf"{i} [01]\.\d\d ({STATUS}|in-progress)", line), line
    assert lines[-1].split()[-1] in EXIT_REASONS
    assert (tmp_path / "work" / "my.ckf").is_dir()


def test_gateway_with_the_openai_client(gateway, tmp_path: Path):
    lines = run_example("gateway_openai.py", gateway.openai_base_url, TASK, *OUTLINE,
                        cwd=tmp_path)
    first = re.fullmatch(rf"status: ({STATUS}) windows: (\d)/3 words: (\d+)", lines[0])
    assert first, lines
    second = re.fullmatch(rf"streamed words: (\d+) final: ({STATUS})", lines[1])
    assert second, lines
    # The extractive writer is deterministic: the streamed document is the same one.
    assert second.group(1) == first.group(3) and int(first.group(3)) > 50
    assert second.group(2) == first.group(1)


def _facts_back(messages: list[dict[str, str]]) -> str:
    return messages[-1]["content"].split("\n", 1)[1]


def _from_envelope(messages: list[dict[str, str]]) -> str:
    return get_writer("extractive").generate(messages, 600).text


def _llm_env(server: ChatServer) -> dict[str, str]:
    return {"CDR_LLM_BASE_URL": server.openai_base_url, "CDR_LLM_MODEL": "test-model",
            "CDR_LLM_API_KEY": "test-key"}


def test_langchain_loop(types_ckf_path: Path, tmp_path: Path):
    pytest.importorskip("langchain_openai", reason="langchain-openai is not installed")
    ckf = shutil.copytree(types_ckf_path, tmp_path / "types.ckf")
    with ChatServer(reply=_from_envelope) as server:
        lines = run_example("langchain_loop.py", str(ckf), cwd=tmp_path, env=_llm_env(server))
        assert len(server.requests) >= 2
        assert all(r.headers["authorization"] == "Bearer test-key" for r in server.requests)
    loop_status, doc_chars = lines[0].split()
    assert loop_status in EXIT_REASONS and int(doc_chars) > 500
    status, windows = lines[1].split()
    assert status in EXIT_REASONS and int(windows) >= 1


def test_llamaindex_rerank(tmp_path: Path):
    pytest.importorskip("llama_index.core", reason="llama-index-core is not installed")
    with ChatServer(reply=_facts_back) as server:
        lines = run_example("llamaindex_rerank.py", cwd=tmp_path, env=_llm_env(server))
        assert server.requests and all(
            r.body["model"] == "test-model" for r in server.requests)
    assert lines[-1] in EXIT_REASONS
