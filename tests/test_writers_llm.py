"""The OpenAI-compatible and Anthropic writers (the official SDKs underneath) against a real
HTTP server on loopback (tests/chat_server.py): wire format both ways, streaming, usage,
retries, errors, keys.

Retries and their waits are the SDKs'; what is asserted is what they guarantee and we
configure: how many attempts reach the server, that a `Retry-After` is waited out (the gap
between two arrivals at the server is at least what it asked, longer than the SDK's own first
backoff of at most 0.5 s, so the assertion fails if the header is ignored), and that nothing
is sent again once text went out."""

from __future__ import annotations

import socket

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cdr.errors import InvalidInputError, UpstreamError
from cdr.text.self_repeat import REPETITION
from cdr.text.tokens import count_tokens
from cdr.writers import (
    AnthropicWriter,
    OpenAIWriter,
    StreamInterruptedError,
    WriterResult,
    get_writer,
)
from cdr.writers.base import estimate_prompt_tokens
from tests.chat_server import ChatServer, count_words, digest, pieces

MESSAGES = [
    {"role": "system", "content": "You write one section of a guide."},
    {"role": "user", "content": "Write about the import system and module caching."},
]
EXPECTED = f"Reply {digest(MESSAGES[1]['content'])}. "


@pytest.fixture(scope="module")
def server():
    with ChatServer() as s:
        yield s


@pytest.fixture(autouse=True)
def _fresh(server: ChatServer, monkeypatch: pytest.MonkeyPatch):
    server.reset()
    for var in ("CDR_LLM_API_KEY", "OPENAI_API_KEY", "ANTHROPIC_API_KEY"):
        monkeypatch.delenv(var, raising=False)


# A Retry-After long enough to tell from the SDKs' own first backoff (0.5 s at most).
RETRY_AFTER = 1.2
# A Retry-After short enough to keep retry tests fast.
QUICK = "0.01"


def openai(server: ChatServer, **kw) -> OpenAIWriter:
    return OpenAIWriter(server.openai_base_url, "test-model", **kw)


def anthropic(server: ChatServer, **kw) -> AnthropicWriter:
    kw.setdefault("api_key", "sk-ant-test")
    return AnthropicWriter("claude-test", base_url=server.anthropic_base_url, **kw)


def full_reply(server: ChatServer) -> str:
    return server.reply_for(MESSAGES)


# -- OpenAI round trips ---------------------------------------------------------------------


@pytest.mark.parametrize("stream", [True, False])
def test_openai_round_trip(server: ChatServer, stream: bool) -> None:
    deltas: list[str] = []
    result = openai(server, stream=stream).generate(MESSAGES, 500, on_delta=deltas.append)
    reply = full_reply(server)
    assert reply.startswith(EXPECTED)
    assert result == WriterResult(
        text=reply,
        finish_reason="stop",
        usage={
            "prompt_tokens": count_words(MESSAGES),
            "completion_tokens": len(pieces(reply)),
            "total_tokens": count_words(MESSAGES) + len(pieces(reply)),
        },
    )
    assert "".join(deltas) == result.text
    assert deltas == (pieces(reply) if stream else [reply])


def test_openai_request_wire_format(server: ChatServer) -> None:
    openai(server, api_key="sk-abc", temperature=0.25).generate(MESSAGES, 77)
    (req,) = server.requests
    assert req.path == "/v1/chat/completions"
    assert req.headers["authorization"] == "Bearer sk-abc"
    assert req.body == {
        "model": "test-model",
        "messages": MESSAGES,
        "max_tokens": 77,
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": 0.25,
    }


def test_openai_max_tokens_param_name(server: ChatServer) -> None:
    openai(server, stream=False, max_tokens_param="max_completion_tokens").generate(MESSAGES, 9)
    body = server.requests[0].body
    assert body["max_completion_tokens"] == 9 and "max_tokens" not in body
    assert "stream_options" not in body and "temperature" not in body


@pytest.mark.parametrize("stream", [True, False])
def test_openai_max_tokens_truncates_with_length(server: ChatServer, stream: bool) -> None:
    result = openai(server, stream=stream).generate(MESSAGES, 4)
    # Cut by the limit: the text keeps its complete sentences, the unfinished rest is handed
    # back separately, and together they are what the server sent.
    sent = "".join(pieces(full_reply(server))[:4])
    assert result.text.rstrip() + result.dropped_text == sent
    assert result.text.rstrip().endswith(".") and result.dropped_text.strip()
    assert result.finish_reason == "length"
    assert result.usage["completion_tokens"] == 4


