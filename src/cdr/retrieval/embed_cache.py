"""An opt-in store of embedding vectors that processes share: `CDR_EMBED_CACHE=<dir>`.

Embedding is most of what ingest and a gateway's sessions cost (the model's forward pass), and
the same texts come back: a CKF rebuilt or re-ingested from the same documents, a `reembed`
resumed, every worker or replica of a gateway on one machine embedding the same tasks and
windows, a test suite's many servers. With the cache on, the bundled local model's vectors are
kept in one SQLite file in that directory, keyed by

- the vectors' *identity* (`identity`): the model id (`+int8` for the int8 path, SPEC-024
  §2.5) and what the vectors are made from — the model files (path, size, modification time),
  the source of the forward pass and the numeric libraries' versions — so a reinstalled model
  or another cdr never reads vectors that were not its own;
- the exact text the model is given (its SHA-256). A fact recipe's title and section are
  already in that text (`cdr.retrieval.fact_recipe`), so recipes need nothing of their own.

A hit returns the float32 bytes the model returned when the text was stored, bit for bit. The
file is in WAL mode, so xdist workers, gateway workers and replicas on one machine read and
write it at once (on a local disk: SQLite's locks do not hold over network file systems).

The cache can cost speed, never a result: a file that cannot be opened, read or written
(corrupt, unreadable, a full disk, locked past the busy timeout) is reported once per process
as a warning, and the model embeds as if the cache were off. Remote embedders are not cached:
their model name is the server's, and cdr cannot tell that two servers, or one server over
time, give the same vectors for it. Nothing is ever evicted: a vector of the default model
takes about 1.6 kB, and deleting the directory empties the cache.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import logging
import os
import sqlite3
import threading
from collections.abc import Callable, Iterable
from importlib import metadata
from pathlib import Path

import numpy as np

from cdr import settings

__all__ = ["CACHE_ENV", "FILE_NAME", "EmbeddingCache", "configured", "identity"]

CACHE_ENV = "CDR_EMBED_CACHE"
FILE_NAME = "embeddings.sqlite3"
# How long a writer waits for another process's write before giving up (and, with it, the
# cache for the rest of this process): writes are one short transaction per `encode` call.
BUSY_SECONDS = 10.0
# Digests per SELECT: well under SQLite's limit on bound parameters.
LOOKUP_CHUNK = 500
VECTOR_DTYPE = np.dtype("<f4")  # stored little-endian whatever the machine

log = logging.getLogger(__name__)

Progress = Callable[[int], None]


def _file_fingerprint(path: Path) -> list[object]:
    resolved = path.resolve()
    try:
        st = resolved.stat()
    except OSError:
        return [str(resolved), None, None]
    return [str(resolved), st.st_size, st.st_mtime_ns]


def _module_source_digest(name: str) -> str:
    """SHA-256 of a module's source file: an edit to the forward pass changes the identity
    without anyone having to remember to; the module's name alone when it has no source."""
    spec = importlib.util.find_spec(name)
    origin = spec.origin if spec is not None else None
    try:
        return hashlib.sha256(Path(origin).read_bytes()).hexdigest() if origin else name
    except OSError:
        return name


def _package_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def identity(model_id: str, *, files: Iterable[Path], modules: Iterable[str],
             packages: Iterable[str]) -> str:
    """The key under which the vectors of one local model are kept: `<model id>@<digest>`, the
    digest over the model's `files` (path, size, modification time), the source of the
    `modules` that compute the vectors and the versions of the `packages` they run on."""
    made_of = {
        "files": [_file_fingerprint(Path(f)) for f in files],
        "modules": {m: _module_source_digest(m) for m in modules},
        "packages": {p: _package_version(p) for p in packages},
    }
    digest = hashlib.sha256(json.dumps(made_of, sort_keys=True).encode()).hexdigest()[:32]
    return f"{model_id}@{digest}"


def _digest(text: str) -> bytes:
    # surrogatepass: a lone surrogate is a valid str the model can be given, and must key too.
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()


