"""Sample documents for the examples: a few topics of Python's own language reference
(`pydoc_data`, shipped with CPython), so every example runs offline with no files of yours."""

from __future__ import annotations

from pathlib import Path

TOPICS = ("truth", "typesseq", "typesmapping", "numbers", "integers")


def python_topics() -> list[tuple[str, str]]:
    """(name, text) pairs, one per topic."""
    from pydoc_data.topics import topics

    return [(f"{name}.txt", topics[name]) for name in TOPICS]


def write_python_topics(root: Path) -> Path:
    """The topics as text files under `root` (a folder `cdr ingest` can read)."""
    root.mkdir(parents=True, exist_ok=True)
    for name, text in python_topics():
        (root / name).write_text(text, encoding="utf-8")
    return root


def ensure_ckf(path: Path, docs: Path | None = None) -> Path:
    """A CKF at `path`, built from `docs` (default: the Python topics) unless it exists."""
    from cdr import CKF, ingest

    if not path.exists():
        source = docs or write_python_topics(path.parent / "python-topics")
        with CKF.create(path) as ckf:
            ingest(ckf, [source])
    return path