@pytest.mark.parametrize("stream", [True, False])
def test_usage_estimated_when_server_sends_none(server: ChatServer, stream: bool) -> None:
    server.usage = False
    result = openai(server, stream=stream).generate(MESSAGES, 500)
    assert result.text == full_reply(server)
    assert result.usage == {
        "prompt_tokens": estimate_prompt_tokens(MESSAGES),
        "completion_tokens": count_tokens(result.text),
        "total_tokens": estimate_prompt_tokens(MESSAGES) + count_tokens(result.text),
        "estimated": 1,
    }


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(reply=st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=200))
def test_stream_and_whole_agree_on_any_text(server: ChatServer, reply: str) -> None:
    server.reply = reply
    deltas: list[str] = []
    streamed = openai(server).generate(MESSAGES, 10_000, on_delta=deltas.append)
    whole = openai(server, stream=False).generate(MESSAGES, 10_000)
    assert streamed.text == whole.text == reply
    assert "".join(deltas) == reply
    assert streamed.usage == whole.usage


def test_reply_can_depend_on_messages(server: ChatServer) -> None:
    server.reply = lambda messages: f"{len(messages)} messages, last {messages[-1]['role']}"
    assert openai(server).generate(MESSAGES, 50).text == "2 messages, last user"


# -- retries and errors ---------------------------------------------------------------------


@pytest.mark.parametrize("status", [408, 409, 429, 500, 503])
def test_retries_transient_status_then_succeeds(server: ChatServer, status: int) -> None:
    server.fail_next(2, status, retry_after=QUICK)
    result = openai(server).generate(MESSAGES, 500)
    assert result.text == full_reply(server)
    assert len(server.requests) == 3


def test_retry_without_retry_after_uses_the_sdk_backoff(server: ChatServer) -> None:
    server.fail_next(1, 502)
    assert openai(server).generate(MESSAGES, 500).text == full_reply(server)
    assert len(server.requests) == 2


@pytest.mark.parametrize("make", [openai, anthropic])
def test_retry_after_header_is_honoured(server: ChatServer, make) -> None:
    server.fail_next(1, 429, retry_after=RETRY_AFTER)
    assert make(server).generate(MESSAGES, 500).text == full_reply(server)
    first, second = server.requests
    assert second.at - first.at >= RETRY_AFTER


def test_max_retries_bounds_the_attempts(server: ChatServer) -> None:
    server.fail_next(10, 500, retry_after=QUICK)
    with pytest.raises(UpstreamError) as info:
        openai(server, max_retries=0).generate(MESSAGES, 500)
    assert info.value.status == 500 and "gave up after 1 attempt)" in str(info.value)
    assert len(server.requests) == 1


def test_permanent_400_is_not_retried(server: ChatServer) -> None:
    server.fail_next(1, 400, message="context length exceeded by 12 tokens")
    with pytest.raises(UpstreamError) as info:
        openai(server).generate(MESSAGES, 500)
    assert info.value.status == 400
    assert "HTTP 400" in str(info.value)
    assert "context length exceeded by 12 tokens" in str(info.value)
    assert len(server.requests) == 1


def test_wrong_path_404_names_the_url(server: ChatServer) -> None:
    writer = OpenAIWriter(server.url, "test-model")  # forgot the /v1
    with pytest.raises(UpstreamError) as info:
        writer.generate(MESSAGES, 10)
    assert info.value.status == 404
    assert f"{server.url}/chat/completions" in str(info.value)


@pytest.mark.parametrize("stream", [True, False])
def test_exhausted_retries_raise_with_status_and_body(server: ChatServer, stream: bool) -> None:
    server.fail_next(10, 503, message="upstream overloaded, shard 3", retry_after=QUICK)
    with pytest.raises(UpstreamError) as info:
        openai(server, max_retries=2, stream=stream).generate(MESSAGES, 500)
    assert info.value.status == 503
    assert "upstream overloaded, shard 3" in str(info.value)
    assert "after 3 attempts" in str(info.value)
    assert len(server.requests) == 3


