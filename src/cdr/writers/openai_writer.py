"""Writer for any OpenAI-compatible chat-completions server (OpenAI, vLLM, Ollama, llama.cpp,
LM Studio, the cdr gateway).

Spoken over plain httpx rather than the `openai` package: the wire format is small, and owning
it keeps retries, timeouts and error messages the same across providers and keeps the
dependency out of the core install.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from cdr.errors import UpstreamError
from cdr.writers.base import (
    HttpChatWriter,
    Pieces,
    StreamState,
    WriterResult,
    int_fields,
    loads_object,
    mid_stream_error,
)

API_KEY_ENV = ("CDR_LLM_API_KEY", "OPENAI_API_KEY")


def _choice0(chunk: dict[str, Any]) -> dict[str, Any]:
    for choice in chunk.get("choices") or []:
        if isinstance(choice, dict) and choice.get("index", 0) == 0:
            return choice
    return {}


class OpenAIWriter(HttpChatWriter):
    """POSTs to `{base_url}/chat/completions`; `base_url` includes the version path
    (`https://api.openai.com/v1`, `http://127.0.0.1:11434/v1`).

    The key comes from `api_key`, else `CDR_LLM_API_KEY`, else `OPENAI_API_KEY`; with none,
    no Authorization header is sent (local servers need none). Streaming asks for the final
    usage chunk (`stream_options.include_usage`); servers that send no usage get it estimated.
    `max_tokens_param` is for OpenAI's reasoning models, which want `max_completion_tokens`.
    """

    name = "openai"
    path = "/chat/completions"
    api_key_env = API_KEY_ENV

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        timeout: float = 60.0,
        max_retries: int = 4,
        backoff: float = 0.5,
        stream: bool = True,
        temperature: float | None = None,
        *,
        max_backoff: float = 30.0,
        max_tokens_param: str = "max_tokens",
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.max_tokens_param = max_tokens_param
        super().__init__(model=model, base_url=base_url, api_key=api_key,
                         temperature=temperature, timeout=timeout, max_retries=max_retries,
                         backoff=backoff, max_backoff=max_backoff, stream=stream, sleep=sleep)

    def _headers(self, api_key: str | None) -> dict[str, str]:
        headers = {"accept": "application/json, text/event-stream"}
        if api_key:
            headers["authorization"] = f"Bearer {api_key}"
        return headers

    def _payload(self, messages: list[dict[str, str]], max_tokens: int) -> dict[str, Any]:
        payload: dict[str, Any] = {
            "model": self.model,
            "messages": [{"role": m["role"], "content": m["content"]} for m in messages],
            self.max_tokens_param: max_tokens,
            "stream": self.stream,
        }
        if self.stream:
            payload["stream_options"] = {"include_usage": True}
        if self.temperature is not None:
            payload["temperature"] = self.temperature
        return payload

    def _parse_body(self, body: dict[str, Any]) -> WriterResult:
        choice = _choice0(body)
        message = choice.get("message")
        if not isinstance(message, dict):
            raise UpstreamError(
                f"{self.name} writer: {self.url} response has no choices[0].message"
            )
        content = message.get("content")
        return self._result(content if isinstance(content, str) else "",
                            choice.get("finish_reason"), body.get("usage"))

    def _read_event(self, data: str, state: StreamState, emit: Pieces) -> None:
        if data.strip() == "[DONE]":
            state.done = True
            return
        chunk = loads_object(data, f"{self.name} writer: stream chunk")
        error = chunk.get("error")
        if error:
            raise mid_stream_error(self.url, error)
        if chunk.get("usage"):
            state.usage = int_fields(chunk["usage"])
        choice = _choice0(chunk)
        delta = choice.get("delta") or {}
        piece = delta.get("content") if isinstance(delta, dict) else None
        if isinstance(piece, str):
            emit(piece)
        if choice.get("finish_reason"):
            state.finish = choice["finish_reason"]
