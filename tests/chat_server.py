"""A real chat-completions server on 127.0.0.1 for tests: OpenAI and Anthropic wire formats,
deterministic replies, scriptable failures.

It runs uvicorn in a daemon thread on a free loopback port (the socket is bound before the
server starts, so there is no port race). Use it as a context manager::

    from tests.chat_server import ChatServer

    with ChatServer(body="A fixed paragraph.") as server:
        writer = OpenAIWriter(server.openai_base_url, "test-model")
        writer.generate([{"role": "user", "content": "hi"}], 100)

or as a module-scoped pytest fixture (call `server.reset()` between tests)::

    @pytest.fixture(scope="module")
    def server():
        with ChatServer() as s:
            yield s

Endpoints
    POST {url}/v1/chat/completions  (OpenAI; base URL for clients: `server.openai_base_url`)
    POST {url}/v1/messages          (Anthropic; base URL for clients: `server.anthropic_base_url`)
Both honour `stream` (SSE exactly as the real APIs frame it; OpenAI sends the usage chunk
only when `stream_options.include_usage` is true) and validate requests like the real APIs
(400 on malformed messages; Anthropic requires `max_tokens` and the `anthropic-version`
header; with `api_key` set, 401 on a missing or wrong key: OpenAI's as `Authorization:
Bearer`, Anthropic's as `x-api-key` (older SDKs) or `Authorization: Bearer` (the SDK 2.x)).

The reply
    `reply_for(messages)` is the whole reply before truncation. By default it is
    ``f"Reply {digest}. {body}"`` where digest is the first 12 hex digits of the SHA-256 of
    the last user message (see `digest`). Set `server.reply` to a string, or to a function
    of the messages (OpenAI format; for Anthropic the `system` field is passed first as a
    system message) returning a string, to script it. The reply is cut into "tokens" by
    `pieces(text)`: each word with its trailing whitespace. `max_tokens` keeps the first
    max_tokens pieces (finish "length" / "max_tokens"). Streams send one piece per chunk.

Usage (exact, so tests can assert it)
    prompt_tokens = total whitespace-separated words in all message contents (and the
    Anthropic system field); completion_tokens = pieces sent. `server.usage = False` makes
    the server send no usage at all, like servers that do not report it.

Scripted failures (each applies to the next request(s), in the order scripted)
    fail_next(n, status=500, message=None, retry_after=None)  error response, provider format
    hang_next(n, seconds=30, after=None)   stall `seconds` before answering (or, when
        streaming with `after=k`, after sending k pieces), then answer normally; stalls end
        early when the server stops, so a client timeout is the usual way out
    cut_next(n, after=0)   streaming only: send `after` pieces, then end the stream cleanly
        without finish reason or [DONE]/message_stop (a dropped upstream)

Inspection
    `server.requests`: every request received, in order (`RecordedRequest`: path, headers
    with lower-case names, JSON body, arrival time on the monotonic clock). `server.reset()`
    clears requests and scripted failures and restores the reply/usage/api_key defaults given
    to the constructor.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import socket
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

DEFAULT_BODY = (
    "Coverage-differential retrieval gives each window the material it has not yet covered, "
    "so that a long document does not repeat itself."
)

Reply = str | Callable[[list[dict[str, str]]], str] | None


def digest(text: str) -> str:
    """First 12 hex digits of SHA-256(text): the default reply's tag for the last user turn."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]


def pieces(text: str) -> list[str]:
    """How the server splits a reply into tokens; the pieces concatenate to `text`."""
    found = re.findall(r"\s*\S+\s*", text)
    return found if found else ([text] if text else [])


def count_words(messages: list[dict[str, str]]) -> int:
    return sum(len(m["content"].split()) for m in messages)


@dataclass
class RecordedRequest:
    path: str
    headers: dict[str, str]
    body: Any
    at: float = 0.0  # time.monotonic() on arrival: how long a client waited between attempts


@dataclass
class _Action:
    kind: str  # "fail" | "hang" | "cut"
    status: int = 500
    message: str | None = None
    retry_after: str | None = None
    seconds: float = 30.0
    after: int | None = None


