"""The gateway's view of a shard set served by Ray (`cdr serve --ckf ray://HOST:PORT/PATH`).

The same reader interface as `ckf_snapshots.KnowledgeBase` (current, latest, is_empty, warm,
start_watching, close), over one `RayShardedIndex`: the index is one committed state of every
shard (a shard whose generation changes is refused by it), so request handlers take it once
per request exactly as they take a local snapshot, and the selection cache, keyed by the
index's generation, stays correct.

Writes are not routed yet: an upload would have to go to the shard that owns the document
(`cdr.shardset.shard_of`) and the index reopened on the new generations. Until then every
write refuses with a 501 JSON error that names the command that does it (`cdr ingest
--shards`), rather than writing somewhere the readers never look.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

from cdr.gateway.errors import ApiError

if TYPE_CHECKING:
    from cdr.factindex import FactIndex

log = logging.getLogger("cdr.gateway")
_T = TypeVar("_T")


def index_root(index: Any) -> Path:
    """Where an index lives on this machine: a CKF's directory, or a Ray-served shard set's
    (the PATH of `ray://HOST:PORT/PATH`), e.g. to put the session database beside it."""
    from cdr.ray_index import is_ray_address, parse_address

    where = str(index.path)
    return parse_address(where).path if is_ray_address(where) else Path(where)


def shard_set_read_only(address: str) -> ApiError:
    """The refusal every CKF write on a shard set gets (501: not implemented for this
    backend, the request itself is fine)."""
    return ApiError(
        501, f"the gateway serves the shard set {address} read-only: add or delete documents "
        "with `cdr ingest PATH --shards N --ckf DIR` (or `cdr ingest --ray ...`) on the shard "
        "set's directory and restart the gateway (README, Deployment)",
        code="shard_set_read_only")


class ShardSetKnowledgeBase:
    """Holds the Ray-served index of one shard set; refuses writes (see module doc)."""

    def __init__(self, index: Any, root: Path) -> None:
        self._index = index
        self.address = str(index.path)
        self.path = root  # the shard set's directory: where sessions default to
        self._empty: bool | None = None

    def current(self) -> FactIndex:
        return self._index

    def latest(self) -> FactIndex:
        return self._index

    @staticmethod
    def is_empty(snapshot: FactIndex | None) -> bool:
        return snapshot is None or not bool(snapshot.active.any())

    def current_is_empty(self) -> bool:
        if self._empty is None:
            self._empty = self.is_empty(self._index)
        return self._empty

    def warm(self) -> None:
        """Load the embedding model and build the n-gram index before the first request."""
        _ = self._index.embedder
        _ = self._index.ngram_index

    def reload(self) -> bool:
        return False

    def start_watching(self) -> None:
        """Nothing to watch: the index is one state of the shards until the gateway restarts."""

    def check_writable(self) -> NoReturn:
        """Called by write routes before they read the request body."""
        self._refuse()

    def _refuse(self) -> NoReturn:
        raise shard_set_read_only(self.address)

    def writer(self) -> NoReturn:
        self._refuse()

    def submit(self, fn: Callable[[], _T]) -> Future[_T]:
        self._refuse()

    def submit_write(self, fn: Callable[[Any], _T]) -> Future[_T]:
        self._refuse()

    def close(self) -> None:
        """Forget the actors; they are detached and keep serving other drivers."""
        self._index.close()
