"""Navigation pages (`cdr.retrieval.navigation`): the entry-line rule on exact cases, and a
knowledge base whose back-of-book index matches every query: under the default profile it
sends none of the index's facts and reaches the content pages, where the task's pool alone
sends the index."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from cdr.ckf import CKF, DocumentInput, ingest_texts
from cdr.retrieval.navigation import (
    ENTRY_SHARE,
    MIN_FACTS,
    MIN_LINES,
    entry_lines,
    navigation_rows,
)
from cdr.window.loop import GenerationConfig, Generator
from cdr.writers import get_writer


def test_entry_lines_are_counted_exactly() -> None:
    index = "B-tree, Index Types\nBRIN, Index Types\nGIN, GIN Indexes\nGiST, GiST"
    assert entry_lines(index) == (4, 4)
    toc = "Table of Contents\n1. What Is PostgreSQL?\n2. A Brief History\n3. Bugs"
    assert entry_lines(toc) == (3, 4)  # a question ends like a sentence
    assert entry_lines("ABORT — abort the current transaction\n- ALTER TABLE — change a table\n"
                       "\n* $libdir, Dynamic Loading") == (3, 3)
    prose = ("An index lets the server find rows fast.\nIt costs writes.\nUse it on columns "
             "you filter by.")
    assert entry_lines(prose) == (0, 3)
    assert entry_lines("CREATE INDEX i ON t (a)\nSELECT a\nFROM t", is_code=True) == (0, 3)
    # a table's rows and the continuation lines of its cells are not entries
    assert entry_lines("Name | Indexable Operators\nbox_ops | << (box, box)\nanyrange)") == (0, 3)
    assert entry_lines("&& (circle, circle)\n<@ (circle, circle)") == (0, 2)
    long_item = "item with a description long enough to be a sentence of its own here"
    assert entry_lines(long_item) == (0, 1)


def _doc(n_lines: int, entry_every: int) -> list[DocumentInput]:
    """A page of `n_lines` lines, one in `entry_every` a short name, the rest sentences."""
    lines = [f"Entry {i}, Section {i}" if i % entry_every == 0 else
             f"Line {i} is a sentence about the planner and its statistics."
             for i in range(n_lines)]
    return [DocumentInput("page.md", "# Page\n\n" + "\n\n".join(lines) + "\n")]


@pytest.mark.parametrize(("n_lines", "entry_every", "navigation"), [
    (40, 1, True),     # every line an entry
    (40, 2, False),    # half
    (12, 1, False),    # too few lines to judge
])
def test_a_document_is_navigation_by_its_share_of_entry_lines(tmp_path: Path, n_lines: int,
                                                              entry_every: int,
                                                              navigation: bool) -> None:
    with CKF.create(tmp_path / "kb.ckf") as ckf:
        ingest_texts(ckf, _doc(n_lines, entry_every))
    ckf = CKF.open(tmp_path / "kb.ckf")
    facts = ckf.facts(np.arange(ckf.n_rows))
    entries = sum(entry_lines(f.content)[0] for f in facts)
    lines = sum(entry_lines(f.content)[1] for f in facts)
    assert lines == n_lines
    judged = len(facts) >= MIN_FACTS and lines >= MIN_LINES
    assert (judged and entries >= ENTRY_SHARE * lines) == navigation
    assert bool(navigation_rows(ckf).all()) == navigation


TOPICS = {
    "partial": ("Partial indexes", "A partial index covers only the rows that satisfy its "
                "WHERE clause, which keeps it small when most rows share a common value."),
    "multicolumn": ("Multicolumn indexes", "A multicolumn index on several columns serves "
                    "queries that constrain its leading columns, in the order they are listed."),
    "only": ("Index-only scans", "An index-only scan answers a query from the index alone "
             "when every column it needs is in the index and the visibility map is set."),
    "examine": ("Examining index usage", "The statistics views count how often each index "
                "is scanned, so unused indexes can be found and dropped."),
}
TERMS = ["index", "indexes", "partial index", "multicolumn index", "index-only scan",
         "index usage", "B-tree", "GIN", "GiST", "BRIN", "hash index", "WHERE clause",
         "statistics views", "visibility map", "leading columns", "scan"]


def _index_page() -> str:
    lines = [f"{t} {i}, {TOPICS[k][0]}" for i in range(40) for t in TERMS
             for k in list(TOPICS)[i % 4:i % 4 + 1]]
    return "# Index\n\n" + "\n".join(f"- {line}" for line in lines) + "\n"


@pytest.fixture(scope="module")
def manual(tmp_path_factory: pytest.TempPathFactory) -> CKF:
    root = tmp_path_factory.mktemp("manual")
    docs = [DocumentInput(f"{k}.md", f"# {title}\n\n## {title}\n\n{text}\n\n"
                          f"{text.replace('index', 'the index')}\n")
            for k, (title, text) in TOPICS.items()]
    docs.append(DocumentInput("bookindex.md", _index_page()))
    with CKF.create(root / "kb.ckf") as ckf:
        ingest_texts(ckf, docs)
    return CKF.open(root / "kb.ckf")


def _sent_sources(ckf: CKF, pool: str) -> set[str]:
    gen = Generator(ckf, get_writer("extractive"),
                    GenerationConfig(max_windows=4, words=800, profile="focused", pool=pool))
    task = "Write a guide to PostgreSQL indexes for application developers"
    outline = "\n".join(t for t, _ in TOPICS.values())
    session = gen.start(task, outline)
    return {Path(f.source).name for e in gen.run(task, session=session) if e.output.strip()
            for f in e.prepared.facts}


def test_an_index_page_that_matches_every_query_does_not_fill_the_envelope(manual: CKF) -> None:
    mask = navigation_rows(manual)
    facts = manual.facts(np.arange(manual.n_rows))
    flagged = {Path(f.source).name for f, m in zip(facts, mask, strict=True) if m}
    assert flagged == {"bookindex.md"}
    assert sum(1 for f in facts if f.source == "bookindex.md") >= MIN_FACTS
    sent = _sent_sources(manual, "sections")
    assert "bookindex.md" not in sent
    assert {"partial.md", "multicolumn.md", "only.md", "examine.md"} <= sent
    assert "bookindex.md" in _sent_sources(manual, "task")  # the task's pool alone sends it
