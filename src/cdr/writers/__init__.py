"""Writers: what turns a window's prompt into text (offline extractive, OpenAI-compatible,
Anthropic), all behind one `Writer` protocol. Pick one by name with `get_writer`."""

from __future__ import annotations

from typing import Any

from cdr.writers.base import (
    WRITER_NAMES,
    StreamInterruptedError,
    Writer,
    WriterResult,
    get_writer,
)

__all__ = [
    "WRITER_NAMES",
    "AnthropicWriter",
    "ExtractiveWriter",
    "OpenAIWriter",
    "StreamInterruptedError",
    "Writer",
    "WriterResult",
    "get_writer",
]

_LAZY = {
    "ExtractiveWriter": "cdr.writers.extractive",
    "OpenAIWriter": "cdr.writers.openai_writer",
    "AnthropicWriter": "cdr.writers.anthropic_writer",
}


def __getattr__(name: str) -> Any:
    # Imported on first use, so that loading one writer never requires another's module.
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