@dataclass
class _Answer:
    text: str
    sent: list[str]
    truncated: bool
    prompt_tokens: int
    action: _Action | None = field(default=None)


class ChatServer:
    def __init__(
        self,
        reply: Reply = None,
        *,
        body: str = DEFAULT_BODY,
        usage: bool = True,
        api_key: str | None = None,
        host: str = "127.0.0.1",
    ) -> None:
        self._defaults = (reply, body, usage, api_key)
        self.reply: Reply = reply
        self.body = body
        self.usage = usage
        self.api_key = api_key
        self.host = host
        self.port = 0
        self.requests: list[RecordedRequest] = []
        self._actions: deque[_Action] = deque()
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self.app = self._build_app()

    # -- lifecycle ------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def openai_base_url(self) -> str:
        return f"{self.url}/v1"

    @property
    def anthropic_base_url(self) -> str:
        return self.url

    def start(self) -> ChatServer:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, 0))
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(
            self.app, log_level="warning", access_log=False, lifespan="off",
            timeout_graceful_shutdown=2,
        )
        self._server = uvicorn.Server(config)
        self._stopping.clear()
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [sock]}, daemon=True,
            name=f"chat-server-{self.port}",
        )
        self._thread.start()
        deadline = time.monotonic() + 10.0
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"chat test server did not start on {self.url}")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self._stopping.set()
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10.0)
        self._server = self._thread = None

    def __enter__(self) -> ChatServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- scripting ------------------------------------------------------------------------

    def reset(self) -> None:
        with self._lock:
            self.requests.clear()
            self._actions.clear()
        self.reply, self.body, self.usage, self.api_key = self._defaults

    def fail_next(
        self,
        n: int = 1,
        status: int = 500,
        message: str | None = None,
        retry_after: str | float | None = None,
    ) -> None:
        after = None if retry_after is None else str(retry_after)
        self._script(n, _Action("fail", status=status, message=message, retry_after=after))

    def hang_next(self, n: int = 1, seconds: float = 30.0, after: int | None = None) -> None:
        self._script(n, _Action("hang", seconds=seconds, after=after))

    def cut_next(self, n: int = 1, after: int = 0) -> None:
        self._script(n, _Action("cut", after=after))

    def clear_script(self) -> None:
        """Forget the scripted answers not yet served."""
        with self._lock:
            self._actions.clear()

    def _script(self, n: int, action: _Action) -> None:
        with self._lock:
            self._actions.extend([action] * n)

    def reply_for(self, messages: list[dict[str, str]]) -> str:
        if callable(self.reply):
            return self.reply(messages)
        if isinstance(self.reply, str):
            return self.reply
        last_user = next((m["content"] for m in reversed(messages) if m["role"] == "user"), "")
        return f"Reply {digest(last_user)}. {self.body}"

    # -- internals ------------------------------------------------------------------------

    async def _record(self, request: Request) -> tuple[Any, _Action | None]:
        raw = await request.body()
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        with self._lock:
            headers = {k.lower(): v for k, v in request.headers.items()}
            self.requests.append(
                RecordedRequest(request.url.path, headers, body, time.monotonic()))
            action = self._actions.popleft() if self._actions else None
        return body, action

    async def _pause(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and not self._stopping.is_set():
            await asyncio.sleep(0.02)

    def _answer(
        self, messages: list[dict[str, str]], max_tokens: int | None, action: _Action | None
    ) -> _Answer:
        text = self.reply_for(messages)
        all_pieces = pieces(text)
        sent = all_pieces if max_tokens is None else all_pieces[:max_tokens]
        return _Answer(text, sent, len(sent) < len(all_pieces), count_words(messages), action)

    @staticmethod
    def _bad_messages(messages: Any, roles: tuple[str, ...]) -> str | None:
        if not isinstance(messages, list) or not messages:
            return "messages must be a non-empty array"
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or m.get("role") not in roles:
                return f"messages[{i}].role must be one of {', '.join(roles)}"
            if not isinstance(m.get("content"), str):
                return f"messages[{i}].content must be a string"
        return None

    @staticmethod
    def _bad_max_tokens(value: Any, required: bool) -> str | None:
        if value is None:
            return "max_tokens: field required" if required else None
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            return "max_tokens must be a positive integer"
        return None

    def _build_app(self) -> FastAPI:
        app = FastAPI()

        @app.post("/v1/chat/completions")
        async def chat_completions(request: Request) -> Response:
            body, action = await self._record(request)
            if self.api_key is not None and (
                request.headers.get("authorization") != f"Bearer {self.api_key}"
            ):
                return _openai_error(401, "Incorrect API key provided", "invalid_api_key")
            if action is not None and action.kind == "fail":
                return _openai_error(action.status, action.message, None, action.retry_after)
            if not isinstance(body, dict):
                return _openai_error(400, "request body must be a JSON object")
            problem = self._bad_messages(body.get("messages"), ("system", "user", "assistant"))
            max_tokens = body.get("max_tokens", body.get("max_completion_tokens"))
            problem = problem or self._bad_max_tokens(max_tokens, required=False)
            if not isinstance(body.get("model"), str) or not body["model"]:
                problem = problem or "model: field required"
            if problem:
                return _openai_error(400, problem)
            answer = self._answer(body["messages"], max_tokens, action)
            if action is not None and action.kind == "hang" and (
                action.after is None or not body.get("stream")
            ):
                await self._pause(action.seconds)
            if body.get("stream"):
                include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
                return StreamingResponse(
                    self._openai_stream(body["model"], answer, include_usage),
                    media_type="text/event-stream",
                )
            return JSONResponse(_openai_completion(body["model"], answer, self.usage))

        @app.post("/v1/messages")
        async def messages(request: Request) -> Response:
            body, action = await self._record(request)
            if self.api_key is not None and self.api_key not in (
                    request.headers.get("x-api-key"),
                    request.headers.get("authorization", "").removeprefix("Bearer ")):
                return _anthropic_error(401, "authentication_error", "invalid API key")
            if not request.headers.get("anthropic-version"):
                return _anthropic_error(
                    400, "invalid_request_error", "anthropic-version: header is required"
                )
            if action is not None and action.kind == "fail":
                return _anthropic_error(
                    action.status, _anthropic_error_type(action.status), action.message,
                    action.retry_after,
                )
            if not isinstance(body, dict):
                return _anthropic_error(400, "invalid_request_error", "body must be an object")
            problem = self._bad_messages(body.get("messages"), ("user", "assistant"))
            problem = problem or self._bad_max_tokens(body.get("max_tokens"), required=True)
            system = body.get("system")
            if system is not None and not isinstance(system, str):
                problem = problem or "system must be a string"
            if not isinstance(body.get("model"), str) or not body["model"]:
                problem = problem or "model: field required"
            if problem:
                return _anthropic_error(400, "invalid_request_error", problem)
            chat = ([{"role": "system", "content": system}] if system else []) + body["messages"]
            answer = self._answer(chat, body["max_tokens"], action)
            if action is not None and action.kind == "hang" and (
                action.after is None or not body.get("stream")
            ):
                await self._pause(action.seconds)
            if body.get("stream"):
                return StreamingResponse(
                    self._anthropic_stream(body["model"], answer),
                    media_type="text/event-stream",
                )
            return JSONResponse(_anthropic_message(body["model"], answer, self.usage))

        return app

    async def _stall_or_cut(self, answer: _Answer, index: int) -> bool:
        """Apply a mid-stream action before piece `index`; True means stop the stream here."""
        action = answer.action
        if action is None or action.after != index:
            return False
        if action.kind == "hang":
            await self._pause(action.seconds)
            return False
        return action.kind == "cut"

    async def _openai_stream(
        self, model: str, answer: _Answer, include_usage: bool
    ) -> AsyncIterator[str]:
        def chunk(delta: dict[str, Any], finish: str | None = None) -> str:
            return _sse({
                "id": "chatcmpl-test", "object": "chat.completion.chunk", "created": 0,
                "model": model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            })

        yield chunk({"role": "assistant", "content": ""})
        for i, piece in enumerate(answer.sent):
            if await self._stall_or_cut(answer, i):
                return
            yield chunk({"content": piece})
        if await self._stall_or_cut(answer, len(answer.sent)):
            return
        yield chunk({}, "length" if answer.truncated else "stop")
        if include_usage and self.usage:
            yield _sse({
                "id": "chatcmpl-test", "object": "chat.completion.chunk", "created": 0,
                "model": model, "choices": [], "usage": _openai_usage(answer),
            })
        yield "data: [DONE]\n\n"

    async def _anthropic_stream(self, model: str, answer: _Answer) -> AsyncIterator[str]:
        def event(name: str, data: dict[str, Any]) -> str:
            return f"event: {name}\n" + _sse({"type": name, **data})

        start_usage = {"input_tokens": answer.prompt_tokens, "output_tokens": 1}
        yield event("message_start", {"message": {
            "id": "msg_test", "type": "message", "role": "assistant", "model": model,
            "content": [], "stop_reason": None, "stop_sequence": None,
            "usage": start_usage if self.usage else {},
        }})
        yield event("content_block_start", {
            "index": 0, "content_block": {"type": "text", "text": ""},
        })
        yield event("ping", {})
        for i, piece in enumerate(answer.sent):
            if await self._stall_or_cut(answer, i):
                return
            yield event("content_block_delta", {
                "index": 0, "delta": {"type": "text_delta", "text": piece},
            })
        if await self._stall_or_cut(answer, len(answer.sent)):
            return
        yield event("content_block_stop", {"index": 0})
        yield event("message_delta", {
            "delta": {"stop_reason": "max_tokens" if answer.truncated else "end_turn",
                      "stop_sequence": None},
            "usage": {"output_tokens": len(answer.sent)} if self.usage else {},
        })
        yield event("message_stop", {})


def _sse(data: dict[str, Any]) -> str:
    return f"data: {json.dumps(data)}\n\n"


def _openai_usage(answer: _Answer) -> dict[str, int]:
    completion = len(answer.sent)
    return {
        "prompt_tokens": answer.prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": answer.prompt_tokens + completion,
    }


def _openai_completion(model: str, answer: _Answer, usage: bool) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": "chatcmpl-test", "object": "chat.completion", "created": 0, "model": model,
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": "".join(answer.sent)},
            "finish_reason": "length" if answer.truncated else "stop",
        }],
    }
    if usage:
        out["usage"] = _openai_usage(answer)
    return out


