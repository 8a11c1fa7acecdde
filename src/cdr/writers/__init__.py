"""Writers: what turns a window's prompt into text (offline extractive, OpenAI-compatible,
Anthropic), all behind one `Writer` protocol. Pick one by name with `get_writer`, or with its
upstream settings with `build_writer` (the CLI and the gateway both do).

The registry lives here, not in `writers.base`, so that the base module (which every writer
imports) never imports a writer back.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any

from cdr.errors import InvalidInputError
from cdr.writers.base import StreamInterruptedError, Writer, WriterResult, pastes_facts

__all__ = [
    "WRITER_NAMES",
    "AnthropicWriter",
    "ExtractiveWriter",
    "OpenAIWriter",
    "StreamInterruptedError",
    "Writer",
    "WriterResult",
    "build_writer",
    "get_writer",
    "needs_model",
    "pastes_facts",
]

# name -> (module, class, needs an upstream model name). Imported on first use, so that
# loading one writer never requires another's module (or its HTTP client).
_REGISTRY = {
    "extractive": ("cdr.writers.extractive", "ExtractiveWriter", False),
    "openai": ("cdr.writers.openai_writer", "OpenAIWriter", True),
    "anthropic": ("cdr.writers.anthropic_writer", "AnthropicWriter", True),
    "local": ("cdr.writers.local", "LocalWriter", False),  # the GGUF from cdr.retrieval.models
}
WRITER_NAMES = tuple(_REGISTRY)
_LAZY = {cls: module for module, cls, _ in _REGISTRY.values()}


def needs_model(name: str) -> bool:
    """Whether the writer `name` must be told an upstream model name (an API writer)."""
    return _REGISTRY[name][2] if name in _REGISTRY else True
OPENAI_BASE_URL = "https://api.openai.com/v1"


def _writer_class(name: str) -> type:
    if name not in _REGISTRY:
        raise InvalidInputError(
            f"unknown writer {name!r}; choose one of: {', '.join(WRITER_NAMES)}")
    module, cls, _ = _REGISTRY[name]
    return getattr(importlib.import_module(module), cls)


def get_writer(name: str, **settings: Any) -> Writer:
    """The writer called `name`, built from `settings` (its constructor's keyword arguments)."""
    cls = _writer_class(name)
    try:
        inspect.signature(cls).bind(**settings)
    except TypeError as err:
        raise InvalidInputError(f"{name} writer: bad settings: {err}") from None
    return cls(**settings)


def build_writer(name: str, *, model: str | None = None, base_url: str | None = None,
                 api_key: str | None = None) -> Writer:
    """The writer `name` pointed at its upstream: the extractive writer needs nothing; the
    OpenAI writer defaults to api.openai.com; an unset key is left to the writer (it reads
    its environment variable)."""
    if not needs_model(name):  # extractive, or local: the GGUF from cdr.retrieval.models
        return get_writer(name)
    settings: dict[str, Any] = {"model": model}
    if api_key is not None:
        settings["api_key"] = api_key
    if name == "openai":
        settings["base_url"] = base_url or OPENAI_BASE_URL
    elif base_url:
        settings["base_url"] = base_url
    return get_writer(name, **settings)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
