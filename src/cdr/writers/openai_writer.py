"""Writer for any OpenAI-compatible chat-completions server (OpenAI, vLLM, Ollama, llama.cpp,
LM Studio, the cdr gateway), through the official `openai` SDK: it owns the HTTP, the
server-sent events, the retries and `Retry-After`, and is maintained against the real API.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import openai

from cdr.errors import InvalidInputError
from cdr.writers.base import WriterResult
from cdr.writers.sdk_chat import SdkChatWriter, StreamState, dump

API_KEY_ENV = ("CDR_LLM_API_KEY", "OPENAI_API_KEY")
MAX_TOKENS_PARAMS = ("max_tokens", "max_completion_tokens")
# The SDK refuses to build a client without a key; local servers need none. With no key the
# client gets this placeholder and every request omits the Authorization header, so the
# placeholder is never sent.
_NO_KEY = "no-key"


def _choice0(chunk: Any) -> Any:
    for choice in getattr(chunk, "choices", None) or []:
        if (getattr(choice, "index", 0) or 0) == 0:
            return choice
    return None


class OpenAIWriter(SdkChatWriter):
    """Chat completions at `{base_url}/chat/completions`; `base_url` includes the version path
    (`https://api.openai.com/v1`, `http://127.0.0.1:11434/v1`).

    The key comes from `api_key`, else `CDR_LLM_API_KEY`, else `OPENAI_API_KEY`; with none,
    no Authorization header is sent (local servers need none). Streaming asks for the final
    usage chunk (`stream_options.include_usage`); servers that send no usage get it estimated.
    `max_tokens_param` is for OpenAI's reasoning models, which want `max_completion_tokens`.
    """

    name = "openai"
    default_base_url = "https://api.openai.com/v1"  # what `build_writer` points it at unless told
    path = "/chat/completions"
    api_key_env = API_KEY_ENV

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        timeout: float = 60.0,
        max_retries: int = 4,
        stream: bool = True,
        temperature: float | None = None,
        *,
        max_tokens_param: str = "max_tokens",
    ) -> None:
        if max_tokens_param not in MAX_TOKENS_PARAMS:
            raise InvalidInputError(
                f"openai writer: max_tokens_param must be one of {', '.join(MAX_TOKENS_PARAMS)},"
                f" got {max_tokens_param!r}")
        self.max_tokens_param = max_tokens_param
        super().__init__(model=model, base_url=base_url, api_key=api_key,
                         temperature=temperature, timeout=timeout, max_retries=max_retries,
                         stream=stream)

    def _sdk(self) -> ModuleType:
        return openai

    def _make_client(self, api_key: str | None) -> openai.OpenAI:
        self._extra_headers: dict[str, Any] = {} if api_key else {"Authorization": openai.omit}
        return openai.OpenAI(api_key=api_key or _NO_KEY, base_url=self.base_url,
                             timeout=self.timeout, max_retries=self.max_retries)

    def _send(self, messages: list[dict[str, str]], max_tokens: int) -> Any:
        options: dict[str, Any] = {self.max_tokens_param: max_tokens}
        if self.stream:
            options["stream_options"] = {"include_usage": True}
        if self.temperature is not None:
            options["temperature"] = self.temperature
        return self._client.chat.completions.create(
            model=self.model,
            messages=[{"role": m["role"], "content": m["content"]} for m in messages],
            stream=self.stream, extra_headers=self._extra_headers, **options)

    def _read_whole(self, reply: Any) -> WriterResult:
        choice = _choice0(reply)
        message = getattr(choice, "message", None)
        if message is None:
            raise self._malformed("choices[0].message")
        content = getattr(message, "content", None)
        return self._result(content if isinstance(content, str) else "",
                            getattr(choice, "finish_reason", None), getattr(reply, "usage", None))

    def _read_event(self, event: Any, state: StreamState) -> str | None:
        usage = getattr(event, "usage", None)
        if usage:
            state.usage = self._usage(dump(usage))
        choice = _choice0(event)
        if choice is None:
            return None
        if getattr(choice, "finish_reason", None):
            state.finish = choice.finish_reason
        piece = getattr(getattr(choice, "delta", None), "content", None)
        return piece if isinstance(piece, str) else None