class EmbeddingCache:
    """The vectors kept in `<directory>/embeddings.sqlite3`; each process opens the file on
    first use (and again after a fork), and one connection serves all of its threads."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory).expanduser()
        self.path = self.directory / FILE_NAME
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        self._pid: int | None = None
        # A connection inherited across a fork is never used or closed by the child (closing
        # it could disturb the parent's locks): kept here until the process ends.
        self._inherited: list[sqlite3.Connection] = []
        self.broken = False  # after the first failure the model embeds, without the cache

    def __repr__(self) -> str:
        return f"EmbeddingCache({str(self.directory)!r})"

    def encode(self, ident: str, dim: int, texts: list[str],
               embed: Callable[[list[str]], np.ndarray],
               progress: Progress | None = None) -> np.ndarray:
        """float32 (len(texts), dim): the kept vector of each text under `ident`, and
        `embed(missing texts)` for the rest, which are then kept. `progress(k)` is told the
        hits at once; `embed` reports its own texts."""
        digests = [_digest(t) for t in texts]
        found = self._lookup(ident, digests, dim)
        out = np.empty((len(texts), dim), dtype=np.float32)
        missing = [i for i, d in enumerate(digests) if d not in found]
        for i, d in enumerate(digests):
            if d in found:
                out[i] = np.frombuffer(found[d], dtype=VECTOR_DTYPE)
        if progress is not None and len(missing) < len(texts):
            progress(len(texts) - len(missing))
        if missing:
            vecs = np.asarray(embed([texts[i] for i in missing]), dtype=np.float32)
            out[missing] = vecs
            self._store(ident, [(digests[i], vecs[k]) for k, i in enumerate(missing)])
        return out

    # ------------------------------------------------------------------ the file

    def _connection(self) -> sqlite3.Connection:
        """This process's connection (the caller holds `_lock`)."""
        if self._conn is not None and self._pid == os.getpid():
            return self._conn
        if self._conn is not None:
            self._inherited.append(self._conn)
            self._conn = None
        self.directory.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(self.path, timeout=BUSY_SECONDS, isolation_level=None,
                               check_same_thread=False)
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")  # a lost last write is only a miss
            conn.execute("CREATE TABLE IF NOT EXISTS vectors (identity TEXT NOT NULL, "
                         "digest BLOB NOT NULL, vector BLOB NOT NULL, "
                         "PRIMARY KEY (identity, digest)) WITHOUT ROWID")
        except BaseException:
            conn.close()
            raise
        self._conn, self._pid = conn, os.getpid()
        return conn

    def _lookup(self, ident: str, digests: list[bytes], dim: int) -> dict[bytes, bytes]:
        """{digest: vector bytes} of the texts kept under `ident` (a row of another width,
        which only a damaged file holds, counts as missing)."""
        if self.broken:
            return {}
        wanted = list(dict.fromkeys(digests))
        found: dict[bytes, bytes] = {}
        try:
            with self._lock:
                conn = self._connection()
                for start in range(0, len(wanted), LOOKUP_CHUNK):
                    part = wanted[start:start + LOOKUP_CHUNK]
                    marks = ",".join("?" * len(part))
                    found.update(conn.execute(
                        "SELECT digest, vector FROM vectors WHERE identity = ? AND digest IN "
                        f"({marks})", [ident, *part]).fetchall())
        except (sqlite3.Error, OSError) as exc:
            self._give_up("read", exc)
            return {}
        size = dim * VECTOR_DTYPE.itemsize
        return {d: v for d, v in found.items() if isinstance(v, bytes) and len(v) == size}

    def _store(self, ident: str, rows: list[tuple[bytes, np.ndarray]]) -> None:
        """Keeps new vectors; a text another process stored meanwhile keeps its first vector
        (so every reader sees one vector per text), unless that row was damaged."""
        if self.broken:
            return
        params = [(ident, d, np.ascontiguousarray(v, dtype=VECTOR_DTYPE).tobytes())
                  for d, v in rows]
        try:
            with self._lock:
                conn = self._connection()
                conn.execute("BEGIN IMMEDIATE")
                try:
                    conn.executemany(
                        "INSERT INTO vectors (identity, digest, vector) VALUES (?, ?, ?) "
                        "ON CONFLICT (identity, digest) DO UPDATE SET vector = excluded.vector"
                        " WHERE length(vectors.vector) != length(excluded.vector)", params)
                    conn.execute("COMMIT")
                except BaseException:
                    with contextlib.suppress(sqlite3.Error):
                        conn.execute("ROLLBACK")
                    raise
        except (sqlite3.Error, OSError) as exc:
            self._give_up("write", exc)

    def _give_up(self, what: str, exc: BaseException) -> None:
        with self._lock:
            if self.broken:
                return
            self.broken = True
        log.warning("%s: cannot %s the embedding cache (%s: %s); embedding without it in this "
                    "process", self.path, what, type(exc).__name__, exc)


_caches: dict[Path, EmbeddingCache] = {}
_caches_lock = threading.Lock()


def configured() -> EmbeddingCache | None:
    """The cache `CDR_EMBED_CACHE` names now (read at each call, like every setting), or None
    when it is unset or empty: the cache is off by default."""
    raw = settings.env(CACHE_ENV, "").strip()
    if not raw:
        return None
    directory = Path(raw).expanduser()
    with _caches_lock:
        cache = _caches.get(directory)
        if cache is None:
            cache = _caches[directory] = EmbeddingCache(directory)
        return cache
