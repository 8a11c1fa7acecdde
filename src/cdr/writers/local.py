"""The `local` writer: a GGUF model run in-process by llama.cpp (llama-cpp-python).

In-process rather than a managed `llama_cpp.server` child: there is no port to pick, no child
to health-check or to leave behind when cdr is killed, and no HTTP hop; pieces stream straight
from the generator to `on_delta`. The model is loaded once per (path, context size) and shared
by every writer in the process under a lock, because llama.cpp runs one request at a time
anyway (a second concurrent request would only thrash the two cores). Anyone who wants a
server can run `python -m llama_cpp.server` and use the `openai` writer — tested the same way.

Defaults are the reference model's (temperature 0, seed 42: deterministic; docs/llm.md).
"""

from __future__ import annotations

import atexit
import os
import threading
import time
from collections.abc import Generator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cdr import settings
from cdr.errors import InvalidInputError, UpstreamError
from cdr.text.self_repeat import REPETITION
from cdr.text.tokens import LLM_WORDS_PER_TOKEN
from cdr.writers.base import (
    DeltaCallback,
    Pieces,
    StreamInterruptedError,
    WriterBase,
    WriterResult,
)

# Room for the CLI's default window (4,096 cl100k tokens of context, which the model's own
# tokenizer counts ~20–30% larger) with a margin; docs/llm.md, "Windows sized to the model".
DEFAULT_N_CTX = 6144
_MODELS: dict[tuple[str, int, int], Any] = {}
_MODELS_LOCK = threading.Lock()
_RUN_LOCK = threading.Lock()


def default_threads() -> int:
    """`CDR_LOCAL_THREADS`, else one per available core (at most 8) — or a single thread when
    the machine is already busy (1-minute load ≥ cores): llama.cpp's threads spin at barriers
    waiting for each other, and a descheduled peer stalls them all. Measured on 2 cores at load
    ~15: 1 thread generated 30 tokens in 19 s, 2 threads took 87 s."""
    env = settings.env("CDR_LOCAL_THREADS")
    if env:
        return max(1, int(env))
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (
        os.cpu_count() or 1)
    busy = hasattr(os, "getloadavg") and os.getloadavg()[0] >= cores
    return 1 if busy else max(1, min(cores, 8))


def close_models() -> None:
    """Free every cached model now, while the interpreter is whole. Left to garbage collection
    at exit, llama-cpp-python's `Llama.__del__` runs after its module's globals are gone and
    prints a `TypeError` traceback to stderr on every clean exit of the CLI."""
    with _MODELS_LOCK:
        models = list(_MODELS.values())
        _MODELS.clear()
    for model in models:
        close = getattr(model, "close", None)
        if callable(close):
            close()


atexit.register(close_models)


def load_model(path: Path, n_ctx: int, n_threads: int) -> Any:
    """The llama.cpp model for `path`, loaded once per process."""
    key = (str(path), n_ctx, n_threads)
    with _MODELS_LOCK:
        if key not in _MODELS:
            from llama_cpp import Llama

            try:
                # Prompt processing too: llama-cpp-python gives it every CPU of the machine by
                # default, so `CDR_LOCAL_THREADS=1` still ran 2 threads per prompt here, and
                # two such processes on 2 cores spun at each other's barriers.
                _MODELS[key] = Llama(model_path=str(path), n_ctx=n_ctx, n_threads=n_threads,
                                     n_threads_batch=n_threads, verbose=False)
            except (ValueError, RuntimeError) as exc:
                raise InvalidInputError(
                    f"local writer: llama.cpp could not load {path}: {exc}") from None
        return _MODELS[key]


@dataclass
class WindowTiming:
    """One generation's cost, split the way llama.cpp spends it: the prompt tokens it had to
    evaluate (those past the prefix it kept from the previous call) and the tokens it
    generated, each with its wall-clock seconds (prompt: until the first piece arrived)."""

    prompt_tokens: int
    reused_tokens: int
    prompt_seconds: float
    completion_tokens: int
    generation_seconds: float

    @property
    def evaluated_tokens(self) -> int:
        return max(0, self.prompt_tokens - self.reused_tokens)

    @property
    def prompt_tokens_per_second(self) -> float | None:
        s = self.prompt_seconds
        return self.evaluated_tokens / s if s > 0 and self.evaluated_tokens else None

    @property
    def generation_tokens_per_second(self) -> float | None:
        s = self.generation_seconds
        return self.completion_tokens / s if s > 0 and self.completion_tokens else None