@pytest.mark.parametrize("stream", [True, False])
def test_timeout_raises_upstream_error(server: ChatServer, stream: bool) -> None:
    server.hang_next(1, seconds=30)
    with pytest.raises(UpstreamError) as info:
        openai(server, timeout=0.3, max_retries=0, stream=stream).generate(MESSAGES, 500)
    assert info.value.status is None
    assert "0.3 s timeout" in str(info.value)
    assert not isinstance(info.value, StreamInterruptedError)


def test_timeout_is_retried(server: ChatServer) -> None:
    server.hang_next(1, seconds=30)
    result = openai(server, timeout=0.3, max_retries=1).generate(MESSAGES, 500)
    assert result.text == full_reply(server)
    assert len(server.requests) == 2


def test_connection_refused_after_retries() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    writer = OpenAIWriter(f"http://127.0.0.1:{port}/v1", "m", max_retries=2)
    with pytest.raises(UpstreamError) as info:
        writer.generate(MESSAGES, 10)
    assert info.value.status is None
    assert "ConnectError" in str(info.value) and "after 3 attempts" in str(info.value)


@pytest.mark.parametrize("make", [openai, anthropic])
def test_stream_cut_before_any_text_is_an_error(server: ChatServer, make) -> None:
    # The response had begun, so the SDK does not send it again; nothing was delivered, so
    # this is a plain upstream error, not an interrupted stream.
    server.cut_next(1, after=0)
    deltas: list[str] = []
    with pytest.raises(UpstreamError) as info:
        make(server).generate(MESSAGES, 500, on_delta=deltas.append)
    assert not isinstance(info.value, StreamInterruptedError)
    assert "stream ended before" in str(info.value)
    assert deltas == [] and len(server.requests) == 1


@pytest.mark.parametrize("make", [openai, anthropic])
def test_stream_cut_after_text_keeps_partial_and_does_not_retry(server: ChatServer, make) -> None:
    server.cut_next(1, after=3)
    deltas: list[str] = []
    with pytest.raises(StreamInterruptedError) as info:
        make(server).generate(MESSAGES, 500, on_delta=deltas.append)
    assert info.value.partial_text == "".join(pieces(full_reply(server))[:3]) == "".join(deltas)
    assert len(server.requests) == 1


def test_stream_stall_after_text_times_out_with_partial(server: ChatServer) -> None:
    server.hang_next(1, seconds=30, after=2)
    with pytest.raises(StreamInterruptedError) as info:
        openai(server, timeout=0.3, max_retries=3).generate(MESSAGES, 500)
    assert info.value.partial_text == "".join(pieces(full_reply(server))[:2])
    assert "timeout" in str(info.value)
    assert len(server.requests) == 1


def test_on_delta_exception_propagates_unretried(server: ChatServer) -> None:
    class Stop(Exception):
        pass

    def on_delta(piece: str) -> None:
        raise Stop(piece)

    with pytest.raises(Stop):
        openai(server).generate(MESSAGES, 500, on_delta=on_delta)
    assert len(server.requests) == 1


# -- API keys -------------------------------------------------------------------------------


def test_openai_key_from_env_in_order(server: ChatServer, monkeypatch) -> None:
    server.api_key = "sk-cdr"
    monkeypatch.setenv("OPENAI_API_KEY", "sk-openai")
    monkeypatch.setenv("CDR_LLM_API_KEY", "sk-cdr")
    assert openai(server).generate(MESSAGES, 5).finish_reason == "length"
    monkeypatch.delenv("CDR_LLM_API_KEY")
    server.api_key = "sk-openai"
    openai(server).generate(MESSAGES, 5)
    assert [r.headers["authorization"] for r in server.requests] == [
        "Bearer sk-cdr", "Bearer sk-openai"
    ]


def test_openai_without_key_sends_no_authorization(server: ChatServer) -> None:
    openai(server).generate(MESSAGES, 5)
    assert "authorization" not in server.requests[0].headers


def test_wrong_key_is_401_not_retried(server: ChatServer, monkeypatch) -> None:
    server.api_key = "sk-right"
    monkeypatch.setenv("CDR_LLM_API_KEY", "sk-wrong")
    with pytest.raises(UpstreamError) as info:
        openai(server).generate(MESSAGES, 5)
    assert info.value.status == 401
    assert "check the API key" in str(info.value)
    assert "sk-wrong" not in str(info.value)
    assert len(server.requests) == 1


