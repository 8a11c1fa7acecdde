"""LLM token counting, offline.

`bpe-openai` bundles OpenAI's cl100k_base BPE (counts identical to tiktoken's cl100k on real
text) and needs no download, unlike `tiktoken`, which fetches its BPE file on first use.
Budgets (envelope packing, fact size bounds) are counted with it: it is what GPT-4-class
models see, and a close, labelled estimate for others.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import numpy as np

TOKENIZER_NAME = "cl100k_base"
# Per-message framing tokens in the chat format (OpenAI's published counting recipe): what a
# chat prompt costs beyond its messages' text.
TOKENS_PER_MESSAGE = 3
TOKENS_REPLY_PRIMING = 3


@lru_cache(maxsize=1)
def _encoding() -> Any:  # a bpe_openai.Encoding (the package has no type information)
    import bpe_openai

    return bpe_openai.get_encoding(TOKENIZER_NAME)


def count_tokens(text: str) -> int:
    """Number of cl100k_base tokens in `text` (special-token text is counted as ordinary)."""
    return len(_encoding().encode_ordinary(text))


def count_tokens_batch(texts: Sequence[str]) -> np.ndarray:
    """Token counts for many texts at once (int32)."""
    if not texts:
        return np.zeros(0, dtype=np.int32)
    encoded = _encoding().encode_ordinary_batch(list(texts))
    return np.fromiter((len(e) for e in encoded), dtype=np.int32, count=len(texts))


def chat_framing_tokens(messages: int) -> int:
    """Tokens the chat format adds around `messages` messages (role markers, separators and
    the reply's priming): counted into a window's budget so that the prompt a writer sends,
    not only its text, fits the context."""
    return TOKENS_PER_MESSAGE * messages + TOKENS_REPLY_PRIMING
