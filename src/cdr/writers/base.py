"""The writer contract, and the HTTP plumbing the LLM writers share.

Every writer takes OpenAI-style chat messages and returns text, a finish reason and token
usage, so the window loop never cares who wrote a window. The model-backed writers are built
on `WriterBase` (request checks; usage estimated where none came; a token-limited text cut back
to complete paragraphs) and hand text on through `Pieces`. The HTTP ones are built on
`HttpChatWriter`, which owns what all chat APIs share and what is easy to get wrong: retries
with backoff that honour `Retry-After`, never retrying once text has been handed to the caller
(a retry would duplicate it), the stream's bookkeeping, and errors that carry the upstream
status and body; each provider's module keeps only its wire format.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, runtime_checkable

import httpx

from cdr.errors import InvalidInputError, UpstreamError
from cdr.http_retry import backoff_delay, retry_after_seconds
from cdr.tokens import count_tokens

# Statuses a later attempt can cure: timeouts, lock conflicts, rate limits, overload.
RETRY_STATUSES = frozenset({408, 409, 429})

# Per-message framing tokens in the chat format (OpenAI's published counting recipe); used
# only when a server reports no usage and we have to estimate it.
_TOKENS_PER_MESSAGE = 3
_TOKENS_REPLY_PRIMING = 3

DeltaCallback = Callable[[str], None]


@dataclass
class WriterResult:
    """One window's text.

    `finish_reason` uses OpenAI's words whatever the provider: "stop" (natural end), "length"
    (hit max_tokens); anything else is passed through as the provider said it. `usage` has
    `prompt_tokens`, `completion_tokens`, `total_tokens`, and `estimated: 1` when the server
    sent no usage and the counts come from `cdr.tokens` (cl100k) instead.
    """

    text: str
    finish_reason: str
    usage: dict[str, int]
    # With finish_reason "length": the unfinished last paragraph, cut from `text` so that the
    # window keeps (and Stage 8 credits) only complete paragraphs; the next window continues.
    dropped_text: str = ""


def trim_truncated(result: WriterResult) -> WriterResult:
    """Cut a token-limited text back to its last complete paragraph (`cdr.markdown`)."""
    if result.finish_reason != "length" or result.dropped_text:
        return result
    from cdr.markdown import keep_complete

    result.text, result.dropped_text = keep_complete(result.text)
    return result


@runtime_checkable
class Writer(Protocol):
    """Anything that writes a window from chat messages (role/content dicts)."""

    name: str

    def generate(
        self,
        messages: list[dict[str, str]],
        max_tokens: int,
        *,
        on_delta: DeltaCallback | None = None,
    ) -> WriterResult:
        """Write at most `max_tokens` tokens; `on_delta` gets the text piece by piece as it
        arrives, and the pieces concatenate to the returned text."""
        ...


def pastes_facts(writer: Any) -> bool:
    """Whether `writer` writes by pasting the envelope's facts (grounded by construction, no
    model behind it): the loop then asks it for no outline, fits no plan to a token budget,
    and the gateway cannot pass a request through to it when the knowledge base is empty.
    A writer says so with a class attribute `pastes_facts = True`; any other writes prose."""
    return bool(getattr(writer, "pastes_facts", False))


class StreamInterruptedError(UpstreamError):
    """A stream broke after some text had already reached `on_delta`.

    Not retried: a second attempt would hand the caller the same opening twice. The text
    received so far is in `partial_text`, so the caller can keep it.
    """

    def __init__(self, message: str, status: int | None, partial_text: str) -> None:
        self.partial_text = partial_text
        super().__init__(message, status)


class Pieces:
    """The text one attempt has handed on: each non-empty piece goes to `on_delta` the moment
    it arrives and is kept, so that a later failure knows what the caller already has (and
    must not be given again) and a finished stream's text is exactly what was delivered."""

    def __init__(self, on_delta: DeltaCallback | None) -> None:
        self.parts: list[str] = []
        self._on_delta = on_delta

    def __call__(self, piece: str) -> None:
        if piece:
            self.parts.append(piece)
            if self._on_delta is not None:
                self._on_delta(piece)

    @property
    def text(self) -> str:
        return "".join(self.parts)


