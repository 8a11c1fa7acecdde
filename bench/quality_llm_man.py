"""The man-page corpus for the LLM quality benchmark (issue 21 §5: `make bench-llm` on a second
genre): `bench/quality_llm.py --corpus man`.

The knowledge base is the retrieval benchmark's man-page CKF (`bench/retrieval.py`: 60
system-call pages of Debian's manpages-dev, built with the default fact recipe and cached), so
every other page is a distractor of the same kind. A task is one page: its NAME line as the task
("Write a reference page about mbind: …"), its `##` sections as the outline — exactly the
retrieval benchmark's task for that page. A fact's sub-topic label is the section of its own
page it came from, as on the Python-docs pages, so the report's measures read the same.

**Tasks, fixed before any run** (`MAN_TASKS`): of the retrieval benchmark's held-out REPORT
split (40 pages, chosen by sha1 before any tuning), the three pages holding the most words of
text — `mbind` (1,702), `ioprio_set` (1,363) and `listxattr` (1,074), the only three over
1,000. The benchmark asks for 1,200 words over 5 windows (the Python-docs settings); a page
of 300–900 words cannot ground that, and its runs would measure the page's size, not the
ranking.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from quality import Corpus
from quality_tasks import SEP, Task

MAN_TASKS: tuple[str, ...] = ("mbind", "ioprio_set", "listxattr")
WHY_TASKS = ("the three pages of the retrieval benchmark's held-out REPORT split holding the "
             "most words of text (mbind 1,702, ioprio_set 1,363, listxattr 1,074; the only "
             "three over 1,000), fixed before any run: a 1,200-word document needs a page that "
             "can ground it")


def man_ckf_path() -> Path:
    """The retrieval benchmark's man-page CKF with the default fact recipe."""
    from cdr.retrieval.fact_recipe import DEFAULT_RECIPE
    from retrieval import CKF_DIR

    return CKF_DIR / f"man-{DEFAULT_RECIPE}.ckf"


def build_man_ckf() -> Any:
    """The man-page CKF, ingested if it is not built yet (idempotent: a built one is reused)."""
    from cdr.retrieval.fact_recipe import DEFAULT_RECIPE
    from retrieval import man_corpus

    return man_corpus((DEFAULT_RECIPE,)).ckfs[DEFAULT_RECIPE]


def load_man_tasks(ckf: Any, names: Sequence[str] = MAN_TASKS) -> tuple[Corpus, list[Task]]:
    """Per-row page (the man page's name) and section, and one task per page in `names`.

    A task's outline is the page's `##` sections, in page order, as the retrieval benchmark
    gives it; its keys are those sections under the page's own title heading (how the CKF
    stores a fact's section path, "mbind - set memory policy … > Errors")."""
    import corpus_man

    _, _, pages = corpus_man.corpus_dir()
    by_name = {p.name: p for p in pages}
    unknown = [n for n in names if n not in by_name]
    if unknown:
        raise SystemExit(f"no man page {unknown} in the corpus")
    rows = np.flatnonzero(ckf.active)
    n = ckf.n_rows
    ids, srcs, secs, contents = [""] * n, [None] * n, [""] * n, [""] * n
    roots: dict[str, str] = {}
    counts: dict[str, int] = {}
    for f in ckf.facts(rows):
        page = Path(f.source).stem
        ids[f.row], srcs[f.row], secs[f.row], contents[f.row] = f.id, page, f.section, f.content
        roots.setdefault(page, f.section.split(SEP)[0])
        counts[page] = counts.get(page, 0) + 1
    tasks = []
    for name in names:
        p = by_name[name]
        root = roots.get(name, p.title)
        tasks.append(Task(page=name, title=p.task, outline=tuple(p.sections),
                          keys=tuple(f"{root}{SEP}{s}" for s in p.sections),
                          n_facts=counts.get(name, 0)))
    return Corpus(ids, srcs, secs, contents, tasks), tasks
