"""The gateway's view of a shard set served by Ray (`cdr serve --ckf ray://HOST:PORT/PATH`).

The `KnowledgeBase` protocol (`cdr.gateway.knowledge_base`, whose `WatchedKnowledgeBase` holds
what it shares with the local backend), over a `RayShardedIndex`: the index is
one committed state of every shard, so request handlers take it once per request exactly as
they take a local snapshot, and the selection cache, keyed by the index's generation, stays
correct.

Following changes: a watcher thread asks the actors to `refresh` (each maps its shard's newest
state if it changed: an upload through any replica, or `cdr ingest --shards` from outside)
and, if any generation moved, opens a new index on the same actors, warms it and swaps it in.
Requests still holding the old index finish on it: the actors keep the last few states
mapped (`shard_server.KEEP_GENERATIONS`).

Writes: an upload's documents go to the shard `shardset.shard_of(source, S)` names — the
placement of `cdr ingest --shards` — and are ingested there by this process through the CKF's
own committer (same batches, same crash safety, the CKF's file lock against other writers), on
one writer thread; then the index is reloaded before the job says it succeeded. This needs
the shard set's directory on this machine (one machine or a shared file system, as the actors
need it). A delete finds the document in its owning shard (by source), or shard by shard (by
id).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from concurrent.futures import Future
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cdr.gateway.knowledge_base import WatchedKnowledgeBase

if TYPE_CHECKING:
    from cdr.ckf.handle import CKF
    from cdr.retrieval.factindex import FactIndex

log = logging.getLogger("cdr.gateway")


def index_root(index: Any) -> Path:
    """Where an index lives on this machine: a CKF's directory, or a Ray-served shard set's
    (the PATH of `ray://HOST:PORT/PATH`), e.g. to put the session database beside it."""
    from cdr.cluster.ray_index import is_ray_address, parse_address

    where = str(index.path)
    return parse_address(where).path if is_ray_address(where) else Path(where)


class ShardSetKnowledgeBase(WatchedKnowledgeBase):
    """Holds the current Ray-served index of one shard set (see module doc)."""

    def __init__(self, index: Any, root: Path, watch_seconds: float = 1.0) -> None:
        from cdr.cluster.shardset import read_manifest

        super().__init__(index, watch_seconds=watch_seconds, name="shard")
        self.address = str(index.path)
        self.path = root  # the shard set's directory: where sessions default to
        self._set = read_manifest(root)
        self._shard_ckfs: dict[int, CKF] = {}

    # ------------------------------------------------------------------ readers

    def current(self) -> FactIndex:
        return self._current  # type: ignore[no-any-return]

    def latest(self) -> FactIndex:
        """`current()` after catching up with the shards now (views of the CKF itself)."""
        self.reload()
        return self._current  # type: ignore[no-any-return]

    def reload(self) -> bool:
        """Have the actors map their shards' newest states; if any moved, swap in a warmed
        index on them. True if it changed."""
        with self._lock:
            old = self._current
            if old.refresh() == old.generations:
                return False
            fresh = old.reopened()
            _ = fresh.ngram_index  # build before readers see it
            self._current = fresh  # the old one keeps serving requests that hold it
            log.info("shard set %s: now at generations %s (%d active facts)", self.address,
                     fresh.generations, int(fresh.active.sum()))
            return True

    def _poll(self) -> None:
        self.reload()  # asking the actors to refresh is the check

    # ------------------------------------------------------------------ writers

    def _shard_ckf(self, shard: int) -> CKF:
        """Shard `shard`'s CKF, opened for writes (writer thread only; on first use)."""
        if shard not in self._shard_ckfs:
            from cdr.ckf.handle import CKF

            self._shard_ckfs[shard] = CKF.open(self._set.paths[shard])
        return self._shard_ckfs[shard]

    def writable_ckf(self) -> CKF:
        """There is no single writable CKF: uploads are split by `route`."""
        raise NotImplementedError("a shard set writes each shard's CKF; use route()")

    def route(self, sources: Sequence[str]) -> list[tuple[CKF, list[int]]]:
        """(the owning shard's CKF, positions in `sources`) per shard that owns any —
        the placement `cdr ingest --shards` uses. Writer thread only."""
        from cdr.cluster.shardset import shard_of

        groups: dict[int, list[int]] = {}
        for pos, source in enumerate(sources):
            groups.setdefault(shard_of(source, self._set.n_shards), []).append(pos)
        out = []
        for i in sorted(groups):
            ckf = self._shard_ckf(i)
            ckf.refresh()  # another replica or `cdr ingest --shards` may have written
            out.append((ckf, groups[i]))
        return out

    def delete_document(self, doc: str) -> Future[tuple[str, int]]:
        """Delete `doc` (id or source) from its shard on the writer thread: (doc id, facts
        removed); `NotFoundError` if no shard holds it."""
        from cdr.cluster.shardset import delete_from_shards

        def fresh_shard(i: int) -> AbstractContextManager[CKF]:
            ckf = self._shard_ckf(i)
            ckf.refresh()  # another replica or `cdr ingest --shards` may have written
            return nullcontext(ckf)  # it stays open for later writes

        def run() -> tuple[str, int]:
            _, found, removed = delete_from_shards(doc, self._set.n_shards, fresh_shard,
                                                   f"no document {doc!r} in the CKF")
            return str(found["doc_id"]), removed

        return self.submit(run)

    def close(self) -> None:
        """Stop watching and writing; forget the actors (detached: they keep serving other
        drivers)."""
        super().close()
        for ckf in self._shard_ckfs.values():
            ckf.close()
        self._current.close()