class WriterBase:
    """What every model-backed writer does around its own generation: refuse a bad request
    before any work, then finish the result the same way (usage the model did not report is
    estimated; a token-limited text is cut back to complete paragraphs). Subclasses write
    `_generate`, which hands its text piece by piece to `emit`."""

    name = "writer"

    def generate(
        self,
        messages: list[dict[str, str]],
        max_tokens: int,
        *,
        on_delta: DeltaCallback | None = None,
    ) -> WriterResult:
        """Write at most `max_tokens` tokens (the `Writer` protocol)."""
        check_request(messages, max_tokens)
        result = self._generate(messages, max_tokens, on_delta)
        result.usage = complete_usage(result.usage, messages, result.text)
        return trim_truncated(result)

    def _generate(
        self, messages: list[dict[str, str]], max_tokens: int, on_delta: DeltaCallback | None
    ) -> WriterResult:
        raise NotImplementedError


def check_request(messages: list[dict[str, str]], max_tokens: int) -> None:
    """Reject a request no chat API would accept, before spending a network round trip."""
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise InvalidInputError(f"max_tokens must be a positive integer, got {max_tokens!r}")
    if not isinstance(messages, list) or not messages:
        raise InvalidInputError("messages must be a non-empty list of {role, content} dicts")
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise InvalidInputError(f"messages[{i}] is {type(message).__name__}, not a dict")
        role, content = message.get("role"), message.get("content")
        if role not in ("system", "user", "assistant"):
            raise InvalidInputError(
                f"messages[{i}] has role {role!r}; expected system, user or assistant"
            )
        if not isinstance(content, str):
            raise InvalidInputError(f"messages[{i}] content must be a string, got {content!r}")


def estimate_prompt_tokens(messages: list[dict[str, str]]) -> int:
    """cl100k count of a chat prompt, framing included."""
    body = sum(count_tokens(m["content"]) for m in messages)
    return body + _TOKENS_PER_MESSAGE * len(messages) + _TOKENS_REPLY_PRIMING


def complete_usage(
    usage: dict[str, int], messages: list[dict[str, str]], text: str
) -> dict[str, int]:
    """Fill in what the server did not report, and say so with `estimated`."""
    usage = dict(usage)
    if "prompt_tokens" not in usage:
        usage["prompt_tokens"] = estimate_prompt_tokens(messages)
        usage["estimated"] = 1
    if "completion_tokens" not in usage:
        usage["completion_tokens"] = count_tokens(text)
        usage["estimated"] = 1
    if "total_tokens" not in usage or usage.get("estimated"):
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
    return usage


def int_fields(obj: Any) -> dict[str, int]:
    """The integer counters of a usage object (nested detail objects dropped)."""
    if not isinstance(obj, dict):
        return {}
    return {k: v for k, v in obj.items() if isinstance(v, int) and not isinstance(v, bool)}


def iter_sse(lines: Iterable[str]) -> Iterator[tuple[str, str]]:
    """Server-sent events as (event name, data), per the WHATWG event-stream rules that
    matter here: multi-line data, comments, optional space after the colon."""
    event, data = "", []
    for line in lines:
        if not line:
            if data:
                yield event or "message", "\n".join(data)
            event, data = "", []
            continue
        if line.startswith(":"):
            continue
        field, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if field == "data":
            data.append(value)
        elif field == "event":
            event = value
    if data:
        yield event or "message", "\n".join(data)


def error_excerpt(body: str, limit: int = 300) -> str:
    """The human part of an error body: `error.message` when it is JSON, else its start."""
    try:
        payload = json.loads(body)
    except ValueError:
        payload = None
    if isinstance(payload, dict):
        err = payload.get("error")
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            return err["message"][:limit]
        if isinstance(err, str):
            return err[:limit]
    text = " ".join(body.split())
    return text[:limit] + ("…" if len(text) > limit else "") if text else "(empty body)"


def loads_object(data: str, what: str) -> dict[str, Any]:
    try:
        obj = json.loads(data)
    except ValueError:
        raise UpstreamError(f"{what} is not JSON: {error_excerpt(data)}") from None
    if not isinstance(obj, dict):
        raise UpstreamError(f"{what} is not a JSON object: {error_excerpt(data)}")
    return obj


