"""Open the knowledge base named by `--ckf` / `CDR_CKF`: a CKF directory (the default), a
shard set served by Ray, `ray://HOST:PORT/PATH` (`cdr.cluster.ray_index`), or a Qdrant
collection, `qdrant:PATH?collection=NAME` or `qdrant+http://HOST:PORT?collection=NAME`
(`cdr.stores.qdrant`). One place, so that every
command takes an index by address the same way."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cdr.errors import InvalidInputError


def check_index_address(spec: str | Path) -> None:
    """Refuse a malformed `ray://` address (`BadIndexAddressError`) before anything opens;
    a directory is checked when it is opened."""
    from cdr.cluster.ray_index import is_ray_address, parse_address
    from cdr.stores import qdrant

    if is_ray_address(str(spec)):
        parse_address(str(spec))
    elif qdrant.is_qdrant_address(str(spec)):
        qdrant.parse_address(str(spec))


def open_fact_index(spec: str | Path, **ray_options: Any) -> Any:
    """A `FactIndex` for `spec`. A local shard-set directory is refused with the address to
    use instead: its shards are served by Ray actors, not mapped into this process."""
    from cdr.cluster.ray_index import is_ray_address, open_index
    from cdr.cluster.shardset import is_shard_set
    from cdr.stores import qdrant

    text = str(spec)
    if is_ray_address(text):
        return open_index(text, **ray_options)
    if qdrant.is_qdrant_address(text):
        return qdrant.open_qdrant(text)
    path = Path(text).expanduser()
    if is_shard_set(path):
        raise InvalidInputError(
            f"{path} is a shard set; serve it with Ray and pass "
            f"--ckf ray://HOST:PORT{path.resolve()} (see docs/sharding.md)")
    from cdr.ckf import CKF

    return CKF.open(path)