def test_anthropic_key_from_env(server: ChatServer, monkeypatch) -> None:
    server.api_key = "sk-ant-env"
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-env")
    writer = AnthropicWriter("claude-test", base_url=server.anthropic_base_url)
    assert writer.generate(MESSAGES, 500).text == full_reply(server)
    assert server.requests[0].headers["authorization"] == "Bearer sk-ant-env"


def test_anthropic_without_key_is_rejected_up_front() -> None:
    with pytest.raises(InvalidInputError, match="ANTHROPIC_API_KEY"):
        AnthropicWriter("claude-test")


# -- Anthropic ------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [True, False])
def test_anthropic_round_trip(server: ChatServer, stream: bool) -> None:
    deltas: list[str] = []
    result = anthropic(server, stream=stream).generate(MESSAGES, 500, on_delta=deltas.append)
    reply = full_reply(server)
    n = len(pieces(reply))
    assert result == WriterResult(
        text=reply,
        finish_reason="stop",
        usage={
            "prompt_tokens": count_words(MESSAGES),
            "completion_tokens": n,
            "total_tokens": count_words(MESSAGES) + n,
        },
    )
    assert "".join(deltas) == reply


def test_anthropic_request_wire_format(server: ChatServer) -> None:
    messages = [
        {"role": "system", "content": "Rule one."},
        {"role": "user", "content": "First."},
        {"role": "assistant", "content": "Answer."},
        {"role": "system", "content": "Rule two."},
        {"role": "user", "content": "Second."},
    ]
    anthropic(server, temperature=0.0).generate(messages, 33)
    (req,) = server.requests
    assert req.path == "/v1/messages"
    assert req.headers["authorization"] == "Bearer sk-ant-test"
    assert req.headers["anthropic-version"]  # the SDK's API version
    assert req.body == {
        "model": "claude-test",
        "max_tokens": 33,
        "stream": True,
        "system": "Rule one.\n\nRule two.",
        "temperature": 0.0,
        "messages": [m for m in messages if m["role"] != "system"],
    }


@pytest.mark.parametrize("stream", [True, False])
def test_anthropic_max_tokens_maps_to_length(server: ChatServer, stream: bool) -> None:
    result = anthropic(server, stream=stream).generate(MESSAGES, 3)
    assert result.finish_reason == "length"
    sent = "".join(pieces(full_reply(server))[:3])
    assert result.text.rstrip() + result.dropped_text == sent
    assert result.usage["completion_tokens"] == 3


def test_anthropic_overloaded_529_is_retried(server: ChatServer) -> None:
    server.fail_next(2, 529, retry_after=QUICK)
    result = anthropic(server).generate(MESSAGES, 500)
    assert result.text == full_reply(server)
    assert len(server.requests) == 3


def test_anthropic_permanent_error(server: ChatServer) -> None:
    server.fail_next(1, 400, message="messages: roles must alternate")
    with pytest.raises(UpstreamError) as info:
        anthropic(server).generate(MESSAGES, 500)
    assert info.value.status == 400 and "roles must alternate" in str(info.value)


def test_anthropic_usage_estimated_when_missing(server: ChatServer) -> None:
    server.usage = False
    result = anthropic(server).generate(MESSAGES, 500)
    assert result.usage["estimated"] == 1
    assert result.usage["completion_tokens"] == count_tokens(result.text)


def test_anthropic_needs_a_non_system_message(server: ChatServer) -> None:
    with pytest.raises(InvalidInputError, match="besides the system prompt"):
        anthropic(server).generate([{"role": "system", "content": "only"}], 10)
    assert server.requests == []


# -- bad input and selection ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("messages", "max_tokens", "match"),
    [
        ([], 10, "non-empty list"),
        (MESSAGES, 0, "max_tokens"),
        (MESSAGES, True, "max_tokens"),
        ([{"role": "tool", "content": "x"}], 10, "role 'tool'"),
        ([{"role": "user", "content": None}], 10, "content must be a string"),
        (["hello"], 10, "not a dict"),
    ],
)
def test_bad_requests_rejected_before_sending(server, messages, max_tokens, match) -> None:
    with pytest.raises(InvalidInputError, match=match):
        openai(server).generate(messages, max_tokens)
    assert server.requests == []


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"base_url": "localhost:8000/v1", "model": "m"}, "http"),
        ({"base_url": "http://x/v1", "model": ""}, "model"),
        ({"base_url": "http://x/v1", "model": "m", "timeout": 0}, "timeout"),
        ({"base_url": "http://x/v1", "model": "m", "max_retries": -1}, "max_retries"),
        ({"base_url": "http://x/v1", "model": "m", "max_tokens_param": "tokens"},
         "max_tokens_param"),
    ],
)
def test_bad_openai_settings(kwargs, match) -> None:
    with pytest.raises(InvalidInputError, match=match):
        OpenAIWriter(**kwargs)


