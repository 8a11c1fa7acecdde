"""Writer for Anthropic's Messages API, over plain httpx (same retries and errors as the
OpenAI writer; the `anthropic` package is not needed).

Messages arrive in OpenAI's chat format; system messages move to the top-level `system`
field, which is where the Messages API wants them. Finish reasons are translated to OpenAI's
words so the loop reads one vocabulary.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from cdr.errors import InvalidInputError, UpstreamError
from cdr.writers.base import (
    HttpChatWriter,
    Pieces,
    StreamState,
    WriterResult,
    int_fields,
    loads_object,
    mid_stream_error,
)

API_KEY_ENV = ("CDR_LLM_API_KEY", "ANTHROPIC_API_KEY")
ANTHROPIC_VERSION = "2023-06-01"

FINISH_REASONS = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "max_tokens": "length",
    "tool_use": "tool_calls",
}


class AnthropicWriter(HttpChatWriter):
    """POSTs to `{base_url}/v1/messages`.

    The key comes from `api_key`, else `CDR_LLM_API_KEY`, else `ANTHROPIC_API_KEY`, and is
    required: the API refuses every request without one, so the mistake is reported at
    construction instead of after a round trip.
    """

    name = "anthropic"
    path = "/v1/messages"
    api_key_env = API_KEY_ENV
    default_finish = "end_turn"
    finish_reasons = FINISH_REASONS
    stream_end = "message_stop"

    def __init__(
        self,
        model: str,
        api_key: str | None = None,
        base_url: str = "https://api.anthropic.com",
        timeout: float = 60.0,
        max_retries: int = 4,
        backoff: float = 0.5,
        stream: bool = True,
        temperature: float | None = None,
        *,
        max_backoff: float = 30.0,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        super().__init__(model=model, base_url=base_url, api_key=api_key,
                         temperature=temperature, timeout=timeout, max_retries=max_retries,
                         backoff=backoff, max_backoff=max_backoff, stream=stream, sleep=sleep)

    def _headers(self, api_key: str | None) -> dict[str, str]:
        if not api_key:
            raise InvalidInputError(
                "anthropic writer: no API key; pass api_key or set " + " or ".join(API_KEY_ENV)
            )
        return {
            "x-api-key": api_key,
            "anthropic-version": ANTHROPIC_VERSION,
            "accept": "application/json, text/event-stream",
        }

    def _usage(self, raw: Any) -> dict[str, int]:
        counts = int_fields(raw)
        usage = {k: v for k, v in counts.items() if k.startswith("cache_")}
        if "input_tokens" in counts:
            usage["prompt_tokens"] = counts["input_tokens"]
        if "output_tokens" in counts:
            usage["completion_tokens"] = counts["output_tokens"]
        if "prompt_tokens" in usage and "completion_tokens" in usage:
            usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        return usage

    def _payload(self, messages: list[dict[str, str]], max_tokens: int) -> dict[str, Any]:
        system = [m["content"] for m in messages if m["role"] == "system"]
        turns = [{"role": m["role"], "content": m["content"]} for m in messages
                 if m["role"] != "system"]
        if not turns:
            raise InvalidInputError(
                "anthropic writer: messages need at least one user or assistant message "
                "besides the system prompt"
            )
        payload: dict[str, Any] = {
            "model": self.model,
            "max_tokens": max_tokens,
            "messages": turns,
            "stream": self.stream,
        }
        if system:
            payload["system"] = "\n\n".join(system)
        if self.temperature is not None:
            payload["temperature"] = self.temperature
        return payload

    def _parse_body(self, body: dict[str, Any]) -> WriterResult:
        content = body.get("content")
        if not isinstance(content, list):
            raise UpstreamError(f"{self.name} writer: {self.url} response has no content list")
        text = "".join(
            block.get("text", "")
            for block in content
            if isinstance(block, dict) and block.get("type") == "text"
        )
        return self._result(text, body.get("stop_reason"), body.get("usage"))

    def _read_event(self, data: str, state: StreamState, emit: Pieces) -> None:
        event = loads_object(data, f"{self.name} writer: stream event")
        kind = event.get("type")
        if kind == "message_start":
            message = event.get("message") or {}
            state.usage.update(int_fields(message.get("usage")))
        elif kind == "content_block_delta":
            delta = event.get("delta") or {}
            piece = delta.get("text") if delta.get("type") == "text_delta" else None
            if isinstance(piece, str):
                emit(piece)
        elif kind == "message_delta":
            state.finish = (event.get("delta") or {}).get("stop_reason") or state.finish
            state.usage.update(int_fields(event.get("usage")))  # output_tokens: cumulative
        elif kind == "message_stop":
            state.done = True
        elif kind == "error":
            raise mid_stream_error(self.url, event.get("error") or {})
