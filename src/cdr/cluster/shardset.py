"""A shard set: one knowledge base split into S ordinary CKF directories.

Layout of a shard set directory::

    ROOT/shards.json      {"format": "cdr-shard-set", "version": 1, "shards": S,
                           "model_id": ..., "dim": ..., "dtype": ...}
    ROOT/shard-0 ... ROOT/shard-(S-1)   each a complete CKF (same format as `cdr ingest`)

A document lives in exactly one shard, chosen by a stable hash of its source (path or URL,
the key re-ingest recognises a document by): `shard_of(source, S)`. So re-ingesting or
deleting a document opens only its owning shard, and any shard can be opened on its own with
every CKF tool. All shards must hold vectors of one embedding model: cosine across models is
meaningless, so a set mixing two model ids is refused, naming both.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager, closing
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cdr.errors import EmbeddingModelMismatchError, InvalidInputError, NotFoundError

if TYPE_CHECKING:
    from cdr.ckf.handle import CKF
    from cdr.ckf.ingest import IngestProgress, IngestReport
    from cdr.retrieval.embed import Embedder

MANIFEST = "shards.json"
FORMAT = "cdr-shard-set"
VERSION = 1
MAX_SHARDS = 256


def shard_of(source: str, n_shards: int) -> int:
    """The shard owning document `source`: sha256 of its UTF-8 bytes, first 8 bytes, mod S.
    Stable across processes, machines and Python versions (unlike `hash()`)."""
    digest = hashlib.sha256(source.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % n_shards


def shard_dir(root: Path, i: int) -> Path:
    return root / f"shard-{i}"


def is_shard_set(path: str | os.PathLike[str]) -> bool:
    return (Path(path) / MANIFEST).is_file()


def check_shard_count(n: Any) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_SHARDS:
        raise InvalidInputError(f"--shards must be an integer within 1..{MAX_SHARDS}, got {n!r}")
    return n


@dataclass(frozen=True, slots=True)
class ShardSet:
    """A shard set's manifest, checked against its shards."""

    root: Path
    n_shards: int
    model_id: str
    dim: int
    dtype: str

    @property
    def paths(self) -> list[Path]:
        return [shard_dir(self.root, i) for i in range(self.n_shards)]

    def owner(self, source: str) -> Path:
        return shard_dir(self.root, shard_of(source, self.n_shards))

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, "version": VERSION, "shards": self.n_shards,
                "model_id": self.model_id, "dim": self.dim, "dtype": self.dtype}


