"""How server paths appear in responses: never absolute.

A CKF records where each document came from; for `cdr ingest` that is the file's absolute
path on the server (`/home/ops/corpus/guide/intro.md`). Clients need a readable source name,
not the server's directory layout, so responses show the last two components
(`guide/intro.md`); uploads (`upload/<name>`) and URLs are shown as they are. The document
id stays the identifier.
"""

from __future__ import annotations

import functools
from pathlib import PurePosixPath, PureWindowsPath
from typing import Any

__all__ = ["public_path", "public_sources"]


def public_path(value: Any) -> Any:
    """`value` with an absolute path shortened to its last two components (non-strings and
    relative names unchanged)."""
    if not isinstance(value, str) or "://" in value:
        return value
    return _public_str(value)


@functools.lru_cache(maxsize=65_536)
def _public_str(value: str) -> str:
    """Remembered per string: an envelope shows the sources of ~40 facts, mostly a handful of
    documents, and pathlib parsing them on every request was a visible share of its CPU."""
    for pure in (PurePosixPath, PureWindowsPath):
        p = pure(value)
        if p.is_absolute():
            return "/".join(p.parts[-2:]) if len(p.parts) > 2 else p.name
    return value


def public_sources(obj: Any) -> Any:
    """A copy of a JSON-like value with every `source` / `path` string made public."""
    if isinstance(obj, dict):
        return {k: public_path(v) if k in ("source", "path")
                else public_sources(v) if isinstance(v, dict | list) else v
                for k, v in obj.items()}
    if isinstance(obj, list):
        return [public_sources(v) if isinstance(v, dict | list) else v for v in obj]
    return obj
