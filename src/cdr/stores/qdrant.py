"""A Qdrant collection as the knowledge base, read with the official `qdrant-client` (the
`qdrant` extra): its own vectors and payloads, nothing re-embedded.

Addresses (what `--ckf` takes):

- `qdrant:PATH?collection=NAME` — the storage folder of Qdrant's local mode (what
  `QdrantClient(path=PATH)` writes; STORM's `VectorRM` and LangChain's `Qdrant` make these);
- `qdrant+http://HOST:PORT?collection=NAME` (or `qdrant+https://`) — a Qdrant server; a host
  other than loopback only with `CDR_STORE_REMOTE=1`.

Query parameters: `collection` (required); `text` — the payload key holding a point's text
(default: the first of `page_content`, `text`, `document`, `content` a point has); `model` —
the embedder that made the vectors (an `--embedder` spec; default `minilm`, the offline
default); `vector` — the name of the vector, for a collection of named vectors. A point's
source is its payload's `source` (or `metadata.source`, LangChain's), its section `section`
or `title`, else the collection's name.

Refused with a message naming the problem: a collection that does not exist, vectors of
another width than the model's, vectors the model did not make from the points' texts (a
sample of its texts embedded again must come back as its vectors — the §2.5 identity check
of `cdr.stores.collection`, since a Qdrant collection does not name its model),
more than `MAX_POINTS` points, points none of which holds a text. A point without text, with
a text longer than `MAX_TEXT_CHARS`, or without a usable vector is skipped and counted
(`skipped`).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import numpy as np

from cdr import settings
from cdr.errors import InvalidInputError, NotFoundError
from cdr.stores.array_index import ArrayFactIndex
from cdr.stores.collection import collection_index

SCHEMES = ("qdrant:", "qdrant+http://", "qdrant+https://")
TEXT_KEYS = ("page_content", "text", "document", "content")
MAX_POINTS = 2_000_000
MAX_TEXT_CHARS = 100_000
SCROLL_PAGE = 1_000
REMOTE_ENV = "CDR_STORE_REMOTE"
_LOOPBACK_NAMES = ("localhost",)


def is_qdrant_address(spec: str) -> bool:
    return spec.startswith(SCHEMES)


@dataclass(frozen=True)
class QdrantAddress:
    """A parsed `qdrant:` address: a local storage folder or a server URL, and the query."""

    path: Path | None
    url: str | None
    collection: str
    text_key: str | None
    model: str
    vector: str | None
    shown: str = field(repr=False)  # the address for messages: no credentials, no query


def parse_address(spec: str) -> QdrantAddress:
    """The parts of `spec`; a malformed address, or a remote host not allowed, is refused."""
    if not is_qdrant_address(spec):
        raise InvalidInputError(f"not a Qdrant address: {spec!r} (expected qdrant:PATH?"
                                "collection=NAME or qdrant+http://HOST:PORT?collection=NAME)")
    remote = spec.startswith(("qdrant+http://", "qdrant+https://"))
    parts = urlsplit(spec[len("qdrant+"):] if remote else spec[len("qdrant:"):])
    query = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
    unknown = sorted(set(query) - {"collection", "text", "model", "vector"})
    if unknown:
        raise InvalidInputError(f"unknown Qdrant address parameters {unknown}; known: "
                                "collection, text, model, vector")
    collection = query.get("collection", "").strip()
    if not collection:
        raise InvalidInputError("a Qdrant address needs ?collection=NAME")
    if remote:
        host = parts.hostname or ""
        if not host:
            raise InvalidInputError("a Qdrant server address needs a host: "
                                    "qdrant+http://HOST:PORT?collection=NAME")
        if not _is_loopback(host) and settings.env(REMOTE_ENV) != "1":
            raise InvalidInputError(
                f"the Qdrant host {host!r} is not loopback; set {REMOTE_ENV}=1 to allow it")
        port = f":{parts.port}" if parts.port else ""
        url = f"{parts.scheme}://{host}{port}"
        path, shown = None, f"qdrant+{url}/{collection}"
    else:
        raw = parts.path
        if not raw:
            raise InvalidInputError("a local Qdrant address needs the storage folder: "
                                    "qdrant:PATH?collection=NAME")
        path, url = Path(raw).expanduser(), None
        shown = f"qdrant:{path}/{collection}"
    return QdrantAddress(path, url, collection, query.get("text") or None,
                         query.get("model") or "minilm", query.get("vector") or None, shown)


def _is_loopback(host: str) -> bool:
    if host.lower() in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _client(addr: QdrantAddress) -> Any:
    try:
        from qdrant_client import QdrantClient
    except ImportError as exc:
        raise InvalidInputError("a Qdrant knowledge base needs the `qdrant` extra: "
                                "pip install 'cdr-retrieval[qdrant]'") from exc
    if addr.path is not None:
        if not addr.path.is_dir():
            raise NotFoundError(f"no Qdrant storage folder at {addr.path}")
        return QdrantClient(path=str(addr.path))
    return QdrantClient(url=addr.url, timeout=30)


@dataclass
class _Points:
    vectors: list[np.ndarray] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)
    sections: list[str] = field(default_factory=list)
    skipped: dict[str, int] = field(default_factory=dict)

    def skip(self, why: str) -> None:
        self.skipped[why] = self.skipped.get(why, 0) + 1


def _text_of(payload: dict[str, Any], key: str | None) -> Any:
    if key is not None:
        return payload.get(key)
    for k in TEXT_KEYS:
        if isinstance(payload.get(k), str):
            return payload[k]
    return None


def _meta(payload: dict[str, Any], *keys: str) -> str | None:
    nested = payload.get("metadata")
    for k in keys:
        for where in (payload, nested if isinstance(nested, dict) else {}):
            value = where.get(k)
            if isinstance(value, str | int | float) and str(value).strip():
                return str(value)[:1000]
    return None


def _vector_of(point: Any, name: str | None) -> Any:
    vec = point.vector
    if isinstance(vec, dict):
        if name is None:
            if len(vec) != 1:
                raise InvalidInputError(f"the collection has named vectors {sorted(vec)}; "
                                        "choose one with ?vector=NAME")
            return next(iter(vec.values()))
        return vec.get(name)
    return vec


def read_points(client: Any, addr: QdrantAddress, dim: int) -> _Points:
    """Every point's vector, text, source and section, in the collection's scroll order."""
    if not client.collection_exists(addr.collection):
        raise NotFoundError(f"{addr.shown}: no such collection")
    count = int(client.count(addr.collection, exact=True).count)
    if count > MAX_POINTS:
        raise InvalidInputError(f"{addr.shown}: {count:,} points, over the {MAX_POINTS:,} this "
                                "backend reads into memory")
    out = _Points()
    offset = None
    while True:
        points, offset = client.scroll(addr.collection, limit=SCROLL_PAGE, offset=offset,
                                       with_payload=True, with_vectors=True)
        for p in points:
            payload = p.payload or {}
            text = _text_of(payload, addr.text_key)
            if not isinstance(text, str) or not text.strip():
                out.skip("no text")
                continue
            if len(text) > MAX_TEXT_CHARS:
                out.skip(f"text over {MAX_TEXT_CHARS:,} characters")
                continue
            raw = _vector_of(p, addr.vector)
            vec = np.asarray(raw if raw is not None else [], dtype=np.float32).ravel()
            if vec.shape == (dim,) and (not np.isfinite(vec).all() or not np.any(vec)):
                out.skip("zero or non-finite vector")
                continue
            out.vectors.append(vec)
            out.texts.append(text)
            out.sources.append(_meta(payload, "source", "url", "file_path") or addr.collection)
            out.sections.append(_meta(payload, "section", "title", "heading") or "")
        if offset is None:
            break
    if count and not out.texts:
        keys = [addr.text_key] if addr.text_key else list(TEXT_KEYS)
        raise InvalidInputError(
            f"{addr.shown}: none of its {count:,} points holds a text under {keys} "
            f"(skipped: {out.skipped}); name the payload key that holds it with ?text=")
    return out


def open_qdrant(spec: str) -> ArrayFactIndex:
    """The collection named by `spec` as an in-memory fact index (its `skipped` counts the
    points left out and why)."""
    from cdr.retrieval.embed import get_embedder

    addr = parse_address(spec)
    dim = int(get_embedder(addr.model).dim)
    client = _client(addr)
    try:
        pts = read_points(client, addr, dim)
    finally:
        client.close()
    return collection_index(pts.vectors, pts.texts, pts.sources, pts.sections,
                            model=addr.model, where=addr.shown, skipped=pts.skipped)