def test_get_writer_builds_llm_writers(server: ChatServer) -> None:
    writer = get_writer("openai", base_url=server.openai_base_url, model="m", stream=False)
    assert isinstance(writer, OpenAIWriter) and writer.name == "openai"
    assert writer.generate(MESSAGES, 500).text == full_reply(server)
    writer = get_writer("anthropic", model="c", api_key="k", base_url=server.anthropic_base_url)
    assert isinstance(writer, AnthropicWriter) and writer.name == "anthropic"


def test_get_writer_unknown_name_lists_choices() -> None:
    with pytest.raises(InvalidInputError) as info:
        get_writer("gpt")
    assert "'gpt'" in str(info.value)
    for name in ("extractive", "openai", "anthropic"):
        assert name in str(info.value)


def test_get_writer_bad_settings() -> None:
    with pytest.raises(InvalidInputError, match="openai writer: bad settings"):
        get_writer("openai", model="m")  # no base_url
    with pytest.raises(InvalidInputError, match="bad settings"):
        get_writer("openai", base_url="http://x/v1", model="m", colour="blue")


def test_no_hand_written_http_in_the_writers() -> None:
    # The SDKs own the transport: no module of the writers or the embedder opens HTTP itself,
    # parses server-sent events or sleeps between attempts.
    import ast
    from pathlib import Path

    import cdr.retrieval.embed
    import cdr.writers

    files = [*Path(cdr.writers.__file__).parent.glob("*.py"), Path(cdr.retrieval.embed.__file__)]
    for path in files:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        imported = {name for node in ast.walk(tree) for name in (
            [a.name for a in node.names] if isinstance(node, ast.Import)
            else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])}
        forbidden = ("httpx", "requests", "urllib", "http", "aiohttp", "cdr.http_retry")
        assert not {n for n in imported if n in forbidden or n.startswith(
            tuple(f + "." for f in forbidden))}, path
        text = path.read_text(encoding="utf-8")
        assert "text/event-stream" not in text and "time.sleep" not in text, path


# -- a model that loops ----------------------------------------------------------------------

LOOP_UNIT = "The tzinfo attribute holds the time zone of the object. "
LOOPING = "## Time zones\n\nAware objects carry a zone. " + LOOP_UNIT * 40


@pytest.mark.parametrize("make", [openai, anthropic])
def test_a_streamed_loop_is_stopped_and_the_text_before_it_kept(server: ChatServer,
                                                                make) -> None:
    """The upstream would go on with its loop and then stall: a writer that did not stop at
    the loop's second copy would run into the stall and fail on its timeout
    (`StreamInterruptedError`); stopped, it keeps the text up to the first copy."""
    server.reply = LOOPING
    server.hang_next(1, seconds=30, after=40)  # the loop is seen at piece 28
    result = make(server, timeout=3, max_retries=0).generate(MESSAGES, 500)
    assert result.finish_reason == REPETITION
    assert result.text == "## Time zones\n\nAware objects carry a zone. " + LOOP_UNIT.rstrip() \
        + "\n"
    assert result.dropped_text.startswith(LOOP_UNIT.strip())
    # the stream ended before the provider's count: estimated from the text, and marked so
    assert result.usage["completion_tokens"] >= len(LOOP_UNIT.split()) * 2
    assert result.usage["estimated"] == 1


def test_a_whole_reply_that_loops_is_cut_the_same_way(server: ChatServer) -> None:
    server.reply = LOOPING
    streamed = openai(server).generate(MESSAGES, 500)
    whole = openai(server, stream=False).generate(MESSAGES, 500)
    assert whole.finish_reason == streamed.finish_reason == REPETITION
    assert whole.text == streamed.text
    # the whole reply was written (and paid for) before it could be cut
    assert whole.usage["completion_tokens"] == len(pieces(LOOPING))
