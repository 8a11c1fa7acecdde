"""Every citation in the source points at something in the repository: a `docs/...` file, a
section of `docs/design.md` (by number and, where quoted, by title), or a section of the spec
(`SPEC-024 §N`). The design document used to live outside the repository, so 35 citations of
it resolved nowhere; this keeps them resolving as the documents change.

The same holds wherever a reader meets a citation: `docs/<page>.md §N` in the benchmarks,
tests, examples, README, changelog and the pages themselves names a numbered heading of that
page, a link's "§N" is the section its anchor opens, and the links from the README and the
changelog into `docs/` (which the site's strict build does not see) reach a heading."""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "cdr"
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
             if re.search(r"(?<!docs/)\bDESIGN(?:\.md|\s*§)", p.read_text(encoding="utf-8"))
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


# Everything a reader may meet a citation in, besides the source: this file is left out, for
# the wrong citations its last test feeds the patterns on purpose.
TEXTS = sorted({*SOURCES, *(ROOT / "bench").rglob("*.py"), *(ROOT / "tests").glob("*.py"),
                *(ROOT / "examples").glob("*.py"), *(ROOT / "examples").glob("*.md"),
                *(ROOT / "docs").rglob("*.md"), ROOT / "README.md", ROOT / "CHANGELOG.md"}
               - {Path(__file__).resolve(), *(ROOT / "docs" / "spec").glob("*.md")})
PAGE_CITE = re.compile(r"docs/(?P<page>[\w/-]+)\.md[\s,]*§\s*(?P<num>\d+(?:\.\d+)*)"
                       r"(?:[\s,]*\"(?P<title>[^\"]+)\")?")
SECTION_LINK = re.compile(r"\[[^\]]*§\s*(?P<num>\d+(?:\.\d+)*)[^\]]*\]\((?P<page>[^)#\s]*)"
                          r"#(?P<anchor>[^)\s]+)\)")
DOCS_LINK = re.compile(r"\]\((?P<page>docs/[\w/.-]+\.md)#(?P<anchor>[^)\s]+)\)")


def page_sections(page: Path) -> dict[str, str]:
    """A page's numbered headings at any level: number → title."""
    return {m["num"]: m["title"].strip() for m in re.finditer(
        r"^#{1,6} (?P<num>\d+(?:\.\d+)*)\.? (?P<title>.+)$", page.read_text("utf-8"), re.M)}


def slug(title: str) -> str:
    """The anchor the site's table of contents gives a heading (Python-Markdown's `toc`
    slugify, the default that mkdocs.yml keeps): markup and punctuation dropped, lower case,
    runs of spaces and hyphens made one hyphen."""
    text = re.sub(r"[`*_]", "", title)
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    return re.sub(r"[-\s]+", "-", re.sub(r"[^\w\s-]", "", text).strip().lower())


def anchors(page: Path) -> set[str]:
    """The anchors of a page's headings (`{#id}` attributes included)."""
    found = set()
    for m in re.finditer(r"^#{1,6} (.+?)\s*$", page.read_text("utf-8"), re.M):
        title, _, attr = m.group(1).partition("{#")
        found.add(attr.rstrip("}").strip() if attr else slug(title))
    return found


def text_of(path: Path) -> str:
    text = path.read_text(encoding="utf-8")
    return flat(text) if path.suffix == ".py" else re.sub(r"\s+", " ", text)


def test_section_citations_everywhere_name_existing_headings():
    """`docs/<page>.md §N` in any page, benchmark, test, example, the README or the
    changelog is a numbered heading of that page (and, where a title is quoted, that one)."""
    wrong, seen = [], 0
    for path in TEXTS:
        for m in PAGE_CITE.finditer(text_of(path)):
            seen += 1
            page = ROOT / "docs" / f"{m['page']}.md"
            where = f"{path.relative_to(ROOT)}: {m.group(0)}"
            if not page.is_file():
                wrong.append(f"{where}: no such page")
                continue
            sections = page_sections(page)
            if m["num"] not in sections:
                wrong.append(f"{where}: no section {m['num']}")
            elif m["title"] is not None and sections[m["num"]] != m["title"]:
                wrong.append(f"{where}: §{m['num']} is titled {sections[m['num']]!r}")
    assert seen >= 50  # the source's and the pages' citations, found by the pattern
    assert wrong == []


