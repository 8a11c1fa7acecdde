"""Tasks for the quality benchmark, read from the documentation pages themselves.

A task is a page: its title is the task, its section titles are the outline (the sub-queries),
and a fact's sub-topic label is the section of that page it came from. Facts of every other
page carry no label: they are the distractors a real knowledge base holds.

Sections are the page's second heading level ("H1 > H2"). A page with fewer than
`min_sections` such sections has its largest section replaced by that section's own children,
until it has enough (the Data model chapter: "Special method names" becomes its eleven
subsections). Sections holding fewer than `min_facts` facts are left out of the outline: one
paragraph is not a sub-topic a writer can cover or miss.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

SEP = " > "
_NUMBERING = re.compile(r"^\s*(?:\d+\.)+\s*")

# Library and language-reference pages, each with at least five sections of at least two facts.
DEFAULT_PAGES: tuple[str, ...] = (
    "library/asyncio-task.html",
    "library/logging.html",
    "library/unittest.html",
    "reference/datamodel.html",
    "library/collections.html",
    "library/argparse.html",
    "library/datetime.html",
    "library/threading.html",
    "library/typing.html",
    "library/re.html",
    "library/configparser.html",
    "library/dataclasses.html",
    "library/subprocess.html",
    "reference/expressions.html",
    "reference/compound_stmts.html",
    "reference/import.html",
)


def clean_title(heading: str) -> str:
    """"3.3.1. Basic customization" → "Basic customization"; other text is kept as it is."""
    return _NUMBERING.sub("", heading).strip() or heading.strip()


@dataclass(frozen=True)
class Task:
    """One page as a benchmark task."""

    page: str  # path relative to the documentation root, e.g. "library/logging.html"
    title: str  # the task given to the loop
    outline: tuple[str, ...]  # sub-query texts, in page order
    keys: tuple[str, ...]  # the section path each sub-query stands for (label values)
    n_facts: int  # facts of the page in the CKF

    @property
    def outline_text(self) -> str:
        return "\n".join(self.outline)


def _children(paths: Sequence[tuple[str, ...]], prefix: tuple[str, ...]) -> list[tuple[str, ...]]:
    """Distinct child section paths one level below `prefix`, in page order."""
    depth = len(prefix) + 1
    seen: dict[tuple[str, ...], None] = {}
    for p in paths:
        if len(p) >= depth and p[: len(prefix)] == prefix:
            seen.setdefault(p[:depth], None)
    return list(seen)


def section_outline(
    sections: Sequence[str], min_sections: int = 5, min_facts: int = 2
) -> list[tuple[str, ...]]:
    """The outline of a page from its facts' section paths (in page order).

    Returns section paths (tuples of headings); see the module docstring for the rule.
    """
    paths = [tuple(s.split(SEP)) for s in sections if s]
    if not paths:
        return []
    root = paths[0][:1]

    def count(key: tuple[str, ...]) -> int:
        return sum(1 for p in paths if p[: len(key)] == key)

    outline = _children(paths, root)
    while True:
        kept = [k for k in outline if count(k) >= min_facts]
        if len(kept) >= min_sections:
            return kept
        splittable = [k for k in outline if len(_children(paths, k)) >= 2]
        if not splittable:
            return kept
        big = max(splittable, key=count)
        i = outline.index(big)
        outline[i : i + 1] = _children(paths, big)


def label_of(section: str, keys: Sequence[tuple[str, ...]]) -> int | None:
    """Index of the outline key that `section` falls under (the longest prefix), else None."""
    path = tuple(section.split(SEP))
    best, best_len = None, 0
    for i, k in enumerate(keys):
        if len(k) > best_len and path[: len(k)] == k:
            best, best_len = i, len(k)
    return best


def make_task(page: str, sections: Sequence[str], min_sections: int = 5,
              min_facts: int = 2) -> Task | None:
    """A task from one page's fact sections (page order), or None if it has too few sections."""
    keys = section_outline(sections, min_sections, min_facts)
    if len(keys) < min_sections:
        return None
    first = next(s for s in sections if s)
    title = clean_title(first.split(SEP)[0])
    outline = [clean_title(k[-1]) for k in keys]
    # Two sections can share a title ("Examples" under two parents): qualify the repeats.
    counts = Counter(outline)
    outline = [f"{clean_title(k[-2])}: {t}" if counts[t] > 1 else t
               for k, t in zip(keys, outline, strict=True)]
    return Task(page, title, tuple(outline), tuple(SEP.join(k) for k in keys), len(sections))


def page_of(source: str, root: str) -> str | None:
    """`source` relative to the documentation root, or None if it lies outside it."""
    prefix = root.rstrip("/") + "/"
    return source[len(prefix):] if source.startswith(prefix) else None
