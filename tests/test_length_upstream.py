"""The window capacity with a writer that respects `max_tokens`: a loopback OpenAI-compatible
test server (`tests.chat_server`, not a language model) that writes the window's planned
sections from its facts and is cut at `max_tokens` words. Too few windows cap the document
whatever the knowledge base holds; `--fit-windows` lifts the cap."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cdr.cli import app
from cdr.writers import get_writer
from tests.chat_server import ChatServer
from tests.conftest import BUILTIN_TYPES_TASK

runner = CliRunner()
TOKENS = 150  # the server counts a word as a token


def _planned_text(messages: list[dict[str, str]]) -> str:
    """Each planned section with its facts, uncut: the server's max_tokens does the cutting."""
    return get_writer("extractive").generate(messages, 100_000).text


@pytest.fixture(scope="module")
def server():
    with ChatServer(reply=_planned_text) as s:
        yield s


def _generate(server: ChatServer, ckf: Path, tmp_path: Path, *extra: str) -> dict:
    outline = tmp_path / "o.txt"
    outline.write_text("Numeric types\nSequence types\nText sequence type str\n",
                       encoding="utf-8")
    trace = tmp_path / "t.json"
    res = runner.invoke(app, [
        "generate", BUILTIN_TYPES_TASK, "--ckf", str(ckf), "--outline", str(outline),
        "--writer", "openai", "--llm-base-url", server.openai_base_url,
        "--llm-model", "loopback-test-server", "--words", "1200", "--profile", "spec",
        "--generation-tokens", str(TOKENS), "--trace", str(trace), *extra,
    ], env={"CDR_LLM_API_KEY": "test-key"})
    assert res.exit_code == 0, res.output
    data = json.loads(trace.read_text(encoding="utf-8"))
    data["cli_output"] = " ".join(res.output.split())
    return data


def test_too_few_windows_cap_the_words_and_fit_windows_lifts_the_cap(
        server: ChatServer, types_ckf_path: Path, tmp_path: Path):
    server.reset()
    before = _generate(server, types_ckf_path, tmp_path, "--windows", "2")
    windows = [r for r in server.requests if r.path.endswith("/chat/completions")]
    assert windows and all(r.body["max_tokens"] == TOKENS for r in windows)
    assert before["status"] == "limit-reached" and len(before["windows"]) == 2
    # two windows of 150 words at most: the document cannot reach 1,200 words
    assert before["length"]["delivered"] <= 2 * TOKENS
    assert "warning: --words 1200 is more than 2 window(s)" in before["cli_output"]
    assert "--windows 14" in before["cli_output"]  # 1200 / (150 × 0.577) = 13.9

    server.reset()
    after = _generate(server, types_ckf_path, tmp_path, "--windows", "2", "--fit-windows")
    assert "warning" not in after["cli_output"]
    assert len(after["windows"]) > 2
    assert after["length"]["delivered"] > 2 * TOKENS
    assert after["length"]["score"] > before["length"]["score"]
    assert f"windows {len(after['windows'])}/14" in after["cli_output"]


def test_the_length_contract_delivers_the_words_and_writes_each_section_once(
        server: ChatServer, types_ckf_path: Path, tmp_path: Path):
    """`--length contract`: windows are planned for the owed words at the budget the writer
    carries, a section written whole is not planned again, and the run stops on the band
    (task-complete) well before the 20-window limit."""
    from cdr.text.prompt_format import parse_prompt

    server.reset()
    run = _generate(server, types_ckf_path, tmp_path, "--windows", "20", "--length",
                    "contract")
    assert run["status"] == "task-complete"
    assert run["length"]["within_tolerance"], run["length"]
    assert len(run["windows"]) < 20
    prompts = [parse_prompt(r.body["messages"][-1]["content"]) for r in server.requests
               if r.path.endswith("/chat/completions")]
    plans = [plan for plan, _ in prompts]
    # every packed fact is shown to the writer: none is spent on a section left for later
    for (_, facts), window in zip(prompts, run["windows"], strict=True):
        assert len(facts) == len(window["envelope"]) > 0
    assert len(plans) == len(run["windows"])
    carry = int(TOKENS * 0.577)  # the openai writer's words a token: a language model's
    seen: set[str] = set()
    for plan, window in zip(plans, run["windows"], strict=True):
        assert 0 < sum(p.target_words for p in plan) <= carry
        again = [p.title for p in plan if p.title in seen]
        # a section planned again is the one an earlier window left unfinished: the first of
        # this window's plan, the continuation of where the last window stopped
        assert again in ([], [plan[0].title]), (again, window["number"])
        seen.update(p.title for p in plan)
