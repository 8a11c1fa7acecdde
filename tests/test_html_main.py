"""Main-content extraction for HTML (cdr.ckf.html_main): site chrome in plain divs is kept out
when trafilatura is installed and the page is safe to hand it; otherwise, and with
CDR_HTML_EXTRACTOR=off, the streaming parser's blocks are kept as they are."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cdr.ckf import html_main
from cdr.ckf.html_blocks import parse_html
from cdr.ckf.records import Block

pytest.importorskip("trafilatura", reason="trafilatura is a dependency; reinstall cdr")

MENU = ("<div class='top'><div><a href='/'>Home</a></div><div><a href='/m'>Menu</a></div>"
        "<div><a href='/a'>About</a></div><div><a href='/d'>Documentation</a></div>"
        "<div><a href='/dl'>Download</a></div><div><a href='/p'>Purchase</a></div></div>")
BODY = "".join(
    f"<p>Partial indexes cover a subset of the rows of a table, chosen by a WHERE clause; "
    f"paragraph {i} explains how the query planner uses them when the query implies the "
    f"index's condition, which saves space and time on writes.</p>" for i in range(6))
PAGE = (f"<html><head><title>Partial Indexes</title></head><body>{MENU}"
        f"<div class='content'><h1>Partial Indexes</h1>{BODY}</div>"
        f"<div class='foot'><a href='/c'>Contact</a> <a href='/l'>License</a></div>"
        "</body></html>")
CHROME = {"Home", "Menu", "About", "Documentation", "Download", "Purchase"}


def test_menu_in_plain_divs_is_kept_out(monkeypatch):
    monkeypatch.delenv(html_main.ENV, raising=False)
    doc = parse_html(PAGE)
    texts = [b.text for b in doc.blocks]
    assert not CHROME & {w for t in texts for w in t.split()}
    assert len(texts) == 6 and all(t.startswith("Partial indexes cover") for t in texts)
    assert {b.section for b in doc.blocks} == {("Partial Indexes",)}
    assert doc.title == "Partial Indexes"


def test_off_switch_keeps_every_block(monkeypatch):
    monkeypatch.setenv(html_main.ENV, "off")
    texts = [b.text for b in parse_html(PAGE).blocks]
    assert set(texts) >= CHROME and len(texts) > 6
    assert html_main.extractor_id() == "stream"
    monkeypatch.setenv(html_main.ENV, "on")
    assert html_main.extractor_id().startswith("trafilatura ")


def test_deep_page_skips_the_extractor_and_keeps_the_streaming_guarantees(monkeypatch):
    monkeypatch.delenv(html_main.ENV, raising=False)
    monkeypatch.setattr(html_main, "extracted_text",
                        lambda html: pytest.fail("the extractor must not see a deep page"))
    deep = "<div>" * 50_000 + "<h2>Deep</h2><p>inner text</p>" + "</div>" * 50_000
    doc = parse_html(MENU + deep)
    assert [b.text for b in doc.blocks][-1] == "inner text"
    blocks = [Block("x y z")]
    assert html_main.keep_main_blocks(deep, blocks)[1].reason == "page nested 200 or more deep"


def test_huge_page_skips_the_extractor(monkeypatch):
    monkeypatch.delenv(html_main.ENV, raising=False)
    monkeypatch.setattr(html_main, "MAX_CHARS", 1000)
    kept, note = html_main.keep_main_blocks(PAGE, [Block("Home"), Block("text here now")])
    assert not note.used and "over 1,000 characters" in note.reason and len(kept) == 2


def test_extractor_failure_or_refusal_keeps_every_block(monkeypatch):
    import trafilatura

    monkeypatch.delenv(html_main.ENV, raising=False)

    def boom(*a, **k):
        raise ValueError("lxml choked")

    monkeypatch.setattr(trafilatura, "extract", boom)
    blocks = [Block("Home"), Block("Partial indexes cover rows")]
    assert html_main.keep_main_blocks(PAGE, blocks) == (
        blocks, html_main.MainContent(False, "extractor found no main content"))
    monkeypatch.setattr(trafilatura, "extract", lambda *a, **k: None)
    assert html_main.keep_main_blocks(PAGE, blocks)[0] == blocks
    monkeypatch.setattr(trafilatura, "extract", lambda *a, **k: "nothing alike at all")
    assert html_main.keep_main_blocks(PAGE, blocks) == (
        blocks, html_main.MainContent(False, "extracted text matched no block"))


def test_blocks_are_kept_by_their_trigrams(monkeypatch):
    import trafilatura

    monkeypatch.delenv(html_main.ENV, raising=False)
    monkeypatch.setattr(trafilatura, "extract", lambda *a, **k: (
        "The planner uses the partial index when the WHERE clause implies it.\nCode: x = 1"))
    blocks = [Block("the planner uses the partial index"),  # all trigrams in: kept
              Block("The planner uses a different thing entirely here"),  # 1 of 6, no
              # sentence end: dropped
              Block("x = 1"),  # short, every word in the text: kept
              Block("Purchase"),  # short, not in the text: dropped
              Block("zip Wraps zip() usage in a list call, unless told otherwise."),  # a
              # sentence of 11 words the extractor left out: kept
              Block("SQLITE_OPEN_MAIN_DB SQLITE_OPEN_TEMP_DB", is_code=True),  # code: kept
              Block("Home About Documentation Download License Support Purchase Search")]
    kept, note = html_main.keep_main_blocks(PAGE, blocks)
    assert kept == [blocks[0], blocks[2], blocks[4], blocks[5]]
    assert note == html_main.MainContent(True, "trafilatura", 3)


@given(st.integers(min_value=0, max_value=400), st.integers(min_value=0, max_value=20))
def test_nesting_depth_counts_open_elements_up_to_the_cap(n, voids):
    html = "<div>" * n + "<br><img src=x><p>" * voids + "text" + "</div>" * n
    assert html_main.nesting_depth(html) == min(n, html_main.MAX_DEPTH)


def test_short_blocks_stay_as_lines_or_names_and_page_stamps_go(monkeypatch):
    import trafilatura

    monkeypatch.delenv(html_main.ENV, raising=False)
    monkeypatch.setattr(trafilatura, "extract", lambda *a, **k: (
        "Imposter Tables\n"
        "About imposter tables: the documentation says to call sqlite3_test_control first.\n"
        "This page last modified on 2022-04-12 00:22:10 UTC"))
    blocks = [Block("About"), Block("Documentation"),  # menu words the prose happens to use
              Block("Imposter Tables"),  # a line of the extracted text: a heading
              Block("sqlite3_test_control"),  # a name the text mentions
              Block("Support"),  # in neither
              Block("This page last modified on 2022-04-12 00:22:10 UTC"),  # the page's stamp
              Block("Last updated on Dec 02, 2026."),
              Block("The page was last modified by the tests, which then checked its rows.")]
    kept, note = html_main.keep_main_blocks(PAGE, blocks)
    assert kept == [blocks[2], blocks[3], blocks[7]]
    assert note == html_main.MainContent(True, "trafilatura", 5)


def test_the_lead_before_the_first_section_keeps_only_sentences_and_code(monkeypatch):
    # A page of links (a list of diagrams) leaves the extractor nothing to tell apart: it
    # returns the whole page, menu included. Before the first section only prose and code
    # stay; in a section the usual rules apply.
    import trafilatura

    monkeypatch.delenv(html_main.ENV, raising=False)
    menu = ["Small. Fast. Reliable. Choose any three.", "Home", "About", "Documentation"]
    monkeypatch.setattr(trafilatura, "extract", lambda *a, **k: "\n".join(
        [*menu, "Syntax Diagrams", "alter-table-stmt", "analyze-stmt"]))
    sec = ("Syntax Diagrams",)
    blocks = [*(Block(t) for t in menu),
              Block("This page lists every syntax diagram of the SQL language, by name."),
              Block("alter-table-stmt", section=sec), Block("analyze-stmt", section=sec),
              Block("attach-stmt", section=sec), Block("begin-stmt", section=sec),
              Block("commit-stmt", section=sec),
              Block("Each diagram shows the grammar of one statement, with its optional "
                    "clauses and keywords.", section=sec), Block("Home", section=sec)]
    kept, _ = html_main.keep_main_blocks(PAGE, blocks)
    assert [b.text for b in kept] == [
        "This page lists every syntax diagram of the SQL language, by name.",
        "alter-table-stmt", "analyze-stmt", blocks[10].text, "Home"]
    # A lead of more than half the page's words is the page's content, not its header;
    # a dozen menu items before one big table are the header.
    long_lead = [Block("Home"), Block("About"), Block("alter-table-stmt"),
                 Block("analyze-stmt", section=sec)]
    assert html_main._lead_length(long_lead) == 0
    assert html_main._lead_length(blocks) == 5
    menu_words = ["Home", "Menu", "About", "Download", "License", "Support", "Search"]
    table = [*(Block(w) for w in menu_words),
             Block("Date | Version\n" + "2022-12-28 | 3.40.1\n" * 5, section=("History",))]
    assert html_main._lead_length(table) == 7


def test_a_page_that_is_only_its_menu_has_no_content(monkeypatch):
    # No section, the extractor returns the menu (there is nothing else), the blocks are the
    # menu's links and a tagline: no main content, so no blocks (the ingest skips the page).
    import trafilatura

    monkeypatch.delenv(html_main.ENV, raising=False)
    words = ["Home", "Menu", "About", "Documentation", "Download"]
    page = "<div>" + "".join(f"<div><a href='/{w}'>{w}</a></div>" for w in words) + "</div>"
    monkeypatch.setattr(trafilatura, "extract",
                        lambda *a, **k: "Small. Fast. Reliable.\n" + "\n".join(words))
    blocks = [Block("Small. Fast. Reliable."), *(Block(w) for w in words)]
    assert html_main.keep_main_blocks(page, blocks) == (
        [], html_main.MainContent(True, "only navigation links", 6))
    # With content besides the menu, the content stays and the menu goes.
    text = "The keyword index lists every keyword of the SQL language with its pages."
    monkeypatch.setattr(trafilatura, "extract", lambda *a, **k: "\n".join([*words, text]))
    kept, _ = html_main.keep_main_blocks(page, [*blocks[1:], Block(text)])
    assert [b.text for b in kept] == [text]
    # After the first sentence, linked one- or two-word blocks are list items, not a menu.
    items = ["Partial indexes", "UPSERT", "Window functions"]
    listing = page + "".join(f"<li><a href='/{i}'>{i}</a></li>" for i in items)
    monkeypatch.setattr(trafilatura, "extract", lambda *a, **k: "\n".join([text, *items]))
    kept, _ = html_main.keep_main_blocks(
        listing, [*blocks[1:], Block(text), *(Block(i) for i in items)])
    assert [b.text for b in kept] == [text, *items]
    # A hostile page of unclosed links is scanned in linear time (no backtracking blow-up).
    assert html_main._link_texts("<a href=x>" * 200_000) == set()
