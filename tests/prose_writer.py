"""A writer the loop treats as a model, without a model: it does not paste facts, so the loop
plans, fits and prompts for it as for a language model, and its text is the extractive writer's
from the same prompt (the planned sections from their listed facts), so runs stay deterministic
and fast. Shared by the tests of planning, prompt budgets and thin envelopes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cdr.writers import get_writer
from cdr.writers.base import WriterResult

Cut = Callable[[list[dict[str, str]], int], tuple[str, str]]


class ProseWriter:
    """`words`: keep at most that many words a window (finish "length" when it cut, as a model
    stopped at `max_tokens`); `cut(messages, call)`: the test's own (text, finish) instead;
    neither: the extractive writer's whole answer within `max_tokens`. Records every prompt."""

    name = "prose"
    pastes_facts = False

    def __init__(self, words: int | None = None, cut: Cut | None = None) -> None:
        self.words, self.cut = words, cut
        self.inner = get_writer("extractive")
        self.messages: list[list[dict[str, str]]] = []
        self.max_tokens: list[int] = []

    @property
    def prompts(self) -> list[str]:
        """The user message of every call, in order."""
        return [m[-1]["content"] for m in self.messages]

    def generate(self, messages: list[dict[str, str]], max_tokens: int, *,
                 on_delta: Any = None) -> WriterResult:
        self.messages.append(messages)
        self.max_tokens.append(max_tokens)
        if self.cut is not None:
            text, finish = self.cut(messages, len(self.messages))
            return WriterResult(text, finish, {"completion_tokens": len(text.split())})
        if self.words is None:
            return self.inner.generate(messages, max_tokens, on_delta=on_delta)
        words = self.inner.generate(messages, 100_000).text.split(" ")
        return WriterResult(" ".join(words[:self.words]),
                            "length" if len(words) > self.words else "stop",
                            {"completion_tokens": min(len(words), self.words)})
