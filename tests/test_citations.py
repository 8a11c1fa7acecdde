"""Citations (cdr.citations): the writer's markers out, every factual sentence checked against
the facts the window was given, the document's numbers in, and a sources list that renders
what documents hold as text."""

from __future__ import annotations

import hashlib
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cdr.citations import (
    CITED,
    REPAIRED,
    UNSUPPORTED,
    Citer,
    GivenFact,
    SourceEntry,
    number_facts,
    rendered,
    sources_markdown,
    take_writer_markers,
)
from cdr.citations.attribute import factual_sentences, rendered_spans
from cdr.citations.markers import marker_text
from cdr.citations.sources import escape_markdown
from cdr.retrieval.embed import default_embedder

WORDS = st.sampled_from(["index", "table", "the", "rows", "vacuum", "query", "planner", "B-tree",
                         "lock", "data"])
SENTENCE = st.lists(WORDS, min_size=4, max_size=10).map(lambda w: " ".join(w).capitalize() + ".")
PARAGRAPH = st.lists(SENTENCE, min_size=1, max_size=4)
DOC = st.lists(PARAGRAPH, min_size=1, max_size=5)
REF = st.integers(1, 40).map(lambda n: f"F{n}")
MARKER = st.tuples(st.lists(REF, min_size=1, max_size=3),
                   st.sampled_from(["[{}]", "({})", " [{}]", " ({})"]),
                   st.sampled_from([", ", "; ", " and ", ","])).map(
    lambda t: (tuple(t[0]), t[1].format(t[2].join(t[0]))))


def bag_encode(texts: list[str]) -> np.ndarray:
    """A deterministic bag-of-words encoder (a test double for the embedder in properties
    that are about bookkeeping, not meaning): unit rows, equal for equal word sets."""
    out = np.zeros((len(texts), 64), np.float32)
    for i, t in enumerate(texts):
        for w in re.findall(r"\w+", t.lower()):
            out[i, int(hashlib.sha1(w.encode()).hexdigest(), 16) % 64] += 1.0
        out[i] /= max(np.linalg.norm(out[i]), 1e-9)
    return out


# ----------------------------------------------------------------------------- markers

@settings(max_examples=200, deadline=None)
@given(DOC, st.data())
def test_writer_markers_come_out_and_leave_the_text_as_it_was(doc, data):
    clean_paragraphs, marked_paragraphs, expected = [], [], []
    for para in doc:
        clean_s, marked_s = [], []
        for sentence in para:
            clean_s.append(sentence)
            if data.draw(st.booleans()):
                refs, text = data.draw(MARKER)
                before = data.draw(st.booleans())  # "x [F1]." or "x. [F1]"
                marked_s.append(sentence[:-1] + text + "." if before else sentence + text)
                expected.append(refs)
            else:
                marked_s.append(sentence)
        clean_paragraphs.append(" ".join(clean_s))
        marked_paragraphs.append(" ".join(marked_s))
    clean, markers = take_writer_markers("\n\n".join(marked_paragraphs))
    assert clean == "\n\n".join(clean_paragraphs)
    assert [m.refs for m in markers] == expected


def test_markers_inside_code_stay_and_other_brackets_stay():
    text = ("Use a list [1, 2] or see [the docs](x). It holds rows [F2].\n\n"
            "```python\nrows[F3] = 1  # [F4]\n```\n")
    clean, markers = take_writer_markers(text)
    assert [m.refs for m in markers] == [("F2",)]
    assert "rows[F3] = 1  # [F4]" in clean and "[1, 2]" in clean and "[the docs](x)" in clean
    assert "It holds rows." in clean


@settings(max_examples=100, deadline=None)
@given(DOC, st.sampled_from(["numbers", "footnotes"]), st.data())
def test_shown_text_is_the_clean_text_with_markers_after_each_cited_run(doc, style, data):
    clean = "\n\n".join(" ".join(p) for p in doc)
    given_facts = [GivenFact(f"F{i}", f"fact-{i}", "s.md", "S", "x") for i in range(1, 4)]
    citer = Citer(given_facts, bag_encode(["x"] * 3), bag_encode, threshold=0.0)
    refs = data.draw(st.lists(st.sampled_from(["F1", "F2", "F3"]), min_size=1, max_size=3))
    _, cit = citer.cite(clean.replace(".", f" [{refs[0]}].", 1))
    numbers = number_facts({}, cit.fact_order())
    shown, spans = rendered_spans(clean, cit, numbers, style)
    assert shown == rendered(clean, cit, numbers, style)
    # taking the inserted markers out gives back the clean text
    pattern = r"\[\^\d+\]" if style == "footnotes" else r"\[\d+\]"
    assert re.sub(pattern, "", shown) == clean
    for span in spans:
        assert shown[span.end:].startswith(marker_text(span.numbers, style))
        assert shown[span.start:span.end].strip()


