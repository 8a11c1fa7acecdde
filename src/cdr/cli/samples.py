"""Sample documents that ship with Python itself, for the demo and the tests.

`pydoc_topics_dir` writes the standard library's language-reference topics
(`pydoc_data.topics`) as text files: a real documentation corpus with zero install and no
network. `cache_dir` is where the demo and the benchmarks keep what they build.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from cdr.errors import NotFoundError
from cdr.settings import cache_dir as cache_dir  # where the demo and benchmarks keep data


def pydoc_topics_dir(dest: str | os.PathLike[str], *, topics: list[str] | None = None,
                     suffix: str = ".txt") -> Path:
    """Write the stdlib's pydoc topics (or the named subset) as `<topic><suffix>` files.

    The topics are reStructuredText rendered to plain text: underlined headings, indented
    examples. Returns `dest`."""
    from pydoc_data.topics import topics as all_topics

    out = Path(dest)
    out.mkdir(parents=True, exist_ok=True)
    names = sorted(all_topics) if topics is None else topics
    for name in names:
        if name not in all_topics:
            raise NotFoundError(f"no pydoc topic {name!r}")
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", name)
        (out / f"{safe}{suffix}").write_text(all_topics[name], encoding="utf-8")
    return out
