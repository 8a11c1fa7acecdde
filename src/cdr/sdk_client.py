"""What every object that owns a provider SDK's client shares: the remote embedder
(`cdr.retrieval.embed.RemoteEmbedder`) and the API writers (`cdr.writers.sdk_chat`).

Each builds an `openai` or `anthropic` client that holds a pool of HTTP connections; closing the
owner closes that pool, and the owner is a context manager so that `with` does it. Their retry
budget is the SDK's `max_retries`, checked the same way before the client is built."""

from __future__ import annotations

from typing import Any, Self

from cdr.errors import InvalidInputError


def check_max_retries(max_retries: object, who: str = "") -> int:
    """`max_retries` if it is an integer ≥ 0 (a bool is not): the SDK's extra attempts after a
    failure that may be transient. `who` prefixes the message (``"openai writer: "``)."""
    if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
        raise InvalidInputError(f"{who}max_retries must be an integer >= 0, got {max_retries!r}")
    return max_retries


class SdkClientOwner:
    """Owns `_client`, an SDK client with `close()`; usable as a context manager."""

    _client: Any

    def close(self) -> None:
        """Close the client's HTTP connections; the owner is unusable afterwards."""
        self._client.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
