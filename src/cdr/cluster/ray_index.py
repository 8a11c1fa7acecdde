"""`RayShardedIndex`: a `FactIndex` whose shards are served by Ray actors.

One actor per shard of a shard set (`cdr.cluster.shardset`), each mapping its own CKF directory
(`cdr.cluster.shard_server.ShardServer`). Global row numbers are the shards' rows laid end to end
(shard 0 first), so every per-row array the loop indexes is the concatenation of the shards'.

Per window the caller broadcasts the query and gate (`select`, the `FactIndex` contract: every
shard returns its top-`limit`, `merge_selections` keeps the global top-`limit`), or for
`rank_window` also the coverage centroid, residual matrix and blacklisted 6-grams, in one
round when the merge can be proven exact and a second to the shards where it cannot
(`cdr.cluster.shard_merge`); either way the result equals one index's exactly.

Faults: a call to a dead or restarting actor is retried until `retry_seconds` pass (actors are
created with `max_restarts`, and a restarted actor maps its shard again); a result from a
shard whose generation changed is refused (its rows would not match the arrays we hold); a
shard still down at the deadline raises `ShardUnavailableError` naming it (HTTP 503). A window
is never served from a subset of shards.

Addressing: `ray://HOST:PORT/PATH` — connect to the Ray cluster whose GCS listens on
HOST:PORT (the driver must run on a cluster node; this is *not* Ray Client) and serve the
shard set at the absolute PATH, which every node that runs a shard must see (one machine, or
a shared file system). Actors are named after the path in namespace "cdr", so several drivers
(gateway replicas) opening the same address share one set of actors.
"""

from __future__ import annotations

import contextlib
import hashlib
import socket
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from cdr import settings
from cdr.cluster.shard_merge import ShardTop, merge_window
from cdr.cluster.shard_server import ShardRows
from cdr.cluster.shard_view import ShardView
from cdr.errors import CdrError, InvalidInputError
from cdr.ranking import RANKING_MODES, Ranking
from cdr.retrieval.factindex import (
    Selection,
    WindowQuery,
    check_gate,
    merge_selections,
)
from cdr.vectors import check_query

if TYPE_CHECKING:
    from cdr.ngrams import NgramIndex
    from cdr.retrieval.embed import Embedder

SCHEME = "ray://"
NAMESPACE = "cdr"
DEFAULT_RETRY_SECONDS = 60.0
DEFAULT_MAX_RESTARTS = 3
RAY_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"}


class ShardUnavailableError(CdrError):
    """A shard could not serve a window: the request fails whole (HTTP 503, retry later)."""

    http_status = 503

    def __init__(self, shard: int, path: str | Path, reason: str) -> None:
        self.shard = shard
        super().__init__(f"shard-{shard} of {path} is unavailable: {reason}")


@dataclass(frozen=True, slots=True)
class RayAddress:
    """A parsed `ray://HOST:PORT/PATH`."""

    host: str
    port: int
    path: Path

    @property
    def gcs(self) -> str:
        return f"{self.host}:{self.port}"

    def __str__(self) -> str:
        return f"{SCHEME}{self.gcs}{self.path}"


def is_ray_address(value: object) -> bool:
    return isinstance(value, str) and value.startswith(SCHEME)


FORM = f"{SCHEME}HOST:PORT/ABS_PATH"


class BadIndexAddressError(InvalidInputError):
    """A malformed `ray://` address (CLI: exit 2). The message names the problem but never
    repeats the address: what follows `ray://` may carry a credential by mistake."""

    def __init__(self, problem: str) -> None:
        super().__init__(f"bad Ray index address: {problem}; want {FORM}, e.g. "
                         f"{SCHEME}127.0.0.1:6379/srv/kb.shards")


