"""Assembling windows into one document."""

from cdr.window.assemble import assemble_document, split_sections


def test_split_sections():
    assert split_sections("intro\n\n## A\n\none\n\n## B ##\ntwo") == [
        (None, "intro"), ("A", "one"), ("B", "two")]
    assert split_sections("") == []


def test_sections_merge_in_outline_order():
    w1 = "## Beta\n\nb1\n\n## Alpha\n\na1"
    w2 = "## alpha\n\na2\n\n## Extra\n\nx1\n\n## Beta\n\nb2"
    doc = assemble_document("T", [w1, w2], ["Alpha", "Beta", "Gamma"])
    assert doc == "# T\n\n## Alpha\n\na1\n\na2\n\n## Beta\n\nb1\n\nb2\n\n## Extra\n\nx1\n"


def test_text_without_headings_is_kept_in_order():
    assert assemble_document("T", ["first", "second"]) == "# T\n\nfirst\n\nsecond\n"
