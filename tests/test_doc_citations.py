"""Every citation in the source points at something in the repository: a `docs/...` file, a
section of `docs/design.md` (by number and, where quoted, by title), or a section of the spec
(`SPEC-024 §N`). The design document used to live outside the repository, so 35 citations of
it resolved nowhere; this keeps them resolving as the documents change."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCES = sorted((ROOT / "src").rglob("*.py"))
# Pages cited before they exist (a benchmark writes them when it is run), each with why. The
# test below fails once one exists, so its entry is removed and the citation checked as usual.
PENDING: dict[str, str] = {}

DOC_PATH = re.compile(r"(?<![\w/.-])docs/[\w./-]*\w\.(?:md|png|py|yml)")
DESIGN_CITE = re.compile(
    r"docs/design\.md(?:\s*§\s*(?P<num>\d+(?:\.\d+)*))?(?:[\s,]*\"(?P<title>[^\"]+)\")?")
SPEC_CITE = re.compile(r"SPEC-024 §\s*(\d+(?:\.\d+)*)")


def flat(text: str) -> str:
    """Source text with comment markers and line breaks folded away, so a citation wrapped
    over two comment or docstring lines reads as one."""
    return re.sub(r"\s+", " ", re.sub(r"\n\s*#\s?", " ", text))


def design_sections() -> dict[str, str]:
    """`docs/design.md`'s numbered headings: number → title."""
    text = (ROOT / "docs" / "design.md").read_text(encoding="utf-8")
    return {m["num"]: m["title"].strip() for m in re.finditer(
        r"^#{2,4} (?P<num>\d+(?:\.\d+)*)\.? (?P<title>.+)$", text, re.M)}


def spec_sections() -> set[str]:
    """The spec's numbered sections ("4. Residual Task Anchor", "4.2 The Fix: ...")."""
    page = (ROOT / "docs" / "spec" / "CRP-SPEC-024.md").read_text(encoding="utf-8")
    return {m.group(1) for m in re.finditer(r"^(\d+(?:\.\d+)*)\.? [A-Z]", page, re.M)}


def resolves(path: str) -> bool:
    """A docs path exists as a file, or (under docs/results/) as a benchmark result that the
    site's hook publishes there."""
    if (ROOT / path).is_file():
        return True
    if path.startswith("docs/results/"):
        return (ROOT / "bench" / "results" / path.removeprefix("docs/results/")).is_file()
    return False


def citations(pattern: re.Pattern[str]) -> list[tuple[str, re.Match[str]]]:
    return [(str(p.relative_to(ROOT)), m) for p in SOURCES
            for m in pattern.finditer(flat(p.read_text(encoding="utf-8")))]


def test_no_source_cites_the_old_design_file():
    cites = [f"{p.relative_to(ROOT)}" for p in [*SOURCES, *(ROOT / "tests").rglob("*.py"),
                                                *(ROOT / "bench").rglob("*.py")]
             if re.search(r"(?<!docs/)\bDESIGN\.md", p.read_text(encoding="utf-8"))
             and p.name != Path(__file__).name]
    assert cites == [], "cite docs/design.md with the section instead"


def test_cited_docs_files_exist():
    missing = sorted({f"{src}: {m.group(0)}" for src, m in citations(DOC_PATH)
                      if m.group(0) not in PENDING and not resolves(m.group(0))})
    assert missing == []


def test_pending_citations_are_still_missing():
    assert [p for p in PENDING if resolves(p)] == [], "these exist now: remove them from PENDING"


def test_design_citations_name_existing_sections():
    sections = design_sections()
    titles = {t: n for n, t in sections.items()}
    found = citations(DESIGN_CITE)
    assert len(found) >= 35  # the source's citations of the design, found by the pattern
    wrong = []
    for src, m in found:
        num, title = m["num"], m["title"]
        if num is not None and num not in sections:
            wrong.append(f"{src}: §{num} is no section of docs/design.md")
        if title is not None and title not in titles:
            wrong.append(f"{src}: no section of docs/design.md is titled {title!r}")
        if num is not None and title is not None and sections.get(num) != title:
            wrong.append(f"{src}: §{num} is titled {sections.get(num)!r}, not {title!r}")
    assert wrong == []


def test_spec_citations_name_existing_sections():
    sections = spec_sections()
    assert {"1.1", "2.5", "4.3", "7.2"} <= sections  # the parser sees the spec's numbering
    wrong = sorted({f"{src}: SPEC-024 §{m.group(1)}" for src, m in citations(SPEC_CITE)
                    if m.group(1) not in sections})
    assert wrong == []


def test_the_checker_catches_a_wrong_citation():
    """The patterns are what the tests above rely on: a wrong number, a wrong title and a
    missing file are each seen."""
    sections = design_sections()
    text = flat('x (docs/design.md §3.11\n    # "Not a title") y docs/nope.md z')
    m = DESIGN_CITE.search(text)
    assert m is not None and m["num"] == "3.11" and m["title"] == "Not a title"
    assert sections["3.11"] != m["title"]
    assert [p.group(0) for p in DOC_PATH.finditer(text)] == ["docs/design.md", "docs/nope.md"]
    assert not resolves("docs/nope.md") and resolves("docs/design.md")
