"""LLM token counting, offline.

`bpe-openai` bundles OpenAI's cl100k_base BPE (counts identical to tiktoken's cl100k on real
text) and needs no download, unlike `tiktoken`, which fetches its BPE file on first use.
Budgets (envelope packing, fact size bounds) are counted with it: it is what GPT-4-class
models see, and a close, labelled estimate for others.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

TOKENIZER_NAME = "cl100k_base"
# Per-message framing tokens in the chat format (OpenAI's published counting recipe): what a
# chat prompt costs beyond its messages' text.
TOKENS_PER_MESSAGE = 3
TOKENS_REPLY_PRIMING = 3
# Words per completion token the reference model wrote on the quality benchmark: 31,628 words
# over 54,777 completion tokens in its 180 windows (bench/results/quality-llm-runs, Markdown
# and code included). The planner's own figure is 0.70 (`cdr.window.fit.WORDS_PER_TOKEN`,
# measured on extractive prose); the length contract's capacity uses the lower, so that it does
# not promise too much, and a local model's writer declares it.
LLM_WORDS_PER_TOKEN = 0.577


# What bpe-openai's own wrapper (`Encoding.encode_ordinary`) refuses, kept by `_count`.
MAX_TEXT_CHARS = 1_000_000
CHUNK_LIMIT = 200_000


_load_lock = threading.Lock()


@lru_cache(maxsize=1)
def _tokenizer() -> Any:
    """bpe-openai's Rust tokenizer for cl100k_base (a `PyTokenizer`), loaded without running
    the package's `__init__`.

    Importing `bpe_openai` decodes the BPE rank tables of all three of its encodings in Python
    (cl100k, o200k and voyage3: ~0.8 s of CPU) only to read their special tokens, while its
    Rust extension carries its own tables (loading it and building cl100k: ~0.03 s). Every
    process that counts a token paid that: each gateway process and worker, each `cdr ingest`
    or `cdr generate`, each test worker and test server. The extension module is loaded alone;
    should a release of bpe-openai move it, the package's public `get_encoding` is used
    instead (`tests/test_tokens.py` checks the fast path is the one taken and that both
    count alike)."""
    name = "bpe_openai._bindings"
    with _load_lock:
        return _load_tokenizer(name)


def _load_tokenizer(name: str) -> Any:
    import importlib.machinery
    import importlib.util

    try:
        module = sys.modules.get(name)
        package = importlib.util.find_spec("bpe_openai")  # finds it, does not run it
        folders = [] if package is None else package.submodule_search_locations or []
        for folder in [] if module is not None else folders:
            for suffix in importlib.machinery.EXTENSION_SUFFIXES:
                path = Path(folder) / f"_bindings{suffix}"
                spec = importlib.util.spec_from_file_location(name, path)
                if path.is_file() and spec is not None and spec.loader is not None:
                    module = importlib.util.module_from_spec(spec)
                    spec.loader.exec_module(module)
                    # Registered, so that the package, imported later, uses this one.
                    sys.modules[name] = module
                    break
            if module is not None:
                break
        if module is not None:
            return module.tokenizer_for_encoding(TOKENIZER_NAME)
    except (ImportError, AttributeError, OSError):
        pass
    return _PublicEncoding()


class _PublicEncoding:
    """The same counts through bpe-openai's public, slower-to-load API."""

    def __init__(self) -> None:
        import bpe_openai

        self._encoding = bpe_openai.get_encoding(TOKENIZER_NAME)

    def encode(self, text: str) -> list[int]:
        return list(self._encoding.encode_ordinary(text))


def _count(text: str) -> int:
    """`text`'s cl100k_base tokens, refused and sanitised as bpe-openai's `encode_ordinary`
    does: lone surrogates become U+FFFD, a text of a million characters or more is a
    ValueError, more than `CHUNK_LIMIT` tokens its TokenLimitError."""
    if not text:
        return 0
    if len(text) >= MAX_TEXT_CHARS:
        raise ValueError("Input too long to encode safely")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    n = len(_tokenizer().encode(text))
    if n > CHUNK_LIMIT:
        from bpe_openai import errors

        errors.raise_token_limit(n, CHUNK_LIMIT)
    return n


def count_tokens(text: str) -> int:
    """Number of cl100k_base tokens in `text` (special-token text is counted as ordinary)."""
    return _count(text)


def count_tokens_batch(texts: Sequence[str]) -> np.ndarray:
    """Token counts for many texts at once (int32)."""
    return np.fromiter((_count(t) for t in texts), dtype=np.int32, count=len(texts))


def chat_framing_tokens(messages: int) -> int:
    """Tokens the chat format adds around `messages` messages (role markers, separators and
    the reply's priming): counted into a window's budget so that the prompt a writer sends,
    not only its text, fits the context."""
    return TOKENS_PER_MESSAGE * messages + TOKENS_REPLY_PRIMING
