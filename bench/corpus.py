"""The benchmarks' real corpus: the whole Python 3.11 HTML documentation.

Fetched once from Debian's `python3.11-doc` package with `apt-get download` and unpacked into
a cache directory. It lives with the benchmarks, not in the library: installing `cdr` must
never run a package manager. (The zero-install pydoc topics for tests and the demo are
`cdr.cli.samples`.)
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from cdr.cli.samples import cache_dir
from cdr.errors import NotFoundError

DEBIAN_PACKAGE = "python3.11-doc"
_HTML_SUBDIR = Path("usr/share/doc/python3.11/html")
_SYSTEM_HTML = Path("/usr/share/doc/python3.11/html")


def python_docs_dir(cache: str | os.PathLike[str] | None = None) -> Path:
    """The Python 3.11 HTML documentation tree (about 500 pages), downloading it if needed.

    Looks in the cache, then for a system install, then runs `apt-get download
    python3.11-doc` (Debian/Ubuntu, no root needed for the download itself) and unpacks it
    with `dpkg -x`. Raises NotFoundError with what to do when none of that works."""
    root = Path(cache).expanduser() if cache is not None else cache_dir() / DEBIAN_PACKAGE
    html = root / _HTML_SUBDIR
    if (html / "index.html").is_file():
        return html
    if (_SYSTEM_HTML / "index.html").is_file():
        return _SYSTEM_HTML
    for tool in ("apt-get", "dpkg"):
        if shutil.which(tool) is None:
            raise NotFoundError(
                f"the Python HTML docs are not cached at {html} and `{tool}` is not available "
                f"to fetch Debian's {DEBIAN_PACKAGE}; unpack the docs there yourself")
    with tempfile.TemporaryDirectory() as tmp:
        res = _download(tmp)
        if res.returncode != 0 and os.geteuid() == 0:
            subprocess.run(["apt-get", "update", "-qq"], capture_output=True, text=True,
                           check=False, timeout=600)
            res = _download(tmp)
        debs = sorted(Path(tmp).glob(f"{DEBIAN_PACKAGE}_*.deb"))
        if res.returncode != 0 or not debs:
            raise NotFoundError(
                f"could not download {DEBIAN_PACKAGE} with apt-get ({res.stderr.strip()[-300:]})"
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
        raise NotFoundError(f"{DEBIAN_PACKAGE} unpacked, but {html}/index.html is missing")
    return html


def _download(cwd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["apt-get", "download", DEBIAN_PACKAGE], cwd=cwd,
                          capture_output=True, text=True, check=False, timeout=600)
