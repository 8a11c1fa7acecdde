"""What a long run asks of the model per window (issue 22 §4): the prompt stays bounded as the
windows go on, and the local writer counts the prompt prefix llama.cpp keeps between windows.

Structure only, no model and no timing: a model-like writer (it writes the planned sections
from the prompt's facts and is cut at `max_tokens` words, as a model is) over 12 windows, and
the `local` writer on a stand-in for llama.cpp that keeps, as llama.cpp does, the longest
common prefix of the previous call's tokens and the new prompt. bench/long_llm_speed.py
measures the same on the reference model: the seconds a window costs are the tokens it
evaluates and generates times the machine's per-token speed.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cdr.ckf import CKF
from cdr.session import IN_PROGRESS
from cdr.window.loop import GenerationConfig, Generator
from cdr.writers import get_writer
from cdr.writers.base import WriterResult, estimate_prompt_tokens
from tests.conftest import BUILTIN_TYPES_TASK

OUTLINE = "Numeric types\nSequence types\nText sequence type str\nSet types\nMapping types\n"
CONTEXT, GENERATION = 1536, 128
# relevance-only with the length contract re-sends what it ranks first and never runs out,
# so 6,000 words at 128 tokens a window run to the window limit
WINDOWS = 12
LONG = {"ranking": "relevance", "length": "contract"}


def _planned_text(messages: list[dict[str, str]], max_tokens: int, call: int) -> tuple[str, str]:
    """The window's planned sections written from its facts, cut at `max_tokens` words and
    ending with the call's number: a model does not write the same window twice, and the next
    prompt shows where a continued section's text stopped."""
    words = get_writer("extractive").generate(messages, 100_000).text.split(" ")
    cut = len(words) > max_tokens - 4
    return " ".join([*words[:max_tokens - 4], f"Call {call} ends here."]), (
        "length" if cut else "stop")


class ModelLike:
    """Writes prose (no `pastes_facts`): the loop plans, fits and prompts as for a model."""

    name = "model-like"

    def __init__(self) -> None:
        self.prompts: list[list[dict[str, str]]] = []

    def generate(self, messages: list[dict[str, str]], max_tokens: int, *,
                 on_delta: Any = None) -> WriterResult:
        self.prompts.append(messages)
        text, finish = _planned_text(messages, max_tokens, len(self.prompts))
        if on_delta is not None:
            on_delta(text)
        return WriterResult(text, finish, {"completion_tokens": len(text.split())})


def _run(ckf_path: Path, writer: Any, **options: Any) -> int:
    cfg = GenerationConfig(max_windows=WINDOWS, words=6000, context_tokens=CONTEXT,
                           generation_tokens=GENERATION, **options)
    gen = Generator(CKF.open(ckf_path), writer, cfg)
    session = gen.start(BUILTIN_TYPES_TASK, OUTLINE)
    while session.status == IN_PROGRESS:
        gen.step(session)
    return session.window_count