def read_manifest(root: str | os.PathLike[str]) -> ShardSet:
    """The manifest of the shard set at `root`, or a clear error."""
    root = Path(root).expanduser().resolve()
    try:
        data = json.loads((root / MANIFEST).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise NotFoundError(f"no shard set at {root} (missing {MANIFEST}); create one with "
                            "`cdr ingest PATH --ckf DIR --shards S`") from None
    except (OSError, ValueError) as e:
        raise InvalidInputError(f"unreadable shard manifest {root / MANIFEST}: {e}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise InvalidInputError(f"{root / MANIFEST} is not a {FORMAT} manifest")
    if data.get("version") != VERSION:
        raise InvalidInputError(
            f"{root / MANIFEST} has version {data.get('version')!r}; this cdr reads {VERSION}")
    try:
        return ShardSet(root, check_shard_count(data["shards"]), str(data["model_id"]),
                        int(data["dim"]), str(data["dtype"]))
    except KeyError as e:
        raise InvalidInputError(f"{root / MANIFEST} lacks {e.args[0]!r}") from None


def open_shard_set(root: str | os.PathLike[str]) -> ShardSet:
    """The manifest, after checking that every shard exists and holds the manifest's model."""
    from cdr.ckf.snapshot import CKFSnapshot

    ss = read_manifest(root)
    for i, path in enumerate(ss.paths):
        with CKFSnapshot.open(path) as index:
            check_shard_model(ss.model_id, index.model_id, i, ss.dim, index.dim)
    return ss


def check_shard_model(expected: str, got: str, shard: int | None, dim: int, got_dim: int
                      ) -> None:
    """Refuse a shard (or, `shard=None`, a model) whose model differs from the set's, naming
    both ids."""
    if got != expected or got_dim != dim:
        what = "embedding" if shard is None else f"shard-{shard} embedding"
        raise EmbeddingModelMismatchError(f"{expected} ({dim}-d)", f"{got} ({got_dim}-d)",
                                          what)


def create_shard_set(root: str | os.PathLike[str], n_shards: int, model_id: str, dim: int,
                     dtype: str = "float32") -> ShardSet:
    """Create (or reopen, if it matches) a shard set of `n_shards` CKFs of one model."""
    from cdr.ckf.committer import create_ckf

    n_shards = check_shard_count(n_shards)
    root = Path(root).expanduser().resolve()
    if is_shard_set(root):
        ss = open_shard_set(root)
        if ss.n_shards != n_shards:
            raise InvalidInputError(
                f"{root} is a shard set of {ss.n_shards} shards, not {n_shards}; documents "
                "are placed by hash mod S, so S cannot change in place (ingest into a new "
                "directory)")
        check_shard_model(ss.model_id, model_id, None, ss.dim, dim)
        return ss
    if root.exists() and any(root.iterdir()):
        raise InvalidInputError(f"{root} exists and is not a shard set; choose an empty or "
                                "new directory for --shards")
    root.mkdir(parents=True, exist_ok=True)
    for i in range(n_shards):
        create_ckf(shard_dir(root, i), model_id, dim, dtype)
    ss = ShardSet(root, n_shards, model_id, dim, dtype)
    tmp = root / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(ss.to_json(), indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, root / MANIFEST)  # the manifest appears last: a half-made set has none
    return ss


class _SetProgress:
    """One progress bar over the whole job: documents read across all shards, then texts
    embedded across all shards (totals grow as each shard learns what it must embed)."""

    def __init__(self, progress: IngestProgress | None, n_docs: int) -> None:
        self.progress = progress
        self.n_docs = n_docs
        self.read_done = 0
        self.embed_base = 0
        self.embed_total = 0
        self._cur_total = 0

    def shard(self) -> Callable[[str, int, int], None]:
        read_base = self.read_done
        self._cur_total = 0

        def tick(stage: str, done: int, total: int) -> None:
            if self.progress is None:
                return
            if stage == "read":
                self.read_done = max(self.read_done, read_base + done)
                self.progress("read", min(self.read_done, self.n_docs), self.n_docs)
            elif stage == "embed":
                if total != self._cur_total:
                    self.embed_total += total - self._cur_total
                    self._cur_total = total
                self.progress("embed", self.embed_base + done, self.embed_total)

        return tick

    def shard_done(self) -> None:
        self.embed_base += self._cur_total
        self._cur_total = 0


def ingest_sharded(
    root: str | os.PathLike[str],
    paths: Sequence[str | os.PathLike[str]],
    n_shards: int,
    *,
    embedder: Embedder | None = None,
    dtype: str = "float32",
    source_type: str = "user",
    include: str | Sequence[str] | None = None,
    exclude: str | Sequence[str] | None = None,
    importance: float | None = None,
    progress: IngestProgress | None = None,
    commit_every: int = 1024,
    recipe: str | None = None,
    max_file_bytes: int | None = None,
    follow_symlinks: bool = False,
) -> IngestReport:
    """`cdr ingest --shards S`: each document goes to `shard_of(source, S)` and is ingested
    there exactly as into a single CKF (same batching, same crash safety: every shard commits
    its own batches, the same files refused). `embedder` may be a Ray-parallel one
    (`cdr.cluster.ray_ingest`)."""
    from cdr.ckf.ingest import (
        IngestReport,
        check_max_file_bytes,
        ingest_documents,
        mark_vanished,
        read_inputs,
    )
    from cdr.ckf.sources import discover
    from cdr.retrieval.embed import default_embedder, embedder_for
    from cdr.retrieval.fact_recipe import DEFAULT_RECIPE, base_model_id, identity

    # An existing set is embedded with its own model (or path, e.g. int8), a new one with the
    # default.
    model = embedder or (embedder_for(read_manifest(root).model_id) if is_shard_set(root)
                         else default_embedder())
    if is_shard_set(root):
        ident = read_manifest(root).model_id
        if recipe is not None and identity(base_model_id(model), recipe) != ident:
            raise InvalidInputError(
                f"{root} embeds facts as {ident!r}; migrate it with `cdr ckf reembed "
                f"--recipe {recipe}` or leave --recipe out")
    else:
        ident = identity(base_model_id(model), recipe or DEFAULT_RECIPE)
    ss = create_shard_set(root, n_shards, ident, int(model.dim), dtype)
    limit = check_max_file_bytes(max_file_bytes)
    candidates, roots = discover(list(paths), include, exclude, follow_symlinks)
    by_shard: dict[int, list[Any]] = {i: [] for i in range(ss.n_shards)}
    for c in candidates:
        by_shard[shard_of(str(c.path), ss.n_shards)].append(c)
    rep = IngestReport()
    bar = _SetProgress(progress, len(candidates))

    for i, path in enumerate(ss.paths):
        if not by_shard[i] and not roots:
            continue  # re-ingesting one file opens only the shard that owns it
        store = _open_shard(path, embedder)
        try:
            ingest_documents(store, read_inputs(by_shard[i], rep, limit), source_type=source_type,
                             importance=importance, progress=bar.shard(),
                             commit_every=commit_every, total_hint=len(by_shard[i]),
                             report=rep)
            bar.shard_done()
            rep.stale.extend(mark_vanished(store, roots))
        finally:
            store.close()
    return rep


def _open_shard(path: Path, embedder: Embedder | None) -> CKF:
    from cdr.ckf.handle import CKF

    return CKF.open(path, embedder)


def delete_from_shards(doc: str, n_shards: int,
                       store: Callable[[int], AbstractContextManager[CKF]], missing: str
                       ) -> tuple[int, dict[str, Any], int]:
    """Find `doc` and delete it: by source only its owning shard holds it, so that shard is
    asked first; a document id (not hashable to a shard) is looked up shard by shard.
    `store(i)` gives shard i's CKF for the duration (the CLI opens and closes it, the gateway
    lends its open writer); `missing` is the `NotFoundError` message when no shard holds it.
    Returns (shard, the document's row, facts no longer selectable)."""
    owner = shard_of(doc, n_shards)
    for i in [owner] + [j for j in range(n_shards) if j != owner]:
        with store(i) as ckf:
            try:
                found = ckf.document(doc)
            except NotFoundError:
                continue
            return i, found, ckf.delete_document(found["doc_id"])
    raise NotFoundError(missing)


def delete_document(root: str | os.PathLike[str], doc: str) -> tuple[int, str, int]:
    """Delete a document from the shard set at `root`, each shard opened only while asked.
    Returns (shard, source, facts no longer selectable)."""
    ss = read_manifest(root)
    shard, found, removed = delete_from_shards(
        doc, ss.n_shards, lambda i: closing(_open_shard(shard_dir(ss.root, i), None)),
        f"no document {doc!r} in any of the {ss.n_shards} shards of {ss.root}")
    return shard, found["source"], removed


def merge_documents(per_shard: Sequence[Sequence[Mapping[str, Any]]]) -> list[dict[str, Any]]:
    """One listing from each shard's: every document once with the shard that holds it, in
    source order as one CKF lists them (a source hashes to one shard, so none repeats)."""
    out = [{**d, "shard": i} for i, docs in enumerate(per_shard) for d in docs]
    out.sort(key=lambda d: (d["source"], d["shard"]))
    return out


def list_documents(root: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The documents of every shard of the set at `root`, read from each shard's committed
    state (a read: no writer is opened)."""
    from cdr.ckf.snapshot import CKFSnapshot

    per_shard = []
    for path in read_manifest(root).paths:
        with CKFSnapshot.open(path) as index:
            per_shard.append(index.documents())
    return merge_documents(per_shard)


def _offset(progress: Callable[[int, int], None], base: int, total: int
            ) -> Callable[[int, int], None]:
    """One shard's progress (rows done of its own) as the whole set's."""
    return lambda done, _shard_total: progress(base + done, total)


def reembed_shards(root: str | os.PathLike[str], recipe: str, *,
                   embedder: Embedder | None = None,
                   progress: Callable[[int, int], None] | None = None) -> Any:
    """`cdr ckf reembed` on a shard set: each shard in turn (each resumable and switched on
    its own, `cdr.ckf.reembed`), then the manifest. Until the last shard switched, the set
    refuses to open (its shards disagree), so no query mixes the two identities."""
    from cdr.ckf.handle import CKF
    from cdr.ckf.reembed import ReembedReport, reembed
    from cdr.retrieval.fact_recipe import base_model_id, identity, split_identity

    ss = read_manifest(root)
    # With an embedder, its model (or path) becomes the set's, as for one CKF.
    model = split_identity(ss.model_id)[0] if embedder is None else base_model_id(embedder)
    target = identity(model, recipe)
    totals = [CKF.open(p).n_rows for p in ss.paths]
    total, base = sum(totals), 0
    embedded = resumed = 0
    for path, n in zip(ss.paths, totals, strict=True):
        store = CKF.open(path)
        try:
            rep = reembed(store, recipe, embedder=embedder, progress=(
                None if progress is None else _offset(progress, base, total)))
        finally:
            store.close()
        embedded += rep.embedded
        resumed += rep.resumed_from
        base += n
    if ss.model_id == target and embedded == 0:
        return ReembedReport(target, total, 0, resumed, unchanged=True)
    fresh = ShardSet(ss.root, ss.n_shards, target, ss.dim, ss.dtype)
    tmp = ss.root / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(fresh.to_json(), indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, ss.root / MANIFEST)
    return ReembedReport(target, total, embedded, resumed)