def parse_address(value: str) -> RayAddress:
    """`ray://127.0.0.1:6379/srv/kb.shards` → host, port, absolute shard-set path.

    The one parser of index addresses: `--ckf`, `CDR_CKF` (CLI and gateway settings) and
    `open_index` all come here, so an address means the same everywhere."""
    if not is_ray_address(value):
        raise BadIndexAddressError(f"it does not start with {SCHEME}")
    rest = value[len(SCHEME):]
    hostport, sep, path = rest.partition("/")
    if "@" in hostport:
        raise BadIndexAddressError("a Ray address carries no user or password (found '@')")
    if any(c in rest for c in "?#"):
        raise BadIndexAddressError("a query or fragment ('?', '#') is not part of it")
    if any(ord(c) < 32 or c.isspace() for c in rest):
        raise BadIndexAddressError("it contains whitespace or control characters")
    host, colon, port = hostport.rpartition(":")
    if not colon:
        raise BadIndexAddressError("no port after the host (HOST:PORT)")
    if not host:
        raise BadIndexAddressError("no host before the port")
    if not port.isascii() or not port.isdigit() or not 0 < int(port) < 65536:
        raise BadIndexAddressError("the port must be a number within 1..65535")
    if not sep or not path.strip("/"):
        raise BadIndexAddressError("no shard-set path after HOST:PORT")
    if ".." in Path(path).parts:
        raise BadIndexAddressError("the path must not contain '..'")
    return RayAddress(host, int(port), Path("/" + path.lstrip("/")))


CONNECT_SECONDS = 30.0  # how long connect() waits for a head's GCS port to accept


class RayHeadUnreachableError(CdrError):
    """No Ray head can be joined at an address: said within a bounded wait, naming the
    address, where `ray.init` would retry for many minutes (20 rounds of ~40 s)."""

    def __init__(self, address: str, reason: str) -> None:
        self.address = address
        super().__init__(f"cannot join the Ray head at {address}: {reason}")


def export_ray_env(address: str | None = None) -> None:
    """Export the `RAY_*` settings CDR joins Ray with, keeping values the user set. Ray reads
    them once, when `ray` is imported, so a process that imports `ray` itself (a test module,
    a notebook) calls this first; `connect` calls it too and then checks what Ray read."""
    settings.export(RAY_ENV, overwrite=False)
    if address:
        # Ray turns token auth on by itself only for a cluster it finds automatically; an
        # explicit address must ask for it (the token is read from RAY_AUTH_TOKEN_PATH, else
        # ~/.ray/auth_token).
        settings.export({"RAY_AUTH_MODE": "token"}, overwrite=False)


def _split_gcs(address: str) -> tuple[str, int] | None:
    host, colon, port = address.rpartition(":")
    if not colon or not host or not port.isdigit():
        return None
    return host.strip("[]"), int(port)


def _accepts(host: str, port: int, seconds: float) -> bool:
    """Whether a TCP connection to host:port succeeds within `seconds` (retried: a head that
    is starting opens its port a moment later)."""
    deadline = time.monotonic() + seconds
    while True:
        left = deadline - time.monotonic()
        try:
            with socket.create_connection((host, port), timeout=max(0.1, min(left, 2.0))):
                return True
        except OSError:
            if time.monotonic() + 0.2 >= deadline:
                return False
            time.sleep(0.2)


def _check_import_time_settings(address: str, imported_before: bool) -> None:
    """Raise if the settings Ray read on import cannot join `address`.

    Without RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 at import, Ray rewrites a loopback address to
    the machine's routable one (a head started with --node-ip-address=127.0.0.1 does not
    listen there) and retries for many minutes; without RAY_AUTH_MODE=token it sends no token
    and the head refuses it. Both checks use private parts of Ray, so a Ray without them is
    not checked."""
    fix = ("set RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 and RAY_AUTH_MODE=token in the "
           "environment before importing ray (or call cdr.cluster.ray_index.export_ray_env() "
           "first)")
    cause = "ray was imported before {name} was set" if imported_before else "{name} is not set"
    try:
        from ray._private import services
        dialled = services.canonicalize_bootstrap_address(address)
    except Exception:  # a Ray without these internals: nothing to check
        dialled = None
    if dialled and dialled != address:
        parsed = _split_gcs(dialled)
        if parsed and not _accepts(*parsed, 2.0):
            name = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0"
            raise RayHeadUnreachableError(
                address, f"{cause.format(name=name)}, so Ray would dial {dialled} instead, "
                         f"where nothing answers; {fix}")
    if settings.env("RAY_AUTH_MODE", "").lower() == "token":
        try:
            from importlib import import_module

            raylet: Any = import_module("ray._raylet")  # compiled: no types for mypy
            token_mode = raylet.get_authentication_mode() == raylet.AuthenticationMode.TOKEN
        except Exception:  # as above
            return
        if not token_mode:
            raise RayHeadUnreachableError(
                address, f"{cause.format(name='RAY_AUTH_MODE=token')}, so Ray would join "
                         f"without a token and the head would refuse it; {fix}")


