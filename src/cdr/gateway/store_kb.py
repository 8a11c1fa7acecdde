"""A vector store's collection as one of the gateway's knowledge bases (`cdr.stores`): read
once when the gateway starts, served like any index, never written here.

Uploads and deletes are refused with a 409 (`read_only_kb`): the collection belongs to the
pipeline that fills it, and cdr reads it as it is. Restart the gateway to read a changed
collection; there is no watcher (a store has no commit counter to follow cheaply).
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cdr.gateway.errors import ApiError
from cdr.gateway.knowledge_base import WatchedKnowledgeBase

if TYPE_CHECKING:
    from cdr.ckf.handle import CKF


def _read_only(index: Any) -> ApiError:
    return ApiError(409, f"this knowledge base is an external collection "
                    f"({type(index).__name__}), read-only here: add or remove its documents "
                    "in the store itself, then restart the gateway", code="read_only_kb")


class StoreKnowledgeBase(WatchedKnowledgeBase):
    """Holds the in-memory index of one external collection (see module doc)."""

    path: Path | None = None  # nothing of it lives on this machine's disk for cdr to use

    def __init__(self, index: Any) -> None:
        super().__init__(index, name="store")

    def reload(self) -> bool:
        return False

    def latest(self) -> Any:
        return self._current

    def _can_watch(self) -> bool:
        return False

    def check_writable(self) -> None:
        raise _read_only(self._current)

    def route(self, sources: Sequence[str]) -> list[tuple[CKF, list[int]]]:
        raise _read_only(self._current)

    def delete_document(self, doc: str) -> Future[tuple[str, int]]:
        raise _read_only(self._current)