@dataclass
class ReuseStats:
    """What the loaded model kept across this writer's calls: llama.cpp keeps the KV cache of
    the previous prompt and evaluates only the tokens past the longest common prefix, so the
    stable head of every window's prompt (chat template, system prompt, task line) is
    evaluated once per run, not once per window."""

    calls: int = 0
    calls_reusing: int = 0
    reused_tokens: int = 0
    timings: list[WindowTiming] = field(default_factory=list)


def reference_vocabulary() -> Any | None:
    """The local model's tokenizer alone (`vocab_only`: no weights, loaded in milliseconds), to
    count prompts in the model's own tokens where nothing is generated (budget checks, their
    benchmark); None without llama-cpp or a cached model, so callers fall back to cl100k."""
    try:
        from llama_cpp import Llama
    except ImportError:
        return None
    from cdr.retrieval.models import local_llm_path

    path = local_llm_path()
    if not path.is_file():
        return None
    return Llama(model_path=str(path), vocab_only=True, verbose=False)


def common_prefix(a: Any, b: Any) -> int:
    """Length of the longest common prefix of two token sequences."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


class LocalWriter(WriterBase):
    """Writes with a local GGUF chat model. `model_path` defaults to `CDR_LOCAL_MODEL`, else the
    reference model installed by `make llm`; `n_ctx` to `CDR_LOCAL_N_CTX`, else 6144."""

    name = "local"
    continues_prefix = True  # its answer can be begun for it (`_stream`)
    needs_model = False  # the GGUF from cdr.retrieval.models, loaded in this process
    # Words a completion token of the reference model carries (`cdr.window.length`): what the length
    # contract plans a window's words with.
    words_per_token = LLM_WORDS_PER_TOKEN

    def __init__(
        self,
        model_path: str | None = None,
        n_ctx: int | None = None,
        temperature: float = 0.0,
        seed: int = 42,
        stop: list[str] | None = None,
        n_threads: int | None = None,
    ) -> None:
        from cdr.retrieval.models import require_local_llm

        if model_path is not None:
            path = Path(model_path).expanduser()
            if not path.is_file():
                raise InvalidInputError(f"local writer: model file {path} does not exist")
        else:
            path = require_local_llm()
        env_ctx = settings.env("CDR_LOCAL_N_CTX")
        self.n_ctx = int(n_ctx or (int(env_ctx) if env_ctx else DEFAULT_N_CTX))
        if self.n_ctx < 256:
            raise InvalidInputError(f"local writer: n_ctx must be >= 256, got {self.n_ctx}")
        self.model_path = path
        self.model = path.stem
        self.temperature = float(temperature)
        self.seed = int(seed)
        self.stop = list(stop or [])
        self._llm = load_model(path, self.n_ctx, n_threads or default_threads())
        self.reuse = ReuseStats()
        self._formatter: Any = None

    @property
    def last_timing(self) -> WindowTiming | None:
        return self.reuse.timings[-1] if self.reuse.timings else None

    def _generate(
        self, messages: list[dict[str, str]], max_tokens: int, on_delta: DeltaCallback | None
    ) -> WriterResult:
        return self._run(messages, max_tokens, on_delta, "")

    def _generate_after(
        self, messages: list[dict[str, str]], max_tokens: int, on_delta: DeltaCallback | None,
        prefix: str,
    ) -> WriterResult:
        return self._run(messages, max_tokens, on_delta, prefix)

    def _run(self, messages: list[dict[str, str]], max_tokens: int,
             on_delta: DeltaCallback | None, prefix: str) -> WriterResult:
        emit = Pieces(on_delta)
        finish = "stop"
        with _RUN_LOCK:
            try:
                # the prefix is text, not control tokens (a document that quotes "<|im_end|>"
                # must not end the turn); read once, counted and sent as read
                begun = self._llm.tokenize(prefix.encode("utf-8"), add_bos=False,
                                           special=False) if prefix else []
                prompt_tokens = self._prompt_tokens(messages) + len(begun)
                room = self.n_ctx - prompt_tokens
                if room < 16:
                    raise InvalidInputError(
                        f"local writer: the prompt takes {prompt_tokens} of the model's "
                        f"{self.n_ctx}-token context; raise CDR_LOCAL_N_CTX or lower "
                        "--context-tokens")
                limit = min(max_tokens, room)
                before = list(getattr(self._llm, "_input_ids", ()))
                started = time.perf_counter()
                first: float | None = None
                stream = self._stream(messages, limit, begun)
                try:
                    for piece, reason in stream:
                        if piece and first is None:
                            first = time.perf_counter()
                        emit(piece)
                        if reason:
                            finish = reason
                        if emit.repeating:  # the model's loop: no more of it
                            finish = REPETITION
                            break
                finally:
                    stream.close()
                ended = time.perf_counter()
                completion = len(self._llm.tokenize(emit.text.encode(), add_bos=False))
                self._count(before, prompt_tokens, completion, started, first or ended, ended)
            except (InvalidInputError, KeyboardInterrupt):
                raise
            except Exception as exc:  # llama.cpp raises plain RuntimeError/ValueError
                if emit.text:
                    raise StreamInterruptedError(f"local writer failed mid-generation: {exc}",
                                                 None, emit.text) from None
                raise UpstreamError(f"local writer failed: {exc}") from None
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": completion,
                 "total_tokens": prompt_tokens + completion}
        return WriterResult(emit.text, finish, usage)

    def _stream(self, messages: list[dict[str, str]], limit: int, begun: list[int]
                ) -> Generator[tuple[str, str | None], None, None]:
        """(piece, finish reason or None) as llama.cpp generates. With `begun` (the prefix's
        tokens) the chat is rendered by the model's own template up to the assistant's turn,
        the prefix put after it and completed as plain text: the model reads the prefix as
        what it has already answered, and only what follows comes back."""
        common = {"max_tokens": limit, "temperature": self.temperature, "seed": self.seed,
                  "stream": True}
        if not begun:
            for chunk in self._llm.create_chat_completion(
                    messages=messages, stop=self.stop or None, **common):
                choice = (chunk.get("choices") or [{}])[0]
                yield (choice.get("delta") or {}).get("content") or "", choice.get(
                    "finish_reason")
            return
        turn = self._chat_formatter()(messages=messages)
        tokens = self._llm.tokenize(turn.prompt.encode("utf-8"), add_bos=not turn.added_special,
                                    special=True) + begun
        template_stop = [] if turn.stop is None else (
            [turn.stop] if isinstance(turn.stop, str) else list(turn.stop))
        for chunk in self._llm.create_completion(
                prompt=tokens, stop=(self.stop + template_stop) or None,
                stopping_criteria=turn.stopping_criteria, **common):
            choice = (chunk.get("choices") or [{}])[0]
            yield choice.get("text") or "", choice.get("finish_reason")

    def _chat_formatter(self) -> Any:
        """The model's chat template as llama-cpp-python renders it for
        `create_chat_completion` (the GGUF's `tokenizer.chat_template`, its own end and
        start tokens), so a prefixed answer is framed exactly like any other."""
        if self._formatter is None:
            from llama_cpp.llama_chat_format import Jinja2ChatFormatter

            template = self._llm.metadata.get("tokenizer.chat_template")
            if not template:
                raise InvalidInputError(
                    f"local writer: {self.model} has no chat template to continue an answer in")

            def text_of(token: int) -> str:
                return "" if token == -1 else self._llm.detokenize(
                    [token], special=True).decode("utf-8", "replace")

            eos = self._llm.token_eos()
            self._formatter = Jinja2ChatFormatter(
                template=template, eos_token=text_of(eos), bos_token=text_of(
                    self._llm.token_bos()), stop_token_ids=[eos])
        return self._formatter

    def _count(self, before: list[int], prompt_tokens: int, completion: int, started: float,
               first: float, ended: float) -> None:
        """Record the call: the prefix llama.cpp kept from the previous call is the common
        prefix of the evaluated tokens before and after it (it keeps exactly the longest
        common prefix of the old tokens and the new prompt)."""
        after = getattr(self._llm, "_input_ids", ())
        reused = min(common_prefix(before, after), prompt_tokens)
        r = self.reuse
        r.calls += 1
        r.calls_reusing += reused > 0
        r.reused_tokens += reused
        r.timings.append(WindowTiming(prompt_tokens, reused, first - started, completion,
                                      ended - first))

    def _prompt_tokens(self, messages: list[dict[str, str]]) -> int:
        # The chat template adds a few tokens per message; count content plus that framing.
        body = sum(len(self._llm.tokenize(m["content"].encode(), add_bos=False))
                   for m in messages)
        return body + 5 * len(messages) + 3
