"""What the OpenAI and Anthropic writers share: each provider's official SDK does the HTTP,
the server-sent events, the retries and `Retry-After`; this module configures the client from
the writer's settings, reads the SDK's stream into `Pieces`, and turns the SDK's exceptions
into ours.

What the SDKs guarantee and we rely on: a request is retried (`max_retries` times) on a
connection error, a timeout, or HTTP 408/409/429/5xx, never once the response has begun, and
the wait between attempts is the server's `retry-after-ms` / `Retry-After` when it sends one,
else an exponential backoff with jitter (0.5 s doubling, capped at 8 s). So a stream that
breaks after its first piece of text is not sent again, and the text the caller already has is
handed back in `StreamInterruptedError.partial_text`.

The messages name the upstream URL and quote its error text for the operator's log; the
gateway passes clients only a redacted summary (`cdr.gateway.redact`), which reads the shapes
written here ("answered HTTP N: …", "gave up after N attempts", "timeout", "connection …
failed", "already delivered").
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, ClassVar

import httpx2

from cdr.errors import InvalidInputError, UpstreamError
from cdr.sdk_client import SdkClientOwner, check_max_retries
from cdr.text.self_repeat import REPETITION
from cdr.writers.base import (
    DeltaCallback,
    Pieces,
    StreamInterruptedError,
    WriterBase,
    WriterResult,
    api_key_from,
    error_excerpt,
    int_fields,
)

# The statuses the SDKs retry (their documented policy); used only to word the message of the
# error left when they gave up.
RETRIED_STATUSES = frozenset({408, 409, 429})


def retried(status: int) -> bool:
    """Whether the SDKs retry an answer with this status."""
    return status in RETRIED_STATUSES or status >= 500


def attempts_made(request: Any) -> int | None:
    """How many attempts the SDK made, read from the retry counter it sends with each one
    (`x-stainless-retry-count`); None when the request does not say."""
    headers = getattr(request, "headers", None)
    count = headers.get("x-stainless-retry-count") if headers is not None else None
    try:
        return int(count) + 1 if count is not None else None
    except ValueError:
        return None


def gave_up(attempts: int | None) -> str:
    if attempts is None:
        return ""
    return f" (gave up after {attempts} attempt{'s' if attempts != 1 else ''})"


@dataclass
class StreamState:
    """What a stream has said so far besides its text; `done` says its end event arrived."""

    finish: str | None = None
    usage: dict[str, int] = field(default_factory=dict)
    done: bool = False


class SdkChatWriter(WriterBase, SdkClientOwner):
    """A chat writer whose transport is a provider's official SDK client.

    `timeout` bounds each network wait (connect, each read): a stream that keeps sending is
    never cut, one that stalls for `timeout` seconds is. `max_retries` is the SDK's: extra
    attempts after a failure that may be transient, before any of the response was read.
    Subclasses say how to build the client, send a request and read a reply or stream event.
    """

    name = "sdk"
    # The provider's words, as data: the environment variables that may hold its key, the
    # finish reason it means when it names none, its finish reasons in OpenAI's words (others
    # pass through), and what ends its stream (for the error when a stream stops early).
    api_key_env: tuple[str, ...] = ()
    path = ""
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
        stream: bool,
    ) -> None:
        if not isinstance(model, str) or not model.strip():
            raise InvalidInputError(f"{self.name} writer: model must be a non-empty string")
        if not isinstance(base_url, str) or not base_url.strip():
            raise InvalidInputError(f"{self.name} writer: base_url must be a non-empty URL")
        self.base_url = base_url.strip().rstrip("/")
        self.url = f"{self.base_url}{self.path}"
        if not self.url.startswith(("http://", "https://")):
            raise InvalidInputError(
                f"{self.name} writer: base URL must start with http:// or https://, "
                f"got {self.url!r}")
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0:
            raise InvalidInputError(f"{self.name} writer: timeout must be > 0, got {timeout!r}")
        self.model = model
        self.temperature = temperature
        self.timeout = float(timeout)
        self.max_retries = check_max_retries(max_retries, f"{self.name} writer: ")
        self.stream = bool(stream)
        self.sdk = self._sdk()
        self._client = self._make_client(api_key_from(api_key, self.api_key_env))

    # -- subclass hooks -----------------------------------------------------------------------

    def _sdk(self) -> ModuleType:
        """The SDK module (its exception classes are read from it)."""
        raise NotImplementedError

    def _make_client(self, api_key: str | None) -> Any:
        raise NotImplementedError

    def _send(self, messages: list[dict[str, str]], max_tokens: int) -> Any:
        """Send the request through the SDK: a reply object, or a stream of events."""
        raise NotImplementedError

    def _read_whole(self, reply: Any) -> WriterResult:
        raise NotImplementedError

    def _read_event(self, event: Any, state: StreamState) -> str | None:
        """Take one stream event: its text piece is returned, the rest goes into `state`."""
        raise NotImplementedError

    def _usage(self, raw: Any) -> dict[str, int]:
        """The provider's usage (an SDK object or its dict) in OpenAI's names."""
        return int_fields(dump(raw))

    # -- shared -------------------------------------------------------------------------------

    def _result(self, text: str, finish: str | None, usage: Any) -> WriterResult:
        """A reply in OpenAI's vocabulary, whether it came whole or streamed."""
        finish = finish or self.default_finish
        return WriterResult(text=text, finish_reason=self.finish_reasons.get(finish, finish),
                            usage=self._usage(usage))

    def _generate(
        self, messages: list[dict[str, str]], max_tokens: int, on_delta: DeltaCallback | None
    ) -> WriterResult:
        emit = Pieces(on_delta)
        try:
            reply = self._send(messages, max_tokens)
        except self.sdk.APIError as err:
            raise self._failed(err) from None
        if not self.stream:
            result = self._read_whole(reply)
            emit(result.text)
            return result
        try:
            state = self._read_stream(iter(reply), emit)
        finally:
            reply.close()
        if not state.done and state.finish is None:
            raise self._broken(f"{self.url} stream ended before {self.stream_end}", None, emit)
        return self._result(emit.text, state.finish, state.usage)

    def _read_stream(self, events: Iterator[Any], emit: Pieces) -> StreamState:
        """Hand each piece of text on as it arrives; a failure of the stream itself (not of
        `on_delta`, whose exceptions propagate untouched) ends it with `_broken`."""
        state = StreamState()
        while not state.done:
            if emit.repeating:  # the model's loop: no more of it (the caller closes the stream)
                state.finish, state.done = REPETITION, True
                # an output count sent so far (Anthropic's at the start) is not the total:
                # left out, it is estimated from the text and marked so
                state.usage = {k: v for k, v in state.usage.items()
                               if k not in ("output_tokens", "completion_tokens", "total_tokens")}
                break
            try:
                event = next(events)
            except StopIteration:
                break
            except self.sdk.APITimeoutError as err:
                raise self._broken(self._timeout_message(err), None, emit) from None
            except self.sdk.APIConnectionError as err:
                raise self._broken(self._connection_message(err), None, emit) from None
            except self.sdk.APIStatusError as err:  # an error event inside the stream
                raise self._broken(self._mid_stream_message(err), None, emit) from None
            except self.sdk.APIError as err:
                raise self._broken(self._mid_stream_message(err), None, emit) from None
            except httpx2.TimeoutException as err:
                raise self._broken(
                    f"no answer from {self.url} within the {self.timeout:g} s timeout "
                    f"({type(err).__name__})", None, emit) from None
            except (httpx2.HTTPError, httpx2.StreamError) as err:
                raise self._broken(f"connection to {self.url} failed ({type(err).__name__}: "
                                   f"{err})", None, emit) from None
            except ValueError as err:  # an event that is not JSON
                raise self._broken(f"{self.url} sent a malformed stream event ({err})",
                                   None, emit) from None
            emit(self._read_event(event, state) or "")
        return state

    def _broken(self, message: str, status: int | None, emit: Pieces) -> UpstreamError:
        """A stream that failed after its response began: never retried (by the SDK or here),
        and the text already delivered goes back with the error."""
        if emit.parts:
            return StreamInterruptedError(
                f"{self.name} writer: {message}, after {len(emit.parts)} pieces of text were "
                "already delivered (not retried)", status, emit.text)
        return UpstreamError(f"{self.name} writer: {message}", status)

    def _timeout_message(self, err: Any) -> str:
        cause = type(err.__cause__).__name__ if err.__cause__ is not None else "timeout"
        return f"no answer from {self.url} within the {self.timeout:g} s timeout ({cause})"

    def _connection_message(self, err: Any) -> str:
        cause = err.__cause__
        detail = f"{type(cause).__name__}: {cause}" if cause is not None else str(err)
        return f"connection to {self.url} failed ({detail})"

    def _mid_stream_message(self, err: Any) -> str:
        return f"{self.url} sent an error mid-stream: {str(getattr(err, 'message', err))[:300]}"

    def _failed(self, err: Exception) -> UpstreamError:
        """The SDK's final exception (its retries spent) as our `UpstreamError`."""
        sdk = self.sdk
        if isinstance(err, sdk.APIStatusError):
            status = err.status_code
            message = f"{self.url} answered HTTP {status}: {error_excerpt(err.response.text)}"
            if status in (401, 403):
                message += " (check the API key)"
            if retried(status):
                message += gave_up(attempts_made(err.response.request))
            return UpstreamError(f"{self.name} writer: {message}", status)
        if isinstance(err, sdk.APITimeoutError):
            return UpstreamError(f"{self.name} writer: {self._timeout_message(err)}"
                                 f"{gave_up(attempts_made(err.request))}", None)
        if isinstance(err, sdk.APIConnectionError):
            return UpstreamError(f"{self.name} writer: {self._connection_message(err)}"
                                 f"{gave_up(attempts_made(err.request))}", None)
        return UpstreamError(f"{self.name} writer: {self.url} response is malformed: "
                             f"{str(err)[:300]}", None)

    def _malformed(self, what: str) -> UpstreamError:
        return UpstreamError(f"{self.name} writer: {self.url} response has no {what}")


def dump(obj: Any) -> Any:
    """An SDK model as plain data (dicts pass through)."""
    if obj is None or isinstance(obj, dict):
        return obj
    to_dict = getattr(obj, "model_dump", None)
    return to_dict(exclude_none=True) if callable(to_dict) else obj