# ----------------------------------------------------------------------------- attribution

FACTS = ["PostgreSQL provides several index types: B-tree, Hash, GiST, SP-GiST, GIN and BRIN.",
         "By default, the CREATE INDEX command creates B-tree indexes, which fit the most "
         "common situations.",
         "The write-ahead log ensures that changes to data files are logged before they are "
         "written, so a crash can be recovered from."]


@pytest.fixture(scope="module")
def citer() -> Citer:
    emb = default_embedder()
    given_facts = [GivenFact(f"F{i + 1}", f"id{i + 1}", "/srv/docs/indexes.html",
                             "Indexes > Types", c) for i, c in enumerate(FACTS)]
    return Citer(given_facts, emb.encode(FACTS), emb.encode)


def test_a_citation_to_a_fact_the_window_was_not_given_is_dropped_and_repaired(citer):
    _, cit = citer.cite("The default index that CREATE INDEX builds is a B-tree, which suits "
                        "most common situations [F9].")
    (s,) = cit.sentences
    assert cit.invalid == 1 and s.facts == ("id2",) and s.status == REPAIRED


def test_a_citation_to_a_given_fact_that_does_not_support_the_sentence_is_replaced(citer):
    _, cit = citer.cite("PostgreSQL offers the index types B-tree, Hash, GiST, SP-GiST, GIN "
                        "and BRIN [F3].")
    (s,) = cit.sentences
    assert s.facts == ("id1",) and s.status == REPAIRED and cit.dropped == 1


def test_a_supported_citation_stands_and_a_paragraph_cited_once_covers_its_sentences(citer):
    _, cit = citer.cite("PostgreSQL has several index types, such as B-tree, GiST and BRIN. "
                        "Changes are logged in the write-ahead log before data files are "
                        "written [F1, F3].")
    first, second = cit.sentences
    assert first.facts == ("id1",) and first.status == CITED
    assert second.facts == ("id3",) and second.status == CITED


def test_a_sentence_no_given_fact_supports_is_flagged_and_cites_nothing(citer):
    _, cit = citer.cite("Cats are wonderful pets that like to sleep all day [F1].")
    (s,) = cit.sentences
    assert s.status == UNSUPPORTED and s.facts == () and cit.unsupported == [s]


def test_headings_code_and_short_sentences_are_not_factual():
    text = ("## Index types\n\nSee below.\n\n```sql\nCREATE INDEX i ON t (a);\n```\n\n"
            "- A B-tree index sorts its keys.\n")
    spans = [text[s.start:s.end] for s in factual_sentences(text)]
    assert spans == ["A B-tree index sorts its keys."]  # the list marker is not the sentence


@settings(max_examples=150, deadline=None)
@given(DOC, st.lists(MARKER, max_size=8), st.integers(0, 4), st.data())
def test_a_citation_never_names_a_fact_the_window_was_not_given(doc, markers, n_given, data):
    texts = [" ".join(p) for p in doc]
    given_facts = [GivenFact(f"F{i}", f"fact-{i}", "s.md", "S", data.draw(SENTENCE))
                   for i in data.draw(st.lists(st.integers(1, 40), min_size=n_given,
                                               max_size=n_given, unique=True))]
    citer = Citer(given_facts, bag_encode([g.content for g in given_facts]), bag_encode,
                  threshold=data.draw(st.floats(0, 1)))
    marked = "\n\n".join(t + "".join(m[1] for m in markers[i::len(texts)])
                         for i, t in enumerate(texts))
    clean, cit = citer.cite(marked)
    ids = {g.fact_id for g in given_facts}
    refs = {g.ref for g in given_facts}
    # a parenthesised marker counts only when every ref in it was given (prose uses "(F1)")
    taken = [m[0] for m in markers if "(" not in m[1] or set(m[0]) <= refs]
    assert cit.written == sum(len(r) for r in taken)
    assert cit.invalid == sum(1 for r in taken for x in r if x not in refs)
    for s in cit.sentences:
        assert set(s.facts) <= ids and len(s.facts) <= 3
        assert all(v >= citer.threshold for v in s.support)
        assert (s.status == UNSUPPORTED) == (not s.facts)
        assert clean[s.start:s.end].strip() == clean[s.start:s.end]