@pytest.mark.parametrize("options", [LONG, {"profile": "focused"}], ids=["relevance", "focused"])
def test_the_prompt_does_not_grow_with_the_window_number(types_ckf_path: Path, options: dict):
    """The window prompt carries no growing document: the continued sections' last words and
    the plan are bounded, the envelope is packed to the same budget every window, so the
    later windows' prompts are no longer than the first windows' (a prompt that carried the
    text so far would grow by a window's words every window)."""
    writer = ModelLike()
    windows = _run(types_ckf_path, writer, **options)
    tokens = [estimate_prompt_tokens(m) for m in writer.prompts]
    # (a window the stale stop closes unwritten, or one too thin to ground a section, calls
    # no writer)
    assert windows - 1 <= len(tokens) <= windows and len(tokens) >= 5
    # From Window 2, which adds the lines on the sections it continues (Window 1 continues
    # none, so its prompt is shorter): the last third no longer than the first third.
    later = tokens[1:]
    k = max(1, len(later) // 3)
    assert max(later[-k:]) <= max(later[:k]) * 1.05, tokens
    if options is LONG:  # every window to the limit; from Window 2 (which adds the lines
        # on the sections it continues) each prompt within 5% of the others
        later = tokens[1:]
        assert windows == WINDOWS and max(later) - min(later) <= 0.05 * max(later), tokens


# ------------------------------------------------------------------ the local writer's reuse


def _common(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


class StandInLlama:
    """llama.cpp as the local writer sees it: `tokenize`, `_input_ids` (the tokens whose KV
    state it holds: the last prompt and what it generated) and a streamed chat completion that
    keeps the longest common prefix of `_input_ids` and the new prompt and evaluates the
    rest. Tokens are whitespace-separated words."""

    def __init__(self) -> None:
        self._input_ids: list[int] = []
        self.vocab: dict[str, int] = {}
        self.kept: list[int] = []  # prefix kept per call, as llama.cpp would

    def tokenize(self, data: bytes, add_bos: bool = False) -> list[int]:
        return [self.vocab.setdefault(t, len(self.vocab)) for t in data.decode().split()]

    def template(self, messages: list[dict[str, str]]) -> list[int]:
        text = " ".join(f"<|{m['role']}|> {m['content']} <|end|>" for m in messages)
        return self.tokenize(text.encode())

    def create_chat_completion(self, messages: list[dict[str, str]], max_tokens: int,
                               **_: Any) -> Iterator[dict[str, Any]]:
        prompt = self.template(messages)
        # llama-cpp-python (Llama.generate) keeps the longest common prefix of the tokens it
        # holds and the prompt, less one when that is the whole prompt (it needs the last
        # token's logits), and then holds the prompt and what it generated
        self.kept.append(_common(self._input_ids, prompt[:-1]))
        text, finish = _planned_text(messages, max_tokens, len(self.kept))
        self._input_ids = prompt + self.tokenize(text.encode())
        yield {"choices": [{"delta": {"content": text}, "finish_reason": None}]}
        yield {"choices": [{"delta": {}, "finish_reason": finish}]}


@pytest.fixture
def local_writer(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Any:
    from cdr.writers import local

    llama = StandInLlama()
    monkeypatch.setattr(local, "load_model", lambda *a, **k: llama)
    model = tmp_path / "stand-in.gguf"
    model.write_bytes(b"")
    return local.LocalWriter(model_path=str(model), n_ctx=4096)


def test_the_local_writer_counts_the_prefix_kept_in_every_window(types_ckf_path: Path,
                                                                  local_writer: Any):
    """Over a long run, every window after the first reuses at least the prompt's stable head
    (chat template, system prompt, task line), the writer counts exactly what the model kept,
    and the rest of the prompt — the window's own plan and facts — is evaluated."""
    windows = _run(types_ckf_path, local_writer, **LONG)
    llama, reuse = local_writer._llm, local_writer.reuse
    assert windows == WINDOWS and reuse.calls == len(reuse.timings) == windows
    assert [t.reused_tokens for t in reuse.timings] == llama.kept
    assert reuse.reused_tokens == sum(llama.kept) and reuse.calls_reusing == windows - 1
    from cdr.window.config import DEFAULT_SYSTEM_PROMPT

    head = len(llama.template([{"role": "system", "content": DEFAULT_SYSTEM_PROMPT}])) + len(
        llama.tokenize(f"<|user|> Task: {BUILTIN_TYPES_TASK}".encode()))
    assert reuse.timings[0].reused_tokens == 0
    for t in reuse.timings[1:]:
        assert head <= t.reused_tokens < t.prompt_tokens
        assert t.evaluated_tokens == t.prompt_tokens - t.reused_tokens > 0


def test_a_new_process_starts_with_nothing_kept(types_ckf_path: Path, local_writer: Any):
    """A model freshly loaded (a run resumed in a new process) holds no tokens: its first
    window keeps nothing, which is what the benchmark reads as a cache restart."""
    local_writer.generate([{"role": "system", "content": "s"}, {"role": "user", "content": "a"}],
                          8)
    local_writer._llm._input_ids = []  # what a freshly loaded model holds
    local_writer.generate([{"role": "system", "content": "s"}, {"role": "user", "content": "a"}],
                          8)
    assert [t.reused_tokens for t in local_writer.reuse.timings] == [0, 0]
    assert local_writer.reuse.calls_reusing == 0
