"""The writer contract, and what every model-backed writer shares.

Every writer takes OpenAI-style chat messages and returns text, a finish reason and token
usage, so the window loop never cares who wrote a window. The model-backed writers are built
on `WriterBase` (request checks; usage estimated where none came; a token-limited text cut back
to complete paragraphs) and hand text on through `Pieces`. The API writers' transport is each
provider's official SDK (`cdr.writers.sdk_chat`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from cdr import settings
from cdr.errors import InvalidInputError, UpstreamError
from cdr.text.self_repeat import REPETITION, RepeatWatch, find_repeat, kept_before_repeat
from cdr.text.tokens import chat_framing_tokens, count_tokens

DeltaCallback = Callable[[str], None]


@dataclass
class WriterResult:
    """One window's text.

    `finish_reason` uses OpenAI's words whatever the provider: "stop" (natural end), "length"
    (hit max_tokens); anything else is passed through as the provider said it. `usage` has
    `prompt_tokens`, `completion_tokens`, `total_tokens`, and `estimated: 1` when the server
    sent no usage and the counts come from `cdr.text.tokens` (cl100k) instead.
    """

    text: str
    finish_reason: str
    usage: dict[str, int]
    # With finish_reason "length": the unfinished last paragraph, cut from `text` so that the
    # window keeps (and Stage 8 credits) only complete paragraphs; the next window continues.
    dropped_text: str = ""


def cut_repetition(result: WriterResult) -> WriterResult:
    """Keep the text before the model's loop (`cdr.text.self_repeat`) of a window stopped
    for it, or of any text that repeats itself (a writer that does not stream gives its text
    whole); the loop goes to `dropped_text` and the finish reason says `REPETITION`."""
    if result.dropped_text:
        return result
    cut = find_repeat(result.text)
    if cut is None:
        return result
    result.text, result.dropped_text = kept_before_repeat(result.text, cut)
    result.finish_reason = REPETITION
    return result


def trim_truncated(result: WriterResult) -> WriterResult:
    """Cut a token-limited text back to its last complete paragraph (`cdr.text.markdown`)."""
    if result.finish_reason != "length" or result.dropped_text:
        return result
    from cdr.text.markdown import keep_complete

    result.text, result.dropped_text = keep_complete(result.text)
    return result


@runtime_checkable
class Writer(Protocol):
    """Anything that writes a window from chat messages (role/content dicts).

    Its capabilities are what the loop, the gateway and the CLI ask instead of its name:

    - `pastes_facts`: it writes by pasting the envelope's facts, grounded by construction with
      no model behind it (`pastes_facts()`);
    - `needs_model`: it must be told an upstream model name (an API writer;
      `cdr.writers.needs_model` asks the class before building one).

    A writer may also declare `words_per_token` (`cdr.window.length.writer_words_per_token`),
    and `continues_prefix = True` when `generate` takes `prefix=`: the start of its answer,
    which it goes on from and does not repeat (`cdr.window.resume`).
    A writer written before the flags existed still works: read through `pastes_facts()` and
    `cdr.writers.needs_model`, a missing flag means a prose writer that needs a model.
    """

    name: str
    pastes_facts: bool
    needs_model: bool

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
    A writer says so with `pastes_facts = True` (`Writer`); any other writes prose."""
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
    must not be given again) and a finished stream's text is exactly what was delivered.

    It also watches the text for a model's loop (`cdr.text.self_repeat`): once `repeating`,
    the writer stops asking for more and finishes with `REPETITION`, `generate` keeps the
    text before the loop (`cut_repetition`), and `on_delta` has been handed no more than that
    (`text` still holds all that was written: it is what the usage counts)."""

    def __init__(self, on_delta: DeltaCallback | None) -> None:
        self.parts: list[str] = []
        self._on_delta = on_delta
        self._watch = RepeatWatch()
        self._length = 0  # of `text`

    def __call__(self, piece: str) -> None:
        if not piece:
            return
        start, self._length = self._length, self._length + len(piece)
        self.parts.append(piece)
        if self._watch.feed(piece):
            # on goes only the text before the loop (a whole answer is one piece: its loop
            # must not reach a stream, which would keep what it was handed)
            piece = piece[: max(0, (self._watch.cut or 0) - start)]
        if piece and self._on_delta is not None:
            self._on_delta(piece)

    @property
    def repeating(self) -> bool:
        """Whether the text has begun to repeat itself: the writer should stop."""
        return self._watch.cut is not None

    @property
    def text(self) -> str:
        return "".join(self.parts)


class WriterBase:
    """What every model-backed writer does around its own generation: refuse a bad request
    before any work, then finish the result the same way (usage the model did not report is
    estimated; a token-limited text is cut back to complete paragraphs). Subclasses write
    `_generate`, which hands its text piece by piece to `emit`."""

    name = "writer"
    pastes_facts = False  # a model writes prose
    needs_model = True  # told which model; an in-process model says False
    continues_prefix = False  # `generate(prefix=...)`: a writer that can says True

    def generate(
        self,
        messages: list[dict[str, str]],
        max_tokens: int,
        *,
        on_delta: DeltaCallback | None = None,
        prefix: str = "",
    ) -> WriterResult:
        """Write at most `max_tokens` tokens (the `Writer` protocol). `prefix`, for a writer
        that `continues_prefix`, is the start of the answer: the model goes on from it, and
        the result holds only what it wrote after it."""
        check_request(messages, max_tokens)
        if prefix and not self.continues_prefix:
            raise InvalidInputError(f"the {self.name} writer cannot continue a prefix")
        result = (self._generate_after(messages, max_tokens, on_delta, prefix) if prefix
                  else self._generate(messages, max_tokens, on_delta))
        result.usage = complete_usage(result.usage, messages, result.text)
        return trim_truncated(cut_repetition(result))

    def _generate(
        self, messages: list[dict[str, str]], max_tokens: int, on_delta: DeltaCallback | None
    ) -> WriterResult:
        raise NotImplementedError

    def _generate_after(
        self, messages: list[dict[str, str]], max_tokens: int, on_delta: DeltaCallback | None,
        prefix: str,
    ) -> WriterResult:
        """`_generate` with the answer begun by `prefix` (writers that `continues_prefix`)."""
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
    """cl100k count of a chat prompt, framing included: the usage estimated when a server
    reports none, and the count a window's budget keeps within C − G
    (`cdr.window.envelope.make_budget`)."""
    body = sum(count_tokens(m["content"]) for m in messages)
    return body + chat_framing_tokens(len(messages))


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


USAGE_KEYS = ("prompt_tokens", "completion_tokens", "total_tokens")


def sum_usage(usages: Iterable[dict[str, Any]]) -> dict[str, int]:
    """Several calls' usage as one: prompt and completion tokens added (a count that is not
    an integer counts nothing), the total their sum."""
    totals = dict.fromkeys(USAGE_KEYS, 0)
    for u in usages:
        for k in USAGE_KEYS[:2]:
            v = u.get(k, 0)
            totals[k] += v if isinstance(v, int) else 0
    totals["total_tokens"] = totals["prompt_tokens"] + totals["completion_tokens"]
    return totals


def int_fields(obj: Any) -> dict[str, int]:
    """The integer counters of a usage object (nested detail objects dropped)."""
    if not isinstance(obj, dict):
        return {}
    return {k: v for k, v in obj.items() if isinstance(v, int) and not isinstance(v, bool)}


def error_excerpt(body: str, limit: int = 300) -> str:
    """The human part of an error body: `error.message` when it is JSON, else its start."""
    try:
        payload = json.loads(body)
    except ValueError:
        payload = None
    if isinstance(payload, dict):
        err = payload.get("error")
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            out: str = err["message"][:limit]
            return out
        if isinstance(err, str):
            return err[:limit]
    text = " ".join(body.split())
    return text[:limit] + ("…" if len(text) > limit else "") if text else "(empty body)"


def api_key_from(api_key: str | None, env: tuple[str, ...]) -> str | None:
    """`api_key`, else the first of the `env` variables that is set and not empty."""
    return api_key or next(filter(None, map(settings.env, env)), None)