# ----------------------------------------------------------------------------- numbering

@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.sampled_from("abcdefghij"), max_size=6), max_size=6))
def test_numbers_run_by_first_citation_and_never_change(windows):
    numbers: dict[str, int] = {}
    seen: list[str] = []
    for order in windows:
        before = dict(numbers)
        numbers = number_facts(numbers, order)
        assert {k: numbers[k] for k in before} == before
        for f in order:
            if f not in seen:
                seen.append(f)
    assert numbers == {f: i + 1 for i, f in enumerate(seen)}


# ----------------------------------------------------------------------------- sources

HOSTILE = "<script>alert(1)</script> [click](javascript:alert(1)) **bold** `code` # x"


def test_sources_list_renders_what_documents_hold_as_text():
    entries = [SourceEntry(1, "f1", "/docs/<b>x</b>.md", HOSTILE + " > Part", HOSTILE)]
    for style in ("numbers", "footnotes"):
        md = sources_markdown(entries, style)
        # every markup character is escaped: none is left bare
        assert not re.search(r"(?<!\\)(<script>|\]\(javascript|\*\*bold)", md)
        assert escape_markdown(HOSTILE) in md
    from markdown_it import MarkdownIt

    html = MarkdownIt("commonmark").render(sources_markdown(entries, "numbers"))
    assert "<script>" not in html and "<b>" not in html and 'href="javascript' not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html


def test_an_entry_without_title_or_path_is_still_readable():
    bare = SourceEntry(1, "0123456789abcdef0123", "", "", "")
    assert bare.title == "fact 0123456789ab"
    assert sources_markdown([bare], "numbers") == "## Sources\n\n1. fact 0123456789ab\n"
    named = SourceEntry(2, "f", "/a/b/notes.txt", "", "")
    assert named.title == "notes.txt"
    assert "- [2] notes.txt — /a/b/notes.txt" in sources_markdown([named], "numbers")
    assert sources_markdown([], "numbers") == "" and sources_markdown([bare], "off") == ""


PLACES = st.sampled_from(["end", "start", "own-line", "inside", "none"])


@st.composite
def marked_document(draw: st.DrawFn) -> tuple[str, list[str]]:
    """Markdown a small model might write: paragraphs, list items, headings and code, with
    markers at paragraph ends and starts, on their own lines, inside sentences and in code."""
    blocks: list[str] = []
    facts: list[str] = []
    for _ in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from(["para", "para", "list", "heading", "code"]))
        sentences = draw(PARAGRAPH)
        facts.append(" ".join(sentences))
        _, marker = draw(MARKER)
        marker = marker.strip()
        if kind == "heading":
            blocks.append(f"## {' '.join(sentences[0].split()[:3])} {marker}")
        elif kind == "code":
            blocks.append(f"```\nrows{marker} = 1\n```")
        elif kind == "list":
            blocks.append("\n".join(f"- {s} {marker}" for s in sentences))
        else:
            body = " ".join(sentences)
            place = draw(PLACES)
            blocks.append({"end": f"{body} {marker}", "start": f"{marker} {body}",
                           "own-line": f"{body}\n{marker}", "none": body,
                           "inside": body.replace(".", f" {marker}.", 1)}[place])
    return "\n\n".join(blocks), facts


@settings(max_examples=150, deadline=None)
@given(marked_document(), st.lists(st.integers(1, 9), min_size=1, max_size=300),
       st.sampled_from(["numbers", "footnotes"]))