def connect(address: str | None = None, *, wait_seconds: float = CONNECT_SECONDS,
            **init_kwargs: Any) -> None:
    """Join the Ray cluster at `address` (GCS HOST:PORT; None: `RAY_ADDRESS`, else a new local
    one), once per process, on loopback-safe settings.

    A head that does not accept connections within `wait_seconds`, or a `ray` imported too
    early to reach it, raises `RayHeadUnreachableError` naming the address instead of
    entering Ray's own retry loop, which a user sees as a hang."""
    from importlib.util import find_spec

    imported_before = "ray" in sys.modules
    export_ray_env(address)
    if find_spec("ray") is None:
        raise CdrError("Ray is not installed: pip install 'cdr-retrieval[ray]'")
    if imported_before and sys.modules["ray"].is_initialized():
        return
    gcs = _split_gcs(address) if address else None
    if gcs and not _accepts(*gcs, wait_seconds):
        raise RayHeadUnreachableError(
            address or "", f"no Ray head answers there within {wait_seconds:g} s (nothing "
                           "accepts connections on that port: start one with `ray start "
                           "--head --port PORT`, or fix the address)")
    import ray

    if ray.is_initialized():
        return
    if address and gcs:
        _check_import_time_settings(address, imported_before)
    try:
        ray.init(address=address, namespace=NAMESPACE, log_to_driver=False, **init_kwargs)
    except ConnectionError as exc:
        if not address:
            raise
        raise RayHeadUnreachableError(address, f"Ray could not join it: {exc}") from exc


def _actor_class() -> Any:
    import ray

    from cdr.cluster.shard_server import ShardServer

    return ray.remote(ShardServer)


def _retryable() -> tuple[type[BaseException], ...]:
    from ray import exceptions as rex

    kinds: list[type[BaseException]] = [rex.RayActorError, rex.GetTimeoutError]
    for name in ("ActorUnavailableError", "ActorDiedError"):
        if hasattr(rex, name):
            kinds.append(getattr(rex, name))
    return tuple(kinds)


START_SECONDS = 120.0  # how long opening waits for the shard actors' first answer