def test_a_section_link_opens_the_section_it_names():
    """`[design §7.5](../design.md#75-seams)`: the anchor is the heading numbered 7.5 (the
    strict build checks that an anchor exists, not that it is the section the text names)."""
    wrong, seen = [], 0
    for path in TEXTS:
        if path.suffix != ".md":
            continue
        for m in SECTION_LINK.finditer(path.read_text(encoding="utf-8")):
            seen += 1
            page = (path.parent / m["page"]).resolve() if m["page"] else path
            title = page_sections(page).get(m["num"]) if page.is_file() else None
            if title is None or slug(f"{m['num']} {title}") != m["anchor"]:
                wrong.append(f"{path.relative_to(ROOT)}: {m.group(0)}")
    assert seen >= 3
    assert wrong == []


def test_links_into_the_docs_from_outside_the_site_reach_a_heading():
    """The README, the changelog and the examples' READMEs link into `docs/` by file and
    anchor; the site's build checks its own pages' anchors only."""
    outside = [ROOT / "README.md", ROOT / "CHANGELOG.md", *(ROOT / "examples").glob("*.md")]
    wrong, seen = [], 0
    for path in outside:
        for m in DOCS_LINK.finditer(path.read_text(encoding="utf-8")):
            seen += 1
            page = ROOT / m["page"]
            if not page.is_file() or m["anchor"] not in anchors(page):
                wrong.append(f"{path.relative_to(ROOT)}: {m.group(0)}")
    assert seen >= 2
    assert wrong == []


def test_the_module_map_names_files_that_exist():
    """docs/design.md §7.1's tree: each `name.py` it lists is in the package directory the
    line sits under (or at the top level), so a module that moves takes its line with it."""
    text = (ROOT / "docs" / "design.md").read_text(encoding="utf-8")
    start = text.index("cdr/                         the spec's core")
    tree = text[start:text.index("```", start)]
    package, wrong, seen = None, [], 0
    for line in tree.splitlines():
        if m := re.match(r"[├└]─ (\w+)/", line):  # a sub-package at the tree's first level
            package = m.group(1)
        elif re.match(r"[├└]─ ", line):
            package = None
        for name in re.findall(r"\b(\w+\.py)\b", line):
            seen += 1
            if not any(p.is_file() for p in (SRC / name, SRC / (package or "") / name)):
                wrong.append(f"{package or 'cdr'}/{name}")
    assert seen >= 60
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
    # any page, and a section link whose anchor is another section's
    assert PAGE_CITE.search("see docs/length.md §9 here")["page"] == "length"
    link = SECTION_LINK.search("([design §7.4](../design.md#75-seams))")
    assert link is not None and link["num"] == "7.4"
    assert slug("7.4 " + sections["7.4"]) != link["anchor"] == slug("7.5 " + sections["7.5"])
    assert slug("7.1 Modules") == "71-modules"


def test_no_text_cites_the_design_document_by_its_old_name():
    """The design document is `docs/design.md`; the file the source and the reports once cited
    by another name never was in the repository, so such a citation resolves nowhere. The
    benchmark scripts and their committed reports are checked too: a report keeps whatever its
    generator wrote."""
    old = "DESIGN" + ".md"  # spelt apart so that this file does not match itself
    texts = [*(ROOT / "src").rglob("*.py"), *(ROOT / "bench").rglob("*.py"),
             *(ROOT / "bench" / "results").glob("*.md"), *(ROOT / "docs").rglob("*.md"),
             *(ROOT / "tests").glob("*.py"), ROOT / "README.md", ROOT / "CHANGELOG.md"]
    found = [str(p.relative_to(ROOT)) for p in texts
             if p.is_file() and old in p.read_text(encoding="utf-8", errors="replace")]
    assert found == []