def test_markers_survive_streaming_block_by_block(document, sizes, style):
    """What a stream releases, cited as it goes (`cdr.window.loop._stream_shape`), is exactly
    the window's shown text, however the writer placed its markers and its pieces cut them."""
    from cdr.text.kept_stream import KeptStream

    text, facts = document
    given_facts = [GivenFact(f"F{i}", f"fact-{i}", "s.md", "S", f) for i, f in enumerate(facts, 1)]
    citer = Citer(given_facts, bag_encode(facts), bag_encode)

    def shown(t: str) -> str:
        clean, cit = citer.cite(t)
        return rendered(clean, cit, number_facts({}, cit.fact_order()), style)

    got: list[str] = []
    held = KeptStream(got.append, shown)
    at = 0
    for size in sizes:
        if at >= len(text):
            break
        held.feed(text[at:at + size])
        at += size
    held.feed(text[at:])
    held.finish(shown(text))
    assert "".join(got) == shown(text)


@pytest.mark.parametrize(("marked", "refs"), [
    ("It holds rows [Fact 2].", ("F2",)), ("It holds rows [F 3].", ("F3",)),
    ("It holds rows [F1 & F2].", ("F1", "F2")), ("It holds rows [F1–F3].", ("F1", "F2", "F3")),
    ("It holds rows [f4; F5].", ("F4", "F5")), ("It holds rows [F1][F2].", ("F1", "F2")),
])
def test_the_marker_forms_small_models_write(marked, refs):
    clean, markers = take_writer_markers(marked)
    assert clean == "It holds rows." and tuple(r for m in markers for r in m.refs) == refs


def test_a_sentence_cites_at_most_three_facts_best_supported_first():
    facts = [f"The planner reads table statistics number {i} about rows." for i in range(5)]
    given_facts = [GivenFact(f"F{i + 1}", f"f{i}", "s", "S", c) for i, c in enumerate(facts)]
    citer = Citer(given_facts, bag_encode(facts), bag_encode, threshold=0.0)
    _, cit = citer.cite("The planner reads table statistics number 3 about rows "
                        "[F1, F2, F3, F4, F5].")
    (s,) = cit.sentences
    assert len(s.facts) == 3 and s.facts[0] == "f3" and list(s.support) == sorted(
        s.support, reverse=True)


def test_a_huge_text_is_cited_up_to_the_cap_and_the_rest_counted():
    from cdr.citations.attribute import MAX_SENTENCES

    given_facts = [GivenFact("F1", "f1", "s", "S", "Rows are stored in heap pages on disk.")]
    citer = Citer(given_facts, bag_encode(["Rows are stored in heap pages on disk."]),
                  bag_encode)
    text = " ".join(["Rows are stored in heap pages on disk [F1]."] * (MAX_SENTENCES + 300))
    _, cit = citer.cite(text)
    assert cit.factual == MAX_SENTENCES and cit.beyond == 300
    assert cit.to_dict()["beyond"] == 300


def test_a_damaged_trace_renders_no_live_markup_in_the_report():
    from cdr.report.citations import cited_text

    record = {"output": "Rows are stored in heap pages on disk.",
              "citations": {"sentences": [{"start": 0, "end": 38, "facts": ["f"],
                                           "numbers": ['1"><img src=x onerror=alert(1)>'],
                                           "support": [0.9], "status": "cited"}],
                            "factual": 1, "cited": 1, "unsupported": 0, "invalid": 0}}
    html = cited_text({"sources": [{"number": '1"><img>'}]}, record, 0)
    assert "<img" not in html


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.one_of(SENTENCE, st.sampled_from(["", "- item", "> quote",
                                                               "0", "## Head"])),
                          st.sampled_from(["\n", "\r\n", "\r", "\u2028", "\x0c", "\x85"])),
                max_size=12),
       st.sampled_from(["numbers", "footnotes"]))
def test_any_line_endings_are_cited_within_the_text(lines, style):
    """A writer's text with any line endings (a window of "\\r\\r0" once failed): every
    sentence the citer reads lies inside the text, and the shown text is the clean text with
    markers inserted."""
    clean = "".join(line + end for line, end in lines)
    given_facts = [GivenFact(f"F{i}", f"fact-{i}", "s.md", "S", "x") for i in range(1, 3)]
    citer = Citer(given_facts, bag_encode(["x"] * 2), bag_encode, threshold=0.0)
    out, cit = citer.cite(clean)
    assert out == clean
    for s in cit.sentences:
        assert 0 <= s.start < s.end <= len(clean) and clean[s.start:s.end].strip()
    shown = rendered(clean, cit, number_facts({}, cit.fact_order()), style)
    pattern = r"\[\^\d+\]" if style == "footnotes" else r"\[\d+\]"
    assert re.sub(pattern, "", shown) == clean