def mid_stream_error(url: str, error: Any) -> TransientError:
    """An error event inside a stream (either API's shape: a message, maybe a numeric code)."""
    detail = error.get("message", error) if isinstance(error, dict) else error
    code = error.get("code") if isinstance(error, dict) else None
    return TransientError(f"{url} sent an error mid-stream: {str(detail)[:300]}",
                          code if isinstance(code, int) else None)


class TransientError(Exception):
    """An attempt failed in a way a later attempt may not (raised by parsers, caught here)."""

    def __init__(self, message: str, status: int | None, retry_after: float | None = None):
        self.message = message
        self.status = status
        self.retry_after = retry_after
        super().__init__(message)


def api_key_from(api_key: str | None, env: tuple[str, ...]) -> str | None:
    """`api_key`, else the first of the `env` variables that is set and not empty."""
    return api_key or next((os.environ[v] for v in env if os.environ.get(v)), None)


@dataclass
class StreamState:
    """What a chat stream has said so far besides its text; a provider's `_read_event` fills
    it in, and `done` says the stream's own end marker has arrived."""

    finish: str | None = None
    usage: dict[str, int] = field(default_factory=dict)
    done: bool = False


class HttpChatWriter(WriterBase):
    """Retry loop, transport and stream bookkeeping for chat APIs; subclasses say how to build
    a request and read a response or stream event, in their provider's wire format.

    `timeout` bounds each network wait (connect, each read): a stream that keeps sending is
    never cut, one that stalls for `timeout` seconds is. `max_retries` extra attempts follow a
    failure that may be transient (connection errors, timeouts, 408/409/429/5xx), after
    `backoff * 2**attempt` seconds (+ up to 25 % jitter so that many clients do not retry in
    step) or the server's `Retry-After`, capped at `max_backoff`.
    """

    name = "http"
    # The provider's words, as data: the endpoint below base_url, the environment variables
    # that may hold its key, the finish reason it means when it names none, its finish
    # reasons in OpenAI's words (others pass through), and the event that ends a stream.
    path = ""
    api_key_env: tuple[str, ...] = ()
    default_finish = "stop"
    finish_reasons: ClassVar[Mapping[str, str]] = {}
    stream_end = "finishing"

    def __init__(
        self,
        *,
        model: str,
        base_url: str,
        api_key: str | None,
        temperature: float | None,
        timeout: float,
        max_retries: int,
        backoff: float,
        max_backoff: float,
        stream: bool,
        sleep: Callable[[float], None],
    ) -> None:
        if not isinstance(model, str) or not model.strip():
            raise InvalidInputError(f"{self.name} writer: model must be a non-empty string")
        if not isinstance(base_url, str) or not base_url.strip():
            raise InvalidInputError(f"{self.name} writer: base_url must be a non-empty URL")
        headers = self._headers(api_key_from(api_key, self.api_key_env))
        self.model = model
        self.temperature = temperature
        self.base_url = base_url.strip().rstrip("/")
        url = f"{self.base_url}{self.path}"
        if not url.startswith(("http://", "https://")):
            raise InvalidInputError(
                f"{self.name} writer: base URL must start with http:// or https://, got {url!r}"
            )
        if not timeout > 0:
            raise InvalidInputError(f"{self.name} writer: timeout must be > 0, got {timeout!r}")
        if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
            raise InvalidInputError(
                f"{self.name} writer: max_retries must be an integer >= 0, got {max_retries!r}"
            )
        if not backoff >= 0 or not max_backoff >= 0:
            raise InvalidInputError(f"{self.name} writer: backoff times must be >= 0")
        self.url = url
        self.timeout = float(timeout)
        self.max_retries = max_retries
        self.backoff = float(backoff)
        self.max_backoff = float(max_backoff)
        self.stream = bool(stream)
        self._sleep = sleep
        self._client = httpx.Client(timeout=self.timeout, headers=headers)

    # -- subclass hooks: the provider's wire format ---------------------------------------

    def _headers(self, api_key: str | None) -> dict[str, str]:
        raise NotImplementedError

    def _payload(self, messages: list[dict[str, str]], max_tokens: int) -> dict[str, Any]:
        raise NotImplementedError

    def _parse_body(self, body: dict[str, Any]) -> WriterResult:
        raise NotImplementedError

    def _read_event(self, data: str, state: StreamState, emit: Pieces) -> None:
        """Take one stream event's data: text to `emit`, the rest into `state`."""
        raise NotImplementedError

    def _usage(self, raw: Any) -> dict[str, int]:
        """The provider's usage object in OpenAI's names."""
        return int_fields(raw)

    # -- shared -----------------------------------------------------------------------------

    def _result(self, text: str, finish: str | None, usage: Any) -> WriterResult:
        """A reply in OpenAI's vocabulary, whether it came whole or streamed."""
        finish = finish or self.default_finish
        return WriterResult(
            text=text,
            finish_reason=self.finish_reasons.get(finish, finish),
            usage=self._usage(usage),
        )

    def _parse_stream(self, events: Iterator[tuple[str, str]], emit: Pieces) -> WriterResult:
        state = StreamState()
        for _event, data in events:
            self._read_event(data, state, emit)
            if state.done:
                break
        if not state.done and state.finish is None:
            raise TransientError(f"{self.url} stream ended before {self.stream_end}", None)
        return self._result(emit.text, state.finish, state.usage)

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> HttpChatWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _generate(
        self, messages: list[dict[str, str]], max_tokens: int, on_delta: DeltaCallback | None
    ) -> WriterResult:
        payload = self._payload(messages, max_tokens)
        attempts = self.max_retries + 1
        last: TransientError | None = None
        for attempt in range(attempts):
            emit = Pieces(on_delta)
            try:
                return self._attempt(payload, emit)
            except TransientError as err:
                if emit.parts:
                    raise StreamInterruptedError(
                        f"{self.name} writer: {err.message}, after {len(emit.parts)} pieces of "
                        "text were already delivered (not retried)",
                        err.status,
                        emit.text,
                    ) from None
                last = err
                if attempt + 1 < attempts:
                    self._sleep(self._delay(attempt, err.retry_after))
        assert last is not None
        raise UpstreamError(
            f"{self.name} writer: {last.message} (gave up after {attempts} attempt"
            f"{'s' if attempts > 1 else ''})",
            last.status,
        )

    def _delay(self, attempt: int, retry_after: float | None) -> float:
        return backoff_delay(attempt, self.backoff, self.max_backoff, retry_after)

    def _attempt(self, payload: dict[str, Any], emit: Pieces) -> WriterResult:
        try:
            if self.stream:
                with self._client.stream("POST", self.url, json=payload) as response:
                    if response.status_code >= 300:
                        response.read()
                        self._fail(response)
                    if response.headers.get("content-type", "").startswith("application/json"):
                        # A server that ignores `stream` answers in one piece; take it.
                        response.read()
                        return self._whole(response, emit)
                    return self._parse_stream(iter_sse(response.iter_lines()), emit)
            response = self._client.post(self.url, json=payload)
            if response.status_code >= 300:
                self._fail(response)
            return self._whole(response, emit)
        except httpx.TimeoutException as err:
            raise TransientError(
                f"no answer from {self.url} within the {self.timeout:g} s timeout "
                f"({type(err).__name__})",
                None,
            ) from None
        except httpx.TransportError as err:
            raise TransientError(
                f"connection to {self.url} failed ({type(err).__name__}: {err})", None
            ) from None

    def _whole(self, response: httpx.Response, emit: Pieces) -> WriterResult:
        body = loads_object(response.text, f"{self.name} writer: {self.url} response")
        result = self._parse_body(body)
        emit(result.text)
        return result

    def _fail(self, response: httpx.Response) -> None:
        status = response.status_code
        message = f"{self.url} answered HTTP {status}: {error_excerpt(response.text)}"
        if status in RETRY_STATUSES or status >= 500:
            raise TransientError(message, status, retry_after_seconds(response.headers))
        if status in (401, 403):
            message += " (check the API key)"
        raise UpstreamError(f"{self.name} writer: {message}", status)
