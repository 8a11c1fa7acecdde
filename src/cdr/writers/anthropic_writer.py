"""Writer for Anthropic's Messages API, through the official `anthropic` SDK (the
`cdr-retrieval[anthropic]` extra): it owns the HTTP, the server-sent events, the retries and
`Retry-After`, and is maintained against the real API.

Messages arrive in OpenAI's chat format; system messages move to the top-level `system`
field, which is where the Messages API wants them. Finish reasons are translated to OpenAI's
words so the loop reads one vocabulary.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

from cdr.errors import InvalidInputError
from cdr.writers.base import WriterResult, int_fields
from cdr.writers.sdk_chat import SdkChatWriter, StreamState, dump

API_KEY_ENV = ("CDR_LLM_API_KEY", "ANTHROPIC_API_KEY")

FINISH_REASONS = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "max_tokens": "length",
    "tool_use": "tool_calls",
}


class AnthropicWriter(SdkChatWriter):
    """Messages at `{base_url}/v1/messages`.

    The key comes from `api_key`, else `CDR_LLM_API_KEY`, else `ANTHROPIC_API_KEY`, and is
    required: the API refuses every request without one, so the mistake is reported at
    construction instead of after a round trip. `temperature`, when given, is sent as a body
    field the SDK no longer names.
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
        stream: bool = True,
        temperature: float | None = None,
    ) -> None:
        super().__init__(model=model, base_url=base_url, api_key=api_key,
                         temperature=temperature, timeout=timeout, max_retries=max_retries,
                         stream=stream)

    def _sdk(self) -> ModuleType:
        try:
            return importlib.import_module("anthropic")
        except ImportError:
            raise InvalidInputError(
                "anthropic writer: needs the `anthropic` package; install it with "
                "pip install 'cdr-retrieval[anthropic]'") from None

    def _make_client(self, api_key: str | None) -> Any:
        if not api_key:
            raise InvalidInputError(
                "anthropic writer: no API key; pass api_key or set " + " or ".join(API_KEY_ENV))
        return self.sdk.Anthropic(api_key=api_key, base_url=self.base_url,
                                  timeout=self.timeout, max_retries=self.max_retries)

    def _usage(self, raw: Any) -> dict[str, int]:
        counts = int_fields(dump(raw))
        usage = {k: v for k, v in counts.items() if k.startswith("cache_")}
        if "input_tokens" in counts:
            usage["prompt_tokens"] = counts["input_tokens"]
        if "output_tokens" in counts:
            usage["completion_tokens"] = counts["output_tokens"]
        if "prompt_tokens" in usage and "completion_tokens" in usage:
            usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        return usage

    def _send(self, messages: list[dict[str, str]], max_tokens: int) -> Any:
        system = [m["content"] for m in messages if m["role"] == "system"]
        turns = [{"role": m["role"], "content": m["content"]} for m in messages
                 if m["role"] != "system"]
        if not turns:
            raise InvalidInputError(
                "anthropic writer: messages need at least one user or assistant message "
                "besides the system prompt")
        options: dict[str, Any] = {}
        if system:
            options["system"] = "\n\n".join(system)
        if self.temperature is not None:
            # The SDK (2.x) has no `temperature` argument any more; it goes as an extra body
            # field, for the endpoints that still take it.
            options["extra_body"] = {"temperature": self.temperature}
        return self._client.messages.create(model=self.model, max_tokens=max_tokens,
                                            messages=turns, stream=self.stream, **options)

    def _read_whole(self, reply: Any) -> WriterResult:
        content = getattr(reply, "content", None)
        if not isinstance(content, list):
            raise self._malformed("content list")
        text = "".join(getattr(block, "text", "") or "" for block in content
                       if getattr(block, "type", None) == "text")
        return self._result(text, getattr(reply, "stop_reason", None),
                            getattr(reply, "usage", None))

    def _read_event(self, event: Any, state: StreamState) -> str | None:
        kind = getattr(event, "type", None)
        if kind == "message_start":
            state.usage.update(int_fields(dump(getattr(event.message, "usage", None))))
        elif kind == "content_block_delta":
            delta = event.delta
            if getattr(delta, "type", None) == "text_delta":
                piece = getattr(delta, "text", None)
                return piece if isinstance(piece, str) else None
        elif kind == "message_delta":
            state.finish = getattr(event.delta, "stop_reason", None) or state.finish
            # output_tokens: cumulative, so it replaces message_start's
            state.usage.update(int_fields(dump(getattr(event, "usage", None))))
        elif kind == "message_stop":
            state.done = True
        return None
