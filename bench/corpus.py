"""The benchmarks' real corpora: the Python 3.11 HTML documentation and the PostgreSQL 15
manual.

Fetched once from Debian's `python3.11-doc` (`postgresql-doc-15`) package with `apt-get
download` and unpacked into a cache directory. They live with the benchmarks, not in the
library: installing `cdr` must never run a package manager. (The zero-install pydoc topics
for tests and the demo are `cdr.cli.samples`.)
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterable
from pathlib import Path

from cdr.cli.samples import cache_dir
from cdr.errors import NotFoundError

DEBIAN_PACKAGE = "python3.11-doc"
PG_PACKAGE = "postgresql-doc-15"


def python_docs_dir(cache: str | os.PathLike[str] | None = None) -> Path:
    """The Python 3.11 HTML documentation tree (about 500 pages), downloading it if needed."""
    return debian_html(DEBIAN_PACKAGE, Path("usr/share/doc/python3.11/html"), cache)


def pg_docs_dir(cache: str | os.PathLike[str] | None = None) -> Path:
    """The PostgreSQL 15 HTML manual (about 1,170 pages), downloading it if needed."""
    return debian_html(PG_PACKAGE, Path("usr/share/doc/postgresql-doc-15/html"), cache)


def debian_html(package: str, subdir: Path,
                cache: str | os.PathLike[str] | None = None) -> Path:
    """The HTML tree `subdir` of Debian's `package`: from the cache, a system install, or
    `apt-get download` (no root needed for the download itself) unpacked with `dpkg -x`.

    Raises NotFoundError with what to do when none of that works."""
    root = Path(cache).expanduser() if cache is not None else cache_dir() / package
    html = root / subdir
    if (html / "index.html").is_file():
        return html
    system = Path("/") / subdir
    if (system / "index.html").is_file():
        return system
    for tool in ("apt-get", "dpkg"):
        if shutil.which(tool) is None:
            raise NotFoundError(
                f"the HTML docs are not cached at {html} and `{tool}` is not available "
                f"to fetch Debian's {package}; unpack the docs there yourself")
    with tempfile.TemporaryDirectory() as tmp:
        res = _download(package, tmp)
        if res.returncode != 0 and os.geteuid() == 0:
            subprocess.run(["apt-get", "update", "-qq"], capture_output=True, text=True,
                           check=False, timeout=600)
            res = _download(package, tmp)
        debs = sorted(Path(tmp).glob(f"{package}_*.deb"))
        if res.returncode != 0 or not debs:
            raise NotFoundError(
                f"could not download {package} with apt-get ({res.stderr.strip()[-300:]})"
                "; run `apt-get update` (as root) and try again")
        staging = root.with_name(root.name + ".partial")
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        unpack = subprocess.run(["dpkg", "-x", str(debs[-1]), str(staging)],
                                capture_output=True, text=True, check=False, timeout=600)
        if unpack.returncode != 0:
            shutil.rmtree(staging, ignore_errors=True)
            raise NotFoundError(f"dpkg -x failed: {unpack.stderr.strip()[-300:]}")
        shutil.rmtree(root, ignore_errors=True)
        os.replace(staging, root)  # a half-unpacked tree is never mistaken for the cache
    if not (html / "index.html").is_file():
        raise NotFoundError(f"{package} unpacked, but {html}/index.html is missing")
    return html


def _download(package: str, cwd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["apt-get", "download", package], cwd=cwd,
                          capture_output=True, text=True, check=False, timeout=600)


def pages_holding(pages: Iterable[Path], target_facts: int) -> tuple[list[Path], int]:
    """`pages` in the order given until they hold about `target_facts` facts, and how many
    they hold; a page that parses to no fact, or that the parser refuses, is passed over."""
    from cdr.ckf import chunk_blocks
    from cdr.ckf.sources import EmptyDocument, SkipDocument, parse_bytes

    picked, total = [], 0
    for p in pages:
        try:
            n = len(chunk_blocks(parse_bytes(p.read_bytes(), "html").blocks))
        except (EmptyDocument, SkipDocument):
            continue
        if n == 0:
            continue
        picked.append(p)
        total += n
        if total >= target_facts:
            break
    return picked, total
