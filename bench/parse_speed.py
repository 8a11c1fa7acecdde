"""Parse speed of the Markdown and HTML parsers on real documents (no embedding, no store).

Corpora: every `pydoc_data.topics` entry written as a Markdown file (the language reference:
setext headings, indented examples, lists), and, when present, the Python HTML documentation
tree (`bench/corpus.py`'s `python_docs_dir`, ~500 pages). `--parser FILE` loads another version of
`cdr/ckf/parse.py` (e.g. `git show REV:src/cdr/ckf/parse.py > /tmp/old.py`) so before and after
run on the same texts in the same process setup:

    .venv/bin/python bench/parse_speed.py
    .venv/bin/python bench/parse_speed.py --parser /tmp/old.py

Prints MB/s and documents/s per corpus: the best of `--repeat` runs (the machine is shared).
"""

from __future__ import annotations

import argparse
import importlib.util
import time
from collections.abc import Callable
from types import ModuleType


def _load(path: str | None) -> ModuleType:
    if path is None:
        return importlib.import_module("cdr.ckf.parse")
    spec = importlib.util.spec_from_file_location("cdr_parse_under_test", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _markdown_corpus() -> list[str]:
    from pydoc_data.topics import topics

    return [f"# {name}\n\n{text}" for name, text in sorted(topics.items())]


def _html_corpus(limit: int) -> list[str]:
    try:
        from corpus import python_docs_dir  # bench/, the script's own directory

        root = python_docs_dir()
    except Exception as exc:  # the benchmark runs without the HTML tree, saying so
        print(f"html: skipped ({exc})")
        return []
    pages = sorted(root.rglob("*.html"))[:limit]
    return [p.read_text(encoding="utf-8", errors="replace") for p in pages]


def _measure(fn: Callable[[str], object], texts: list[str], repeat: int) -> tuple[float, int]:
    best = float("inf")
    blocks = 0
    for _ in range(repeat):
        started = time.perf_counter()
        blocks = sum(len(fn(t).blocks) for t in texts)  # type: ignore[attr-defined]
        best = min(best, time.perf_counter() - started)
    return best, blocks


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parser", help="path of another parse.py to measure instead")
    ap.add_argument("--repeat", type=int, default=3, help="runs per corpus (best is kept)")
    ap.add_argument("--html-pages", type=int, default=600)
    args = ap.parse_args()
    mod = _load(args.parser)
    for name, fn, texts in (("markdown", mod.parse_markdown, _markdown_corpus()),
                            ("html", mod.parse_html, _html_corpus(args.html_pages))):
        if not texts:
            continue
        mb = sum(len(t.encode()) for t in texts) / 1e6
        fn(texts[0])  # imports and caches outside the timing
        secs, blocks = _measure(fn, texts, args.repeat)
        print(f"{name}: {len(texts)} docs, {mb:.2f} MB, {blocks} blocks: {secs:.2f} s = "
              f"{mb / secs:.2f} MB/s, {len(texts) / secs:.0f} docs/s")


if __name__ == "__main__":
    main()