class RayShardedIndex:
    """A read-only `FactIndex` over a shard set served by Ray actors (see module doc)."""

    def __init__(self, root: str | Path, *, retry_seconds: float = DEFAULT_RETRY_SECONDS,
                 max_restarts: int = DEFAULT_MAX_RESTARTS, embedder: Embedder | None = None,
                 label: str | None = None) -> None:
        import ray

        from cdr.cluster.shardset import check_shard_model, read_manifest
        from cdr.ngrams import NgramIndex  # noqa: F401  (fail early if numpy stack is broken)

        if not ray.is_initialized():
            raise CdrError("Ray is not connected: call cdr.cluster.ray_index.connect() first")
        self._set = read_manifest(root)
        self._label = label or str(self._set.root)
        self.retry_seconds = float(retry_seconds)
        self._max_restarts = max_restarts
        self._retryable = _retryable()
        tag = hashlib.sha256(str(self._set.root).encode()).hexdigest()[:12]
        cls = _actor_class()
        self._actors = [
            cls.options(name=f"shard:{tag}:{i}", namespace=NAMESPACE, get_if_exists=True,
                        max_restarts=max_restarts, max_task_retries=0, num_cpus=0,
                        lifetime="detached").remote(str(p), i)
            for i, p in enumerate(self._set.paths)]
        # A shard whose actor is being created (a new process importing numpy and mapping its
        # files: tens of seconds on a loaded machine) is starting, not down.
        parts: list[ShardRows] = self._gather("rows", [() for _ in self._actors],
                                              check_gen=False,
                                              seconds=max(self.retry_seconds, START_SECONDS))
        for i, r in enumerate(parts):
            check_shard_model(self._set.model_id, r.model_id, i, self._set.dim, r.dim)
        self._gens = [r.generation for r in parts]
        sizes = [r.n_rows for r in parts]
        self._offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        # The shards' per-row arrays merged in shard order: fixed for this object's life, so
        # plain attributes (the `FactIndex` properties of the same names).
        # A fact several shards hold is read once (cdr.cluster.shard_view): the others'
        # rows hidden, the kept row at the best importance, on the shards and here.
        self._views = self._shared_fact_views(parts)
        self.active = (np.concatenate([v.active(r.active) for v, r in zip(self._views, parts,
                                                                          strict=True)])
                       if parts else np.zeros(0, bool))
        self.importance = np.concatenate([
            v.raise_importance(np.asarray(r.importance, np.float32))
            for v, r in zip(self._views, parts, strict=True)]).astype(np.float32)
        self.token_counts = np.concatenate([r.token_counts for r in parts]).astype(np.int32)
        hashes = [r.ngram_hashes for r in parts]
        offs = [r.ngram_offsets[:-1] + base for r, base in
                zip(parts, np.cumsum([0] + [len(h) for h in hashes])[:-1], strict=True)]
        self.ngram_offsets = np.concatenate(
            [*offs, [sum(len(h) for h in hashes)]]).astype(np.int64)
        self.ngram_hashes = np.concatenate(hashes).astype(np.uint64)
        if embedder is not None:
            from cdr.retrieval.fact_recipe import bind

            embedder = bind(embedder, self.model_id)
        self._embedder = embedder
        digest = hashlib.sha256(repr((str(self._set.root), self._gens)).encode()).digest()
        self._generation = int.from_bytes(digest[:7], "big")
        self.rounds = 0  # fan-out rounds the last rank_window took (1, or 2 when unproven)

    def _shared_fact_views(self, parts: Sequence[ShardRows]) -> list[ShardView]:
        from cdr.cluster.shard_view import shared_fact_views

        if len(parts) < 2:
            return [ShardView() for _ in parts]
        ids = self._gather("active_ids", [(g,) for g in self._gens])

        def holders(shard: int, rows: np.ndarray) -> list[tuple[int, str]]:
            out: list[tuple[int, str]] = self._gather(
                "holders", [(rows.tolist(), self._gens[shard])], shards=[shard])[0]
            return out

        return shared_fact_views([tuple(x) for x in ids],
                                 [np.asarray(r.importance, np.float32) for r in parts], holders)

    # ------------------------------------------------------------------ calls with retry

    def _gather(self, method: str, args: Sequence[tuple[Any, ...]], *, check_gen: bool = True,
                shards: Sequence[int] | None = None, seconds: float | None = None
                ) -> list[Any]:
        """Call `method(*args[j])` on shards (all, or `shards`) in parallel; retry the ones
        that fail until `seconds` (default `retry_seconds`) pass; every result or a
        `ShardUnavailableError`."""
        import ray

        which = list(range(len(self._actors))) if shards is None else list(shards)
        wait = self.retry_seconds if seconds is None else seconds
        deadline = time.monotonic() + wait
        results: dict[int, Any] = {}
        pending = dict(zip(which, args, strict=True))
        last_error: dict[int, str] = {}
        while pending:
            refs = {i: getattr(self._actors[i], method).remote(*a) for i, a in pending.items()}
            got: dict[int, Any] = {}
            # One get for all (the common case): a get per shard costs a wake-up each. On a
            # failure, the answers are sorted from the failures one by one below.
            with contextlib.suppress(*self._retryable):
                got = dict(zip(refs, ray.get(list(refs.values()), timeout=max(
                    0.1, deadline - time.monotonic())), strict=True))
            for i, ref in refs.items():
                try:
                    out = got[i] if i in got else ray.get(
                        ref, timeout=max(0.1, deadline - time.monotonic()))
                except self._retryable as e:
                    last_error[i] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
                    continue
                if check_gen and method != "pid":
                    gen, out = out[0], out[1:] if len(out) > 2 else out[1]
                    if gen != self._gens[i]:
                        raise ShardUnavailableError(
                            i, self._label, f"it now serves generation {gen}, not "
                            f"{self._gens[i]} (the shard changed); reopen the index")
                results[i] = out
                del pending[i]
            if pending:
                if time.monotonic() >= deadline:
                    i = min(pending)
                    raise ShardUnavailableError(
                        i, self._label, f"no answer within {wait:g} s "
                        f"({last_error.get(i, 'timed out')})")
                time.sleep(0.2)
        return [results[i] for i in which]

    @property
    def generations(self) -> list[int]:
        """Each shard's generation this index was built on."""
        return list(self._gens)

    def refresh(self) -> list[int]:
        """Ask every actor to map its shard's newest state; the generations they now serve
        (differing from `generations`: open a new index to serve them)."""
        return self._gather("refresh", [() for _ in self._actors], check_gen=False)

    def reopened(self) -> RayShardedIndex:
        """A new index on the shards' newest states, sharing this one's actors and settings
        (this one keeps answering for requests still using it)."""
        return RayShardedIndex(self._set.root, retry_seconds=self.retry_seconds,
                               embedder=self._embedder, label=self._label,
                               max_restarts=self._max_restarts)

    def shard_pids(self) -> list[int]:
        """The process serving each shard (what an operator — or a test — kills)."""
        return self._gather("pid", [() for _ in self._actors], check_gen=False)

    # ------------------------------------------------------------------ FactIndex

    @property
    def model_id(self) -> str:
        return self._set.model_id

    @property
    def dim(self) -> int:
        return self._set.dim

    @property
    def n_shards(self) -> int:
        return self._set.n_shards

    @property
    def embedder(self) -> Embedder:
        if self._embedder is None:
            from cdr.cluster.shardset import check_shard_model
            from cdr.retrieval.embed import embedder_for
            from cdr.retrieval.fact_recipe import bind

            # The local model (or path) of the shards' identity, bound to their recipe.
            candidate = bind(embedder_for(self.model_id), self.model_id)
            check_shard_model(self.model_id, candidate.model_id, None, self.dim,
                              int(candidate.dim))
            self._embedder = candidate
        return self._embedder

    @property
    def path(self) -> str:
        return self._label

    @property
    def generation(self) -> int:
        return self._generation

    @property
    def n_rows(self) -> int:
        return int(self._offsets[-1])

    @cached_property
    def ngram_index(self) -> NgramIndex:
        """Built on first use: the merged arrays never change for this object's life."""
        from cdr.ngrams import NgramIndex

        return NgramIndex(self.ngram_offsets, self.ngram_hashes)

    def select(self, query_vector: Any, min_relevance: float,
               limit: int | None = None) -> Selection:
        q = check_query(query_vector, self.dim, model_id=self.model_id, unit=True)
        gate, limit = check_gate(min_relevance, limit)
        parts = self._gather("select", [(q, gate, limit, int(self._offsets[i]), self._gens[i],
                                         self._view(i)) for i in range(self.n_shards)])
        return merge_selections(parts, limit, self.dim)

    def _view(self, shard: int) -> ShardView | None:
        """What shard `shard` hides or raises (None: nothing; the call stays as small)."""
        view = self._views[shard]
        return None if view.empty else view

    def _split(self, rows: Iterable[int] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        r = np.asarray(list(rows) if not isinstance(rows, np.ndarray) else rows, np.int64)
        if len(r) and (r.min() < 0 or r.max() >= self.n_rows):
            bad = int(r[(r < 0) | (r >= self.n_rows)][0])
            raise InvalidInputError(f"row {bad} is out of range 0..{self.n_rows - 1}")
        return r, np.searchsorted(self._offsets, r, side="right") - 1

    def _per_shard(self, method: str, rows: Iterable[int] | np.ndarray) -> list[Any]:
        """`method(local rows)` on each owning shard, results put back in `rows`' order."""
        r, shard = self._split(rows)
        out: list[Any] = [None] * len(r)
        owners = sorted(set(shard.tolist()))
        asked = [(list((r[shard == s] - self._offsets[s]).tolist()), self._gens[s])
                 for s in owners]
        answers = self._gather(method, asked, shards=owners)
        for s, ans in zip(owners, answers, strict=True):
            for pos, item in zip(np.flatnonzero(shard == s), ans, strict=True):
                out[pos] = item
        return out

    def facts(self, rows: Iterable[int] | np.ndarray) -> list[Any]:
        r, _ = self._split(rows)
        got = self._per_shard("facts", r)
        return [replace(f, row=int(g)) for f, g in zip(got, r, strict=True)]

    def fact_ids(self, rows: Iterable[int] | np.ndarray) -> list[str]:
        return self._per_shard("fact_ids", rows)

    def vectors(self, rows: Iterable[int] | np.ndarray) -> np.ndarray:
        got = self._per_shard("vectors", rows)
        if not got:
            return np.zeros((0, self.dim), np.float32)
        return np.stack(got).astype(np.float32, copy=False)

    def stats(self) -> dict[str, Any]:
        per = self._gather("stats", [(g,) for g in self._gens])
        keys = ("rows", "active_facts", "active_tokens", "documents", "stale_documents",
                "ngram_hashes", "size_bytes", "code_facts")
        out: dict[str, Any] = {k: sum(int(p.get(k, 0)) for p in per) for k in keys}
        out.update(path=self.path, model_id=self.model_id, dim=self.dim,
                   dtype=self._set.dtype, generation=self.generation, shards=per)
        return out

    def documents(self) -> list[dict[str, Any]]:
        """Every shard's documents, each once with its `shard`
        (`cdr.cluster.shardset.merge_documents`)."""
        from cdr.cluster.shardset import merge_documents

        return merge_documents(self._gather("documents", [(g,) for g in self._gens]))

    def close(self, *, stop_actors: bool = False) -> None:
        """Forget the actors; `stop_actors=True` also ends them (they are detached, shared
        by every driver that opened this path, so by default they keep serving)."""
        if stop_actors:
            import ray

            for a in self._actors:
                ray.kill(a, no_restart=True)
        self._actors = []

    # ------------------------------------------------------------------ shard-side ranking

    def rank_window(self, w: WindowQuery) -> tuple[Ranking, np.ndarray, np.ndarray, list[str]]:
        """Phase 1 + Phase 2 ranked on the shards, merged: (ranking of the best `w.top_k`,
        their embeddings ((k, 0) when `w.vectors` is false), token counts, fact ids). Equal
        to `rank()` over `select()` of one index holding all rows. One round: each shard
        ranks its own Phase 1 selection and sends its best with its selection's head; the
        caller finds the global cut-off and merges, and asks again only the shards whose
        answer cannot prove the merge (`cdr.cluster.shard_merge`; `self.rounds` says which
        happened). MMR is sequential (each pick depends on all earlier ones), so for
        it the gated pool is fetched with `select` and ranked here."""
        from cdr.ranking import check_mode

        check_mode(w.mode)
        q = check_query(w.query, self.dim, model_id=self.model_id, unit=True)
        gate, limit = check_gate(w.gate, w.limit)
        if w.mode not in ("cdr", "relevance"):
            raise InvalidInputError(f"rank_window ranks on shards for cdr and relevance; "
                                    f"rank {w.mode!r} centrally over select() "
                                    f"(modes: {RANKING_MODES})")
        w = replace(w, query=q, gate=gate, limit=limit)  # what the shards see is checked
        offs = [int(o) for o in self._offsets[:-1]]
        gens = self._gens
        tops: list[ShardTop] = self._gather(
            "rank", [(w, None, offs[i], gens[i], self._view(i)) for i in range(len(offs))])

        def ask_again(shards: list[int], cut: tuple[float, int]) -> list[ShardTop]:
            return self._gather("rank", [(w, cut, offs[i], gens[i], self._view(i))
                                         for i in shards], shards=shards)

        ranking, emb, tokens, ids, again = merge_window(tops, limit, w.top_k, self.dim, w.mode,
                                                        ask_again)
        self.rounds = 2 if again else 1
        return ranking, emb, tokens, ids


def open_index(address: str, **kwargs: Any) -> RayShardedIndex:
    """Connect to the cluster named by `ray://HOST:PORT/PATH` and open the shard set there."""
    addr = parse_address(address)
    connect(addr.gcs)
    return RayShardedIndex(addr.path, label=str(addr), **kwargs)
