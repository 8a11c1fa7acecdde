"""LangChain integration with real LangChain objects: the retriever bound to a CDR session,
and the whole loop written by langchain-openai's ChatOpenAI talking to a real loopback
OpenAI-compatible server (tests/chat_server.py), whose replies are written from the envelope
it was sent (the extractive writer, server-side), so Stage 8 has real text to verify."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from cdr.window.loop import GenerationConfig
from cdr.writers import get_writer
from tests.chat_server import ChatServer
from tests.conftest import BUILTIN_TYPES_OUTLINE, BUILTIN_TYPES_TASK

if TYPE_CHECKING:
    from cdr.integrations.langchain import CDRLoop, CDRRetriever, LangChainWriter


@pytest.fixture(scope="module", autouse=True)
def langchain_imported() -> None:
    """Imports LangChain (and skips every test when the extra is absent) when this module's
    first test runs, not when pytest collects it: importing `langchain_core` costs about 1 s of
    CPU, and under `make test` each xdist worker collects every module while only one of them
    runs this one."""
    global CDRLoop, CDRRetriever, LangChainWriter
    pytest.importorskip("langchain_core", reason="the langchain extra is not installed "
                        "(pip install 'cdr-retrieval[langchain]')")
    from cdr.integrations.langchain import CDRLoop, CDRRetriever, LangChainWriter


SCORES = {"relevance", "novelty", "residual_pull", "ngram_penalty", "score"}


def from_envelope(messages: list[dict[str, str]]) -> str:
    return get_writer("extractive").generate(messages, 600).text


@pytest.fixture(scope="module")
def server():
    with ChatServer(reply=from_envelope) as s:
        yield s


def chat_openai(server: ChatServer):
    lc_openai = pytest.importorskip("langchain_openai", reason="langchain-openai is not "
                                    "installed (CI installs it with the langchain extra)")
    return lc_openai.ChatOpenAI(base_url=server.openai_base_url, api_key="test-key",
                                model="test-model", max_retries=0, timeout=60)


def test_retriever_hands_out_windows_and_moves_on(types_ckf_path: Path):
    retriever = CDRRetriever.from_ckf(types_ckf_path, outline=BUILTIN_TYPES_OUTLINE,
                                      config=GenerationConfig(max_windows=3, words=3000))
    docs = retriever.invoke(BUILTIN_TYPES_TASK)  # the first query is the task
    assert docs and retriever.session.task == BUILTIN_TYPES_TASK.strip()
    meta = docs[0].metadata
    assert set(meta) >= SCORES and meta["ref"] == "F1" and meta["window"] == 1
    assert meta["source"].endswith(".txt") and docs[0].id == meta["fact_id"]
    assert all(d.metadata["novelty"] == 1.0 for d in docs)  # nothing covered yet
    assert [d.id for d in retriever.invoke("ignored")] == [d.id for d in docs]  # same window
    messages = retriever.messages()
    assert [m.type for m in messages] == ["system", "human"]
    assert "F1" in messages[1].content
    event = retriever.record(from_envelope(retriever.prepared().messages))
    assert event.number == 1 and event.completeness > 0
    second = retriever.invoke("ignored")
    assert second[0].metadata["window"] == 2
    assert min(d.metadata["novelty"] for d in second) < 1.0  # coverage pushes back now
    retriever.record(from_envelope(retriever.prepared().messages))
    with pytest.raises(Exception, match="no envelope is out"):
        retriever.record("text")  # window 3's envelope was never asked for


def test_retriever_async_and_until_done(types_ckf_path: Path):
    retriever = CDRRetriever.from_ckf(types_ckf_path, task=BUILTIN_TYPES_TASK,
                                      outline=BUILTIN_TYPES_OUTLINE,
                                      config=GenerationConfig(max_windows=2, words=3000))

    async def drive() -> list[int]:
        sizes = []
        while not retriever.done:
            docs = await retriever.ainvoke("next")
            sizes.append(len(docs))
            await retriever.arecord(from_envelope(retriever.prepared().messages))
        return sizes

    sizes = asyncio.run(drive())
    assert len(sizes) == 2 and all(sizes)
    assert retriever.invoke("more") == []  # the session has ended
    trace = retriever.trace()
    assert trace["status"] == "limit-reached" and len(trace["windows"]) == 2


def test_loop_with_chat_openai_writes_every_window(types_ckf_path: Path, server: ChatServer):
    server.reset()
    server.reply = from_envelope
    loop = CDRLoop(types_ckf_path, chat_openai(server),
                   GenerationConfig(max_windows=3, words=3000))
    result = loop.invoke({"task": BUILTIN_TYPES_TASK,
                          "outline": BUILTIN_TYPES_OUTLINE.splitlines()})
    assert result["windows"] == len(server.requests) == 3
    assert result["status"] == "limit-reached"
    assert result["document"].startswith(f"# {BUILTIN_TYPES_TASK}")
    sent = server.requests[0].body
    assert sent["model"] == "test-model" and sent["messages"][0]["role"] == "system"
    assert sent.get("max_tokens", sent.get("max_completion_tokens")) == 1024
    windows = result["trace"]["windows"]
    assert windows[-1]["completeness"] > windows[0]["completeness"] > 0
    assert all(w["output"] for w in windows)


def test_loop_async_and_upstream_failure(types_ckf_path: Path, server: ChatServer):
    server.reset()
    server.reply = from_envelope
    loop = CDRLoop(types_ckf_path, chat_openai(server),
                   GenerationConfig(max_windows=2, words=3000))
    task = {"task": BUILTIN_TYPES_TASK, "outline": BUILTIN_TYPES_OUTLINE}

    async def run_then_fail() -> tuple[dict[str, Any], dict[str, Any]]:
        # one event loop for both: the chat model's async client stays bound to the first
        result = await loop.ainvoke(task)
        server.reset()
        server.fail_next(1, status=400, message="bad request from the test")
        return result, await loop.ainvoke(task)

    result, failed_async = asyncio.run(run_then_fail())
    assert result["windows"] == 2 and result["status"] == "limit-reached"
    server.reset()
    server.fail_next(1, status=400, message="bad request from the test")
    failed = loop.invoke(task)
    assert failed["status"] == "upstream-error" and failed["windows"] == 1
    assert "bad request from the test" in failed["trace"]["windows"][0]["error"]
    # the asynchronous run records the failure as the synchronous one does
    assert failed_async["status"] == "upstream-error" and failed_async["windows"] == 1
    assert failed_async["trace"]["windows"][0]["error"] == failed["trace"]["windows"][0]["error"]
    with pytest.raises(Exception, match="input must be the task"):
        loop.invoke(42)


def test_writer_reports_usage_and_finish(server: ChatServer):
    server.reset()
    server.reply = "Six words of text for you."
    writer = LangChainWriter(chat_openai(server))
    result = writer.generate([{"role": "user", "content": "hello there"}], 3)
    assert result.text == "Six words of "
    assert result.finish_reason == "length"
    assert result.usage["completion_tokens"] == 3 and result.usage["prompt_tokens"] == 2


def test_docs_langchain_example_runs(types_ckf_path: Path, server: ChatServer):
    chat_openai(server)  # skips when langchain-openai is absent
    server.reset()
    server.reply = from_envelope
    page = (Path(__file__).resolve().parents[1] / "docs" / "integrations.md").read_text(
        encoding="utf-8")
    block = re.search(r"## LangChain\n.*?```python\n(.*?)```", page, re.S).group(1)
    code = block.replace("print(", "seen.append((")
    code = re.sub(r"seen\.append\(\((.*)\)$", r"seen.append((\1,))", code, flags=re.M)
    seen: list = []
    # The snippet's free names, as its comment says: the CKF and an OpenAI-compatible server.
    names = {"seen": seen, "ckf": str(types_ckf_path), "BASE_URL": server.openai_base_url,
             "API_KEY": "sk-local", "MODEL": "my-model"}
    exec(compile(code, "docs/integrations.md", "exec"), names)
    assert seen[0][0] in ("task-complete", "limit-reached", "ckf-exhausted")
    assert seen[1][0] in ("task-complete", "limit-reached", "ckf-exhausted")
    assert len(server.requests) >= 4


def test_a_citing_loop_returns_its_sources_as_documents(types_ckf_path: Path, server: ChatServer):
    server.reset()
    server.reply = from_envelope  # the prompt asks to cite: the extractive reply cites
    loop = CDRLoop(types_ckf_path, chat_openai(server),
                   GenerationConfig(max_windows=2, words=2000, citations="numbers"))
    result = loop.invoke({"task": BUILTIN_TYPES_TASK,
                          "outline": BUILTIN_TYPES_OUTLINE.splitlines()})
    sources = result["sources"]
    assert sources and [d.metadata["number"] for d in sources] == list(
        range(1, len(sources) + 1))
    envelope = {f["fact_id"] for w in result["trace"]["windows"] for f in w["envelope"]}
    for doc in sources:
        assert doc.id == doc.metadata["fact_id"] in envelope
        assert len(doc.page_content.split()) >= 4 and doc.metadata["title"]
        assert f"[{doc.metadata['number']}]" in result["document"]
    assert "\n## Sources\n" in result["document"]
    spec = CDRLoop(types_ckf_path, chat_openai(server), GenerationConfig(max_windows=1))
    assert spec.invoke(BUILTIN_TYPES_TASK)["sources"] == []
