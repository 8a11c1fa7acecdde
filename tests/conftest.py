"""Shared fixtures: a real CKF of Python's own documentation, built once per test session.

The corpus is the standard library's `pydoc_data.topics` (the language reference), so it needs
no download; the embeddings come from the real default model.
"""

from __future__ import annotations

from pathlib import Path

import pytest

# The built-in types chapter plus unrelated reference topics as distractors.
BUILTIN_TYPES_TOPICS = (
    "truth", "types", "typesseq", "typesseq-mutable", "typesmapping", "typesmethods",
    "typesfunctions", "typesmodules", "string-methods", "integers", "floating", "dict", "lists",
    "strings",
)
DISTRACTOR_TOPICS = ("import", "lambda", "assert", "pass", "global", "del", "raise", "return")
BUILTIN_TYPES_TASK = "Write a guide to Python's built-in types"
BUILTIN_TYPES_OUTLINE = (
    "Truth value testing\nNumeric types\nSequence types\nText sequence type str\n"
    "Mapping types dict\nMethods and code objects\n"
)


def build_topics_ckf(root: Path, topics: tuple[str, ...], recipe: str | None = None) -> Path:
    """A CKF of pydoc topics; `recipe` None = the default fact recipe (`cdr.fact_recipe`)."""
    from cdr.ckf import CKF, ingest
    from cdr.samples import pydoc_topics_dir

    docs = pydoc_topics_dir(root / "docs", topics=list(topics))
    with CKF.create(root / "ckf", **({} if recipe is None else {"recipe": recipe})) as ckf:
        report = ingest(ckf, [str(docs)], source_type="official")
        assert report.facts_added > 0 and not report.skipped, report
    return root / "ckf"


@pytest.fixture(scope="session")
def types_ckf_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """~450 facts: the built-in types topics and a few unrelated ones."""
    return build_topics_ckf(tmp_path_factory.mktemp("types-ckf"),
                            BUILTIN_TYPES_TOPICS + DISTRACTOR_TOPICS)


@pytest.fixture(scope="session")
def tiny_ckf_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A handful of facts: a CKF that a long task exhausts."""
    return build_topics_ckf(tmp_path_factory.mktemp("tiny-ckf"), ("pass", "truth"))


@pytest.fixture(scope="session")
def tiny_plain_ckf_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny CKF as every CKF was built before fact recipes (facts embedded alone): what
    sessions stored by earlier versions were started on."""
    return build_topics_ckf(tmp_path_factory.mktemp("tiny-plain-ckf"), ("pass", "truth"),
                            recipe="plain")