def _anthropic_message(model: str, answer: _Answer, usage: bool) -> dict[str, Any]:
    return {
        "id": "msg_test", "type": "message", "role": "assistant", "model": model,
        "content": [{"type": "text", "text": "".join(answer.sent)}],
        "stop_reason": "max_tokens" if answer.truncated else "end_turn",
        "stop_sequence": None,
        "usage": (
            {"input_tokens": answer.prompt_tokens, "output_tokens": len(answer.sent)}
            if usage else {}
        ),
    }


def _retry_headers(retry_after: str | None) -> dict[str, str]:
    return {} if retry_after is None else {"retry-after": retry_after}


def _openai_error(
    status: int, message: str | None, code: str | None = None, retry_after: str | None = None
) -> JSONResponse:
    error = {
        "message": message or f"test server scripted HTTP {status}",
        "type": "invalid_request_error" if status < 500 else "server_error",
        "code": code,
    }
    return JSONResponse({"error": error}, status_code=status, headers=_retry_headers(retry_after))


def _anthropic_error_type(status: int) -> str:
    return {429: "rate_limit_error", 529: "overloaded_error"}.get(
        status, "api_error" if status >= 500 else "invalid_request_error"
    )


def _anthropic_error(
    status: int, kind: str, message: str | None, retry_after: str | None = None
) -> JSONResponse:
    return JSONResponse(
        {"type": "error",
         "error": {"type": kind, "message": message or f"test server scripted HTTP {status}"}},
        status_code=status,
        headers=_retry_headers(retry_after),
    )
