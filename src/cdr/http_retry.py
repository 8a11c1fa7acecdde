"""How long to wait before retrying an HTTP call: shared by the LLM writers and the remote
embedder, so both honour a server's `Retry-After` the same way and spread retries alike."""

from __future__ import annotations

import email.utils
import random
from collections.abc import Mapping
from datetime import UTC, datetime


def retry_after_seconds(headers: Mapping[str, str]) -> float | None:
    """The server's requested wait: `retry-after-ms`, or `Retry-After` as seconds or a date."""
    ms = headers.get("retry-after-ms")
    if ms is not None:
        try:
            return max(0.0, float(ms) / 1000.0)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - datetime.now(UTC)).total_seconds())


def backoff_delay(
    attempt: int, backoff: float, max_backoff: float, retry_after: float | None = None
) -> float:
    """The server's wait when it named one, else `backoff · 2^attempt` plus up to 25 % jitter
    (so that many clients do not retry in step); never more than `max_backoff`."""
    if retry_after is not None:
        return min(retry_after, max_backoff)
    return min(backoff * 2**attempt * (1.0 + 0.25 * random.random()), max_backoff)
