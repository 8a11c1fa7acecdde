"""How the report writes text from a trace into HTML: escaped, and sources by name.

Every piece of document text (task, sub-queries, sources, sections, written text, fact
excerpts) goes through `e`, so a fact containing `<script>` shows as text; a source is shown by
its file's name (`short_source`), since reports are shared and the gateway must not show
server paths.
"""

from __future__ import annotations

from html import escape
from typing import Any


def e(value: Any) -> str:
    return escape(str(value), quote=True)


def short_source(source: str) -> str:
    """A URL as it is; a file path by its name: the directory a document was ingested from
    says nothing about it."""
    if "://" in source:
        return source
    return source.replace("\\", "/").rstrip("/").rsplit("/", 1)[-1] or source
