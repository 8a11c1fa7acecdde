"""Writers: what turns a window's prompt into text (offline extractive, OpenAI-compatible,
Anthropic), all behind one `Writer` protocol. Pick one by name with `get_writer`, or with its
upstream settings with `build_writer` (the CLI and the gateway both do).

The registry lives here, not in `writers.base`, so that the base module (which every writer
imports) never imports a writer back.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any, Literal

from cdr.errors import InvalidInputError
from cdr.writers.base import StreamInterruptedError, Writer, WriterResult, pastes_facts

__all__ = [
    "DEFAULT_WRITER",
    "WRITER_NAMES",
    "AnthropicWriter",
    "ExtractiveWriter",
    "OpenAIWriter",
    "StreamInterruptedError",
    "Writer",
    "WriterName",
    "WriterResult",
    "build_writer",
    "get_writer",
    "needs_model",
    "pastes_facts",
]

# The writers by name: what `--writer` and `CDR_WRITER` accept. The Literal is the one spelling
# of the names (the gateway's settings type `CDR_WRITER` with it); the registry maps each to
# its module and class, imported on first use, so that loading one writer never requires
# another's module (or its HTTP client). What a writer can do is said by its class
# (`Writer.pastes_facts`, `Writer.needs_model`), never by its name.
WriterName = Literal["extractive", "openai", "anthropic", "local"]
_REGISTRY: dict[WriterName, tuple[str, str]] = {
    "extractive": ("cdr.writers.extractive", "ExtractiveWriter"),
    "openai": ("cdr.writers.openai_writer", "OpenAIWriter"),
    "anthropic": ("cdr.writers.anthropic_writer", "AnthropicWriter"),
    "local": ("cdr.writers.local", "LocalWriter"),  # the GGUF from cdr.retrieval.models
}
WRITER_NAMES: tuple[str, ...] = tuple(_REGISTRY)
# The writer a run uses unless told otherwise: offline, no model, grounded by construction.
DEFAULT_WRITER: WriterName = "extractive"
_LAZY = {cls: module for module, cls in _REGISTRY.values()}


def needs_model(writer: str | Writer) -> bool:
    """Whether a writer (a registered name, or a writer object) must be told an upstream model
    name: its class says so (`Writer.needs_model`). An unknown name, or a writer that does not
    say: True (ask for a model rather than guess)."""
    if isinstance(writer, str):
        if writer not in _REGISTRY:
            return True
        return bool(getattr(_writer_class(writer), "needs_model", True))
    return bool(getattr(writer, "needs_model", True))


def _writer_class(name: str) -> type:
    if name not in _REGISTRY:
        raise InvalidInputError(
            f"unknown writer {name!r}; choose one of: {', '.join(WRITER_NAMES)}")
    module, cls = _REGISTRY[name]
    found: type = getattr(importlib.import_module(module), cls)
    return found


def get_writer(name: str, **settings: Any) -> Writer:
    """The writer called `name`, built from `settings` (its constructor's keyword arguments)."""
    cls = _writer_class(name)
    try:
        inspect.signature(cls).bind(**settings)
    except TypeError as err:
        raise InvalidInputError(f"{name} writer: bad settings: {err}") from None
    out: Writer = cls(**settings)
    return out


def build_writer(name: str, *, model: str | None = None, base_url: str | None = None,
                 api_key: str | None = None) -> Writer:
    """The writer `name` pointed at its upstream: a writer that needs no model gets nothing;
    an unset base URL is the writer class's `default_base_url` (the OpenAI writer's is
    api.openai.com), if it has one; an unset key is left to the writer (it reads
    its environment variable)."""
    if not needs_model(name):  # no upstream to point at (pasted facts, an in-process model)
        return get_writer(name)
    settings: dict[str, Any] = {"model": model}
    if api_key is not None:
        settings["api_key"] = api_key
    base_url = base_url or getattr(_writer_class(name), "default_base_url", None)
    if base_url:
        settings["base_url"] = base_url
    return get_writer(name, **settings)


def _lazy(name: str) -> Any:
    """A writer class, imported on first use (`_REGISTRY`)."""
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# The writer classes, imported on first use.
__getattr__ = _lazy
