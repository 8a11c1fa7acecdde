"""Fact recipes (contextual fact embeddings): what the model reads for a fact, the embedding
identity a recipe makes, refusals when identities differ, and `cdr ckf reembed` — exact,
resumable after an interruption, and refused to sessions of the old identity afterwards."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from cdr.ckf import CKF, DocumentInput, ingest_texts
from cdr.ckf.reembed import reembed
from cdr.cli import app
from cdr.errors import EmbeddingModelMismatchError, InvalidInputError
from cdr.retrieval.embed import default_embedder
from cdr.retrieval.fact_recipe import (
    CONTEXT_TOKENS,
    CONTEXT_WORDS,
    DEFAULT_RECIPE,
    PLAIN,
    TITLE_SECTION,
    TITLE_SECTION_SHORT,
    RecipeEmbedder,
    bind,
    context_of,
    fact_text,
    identity,
    short_context_of,
    split_identity,
)
from cdr.text.tokens import count_tokens

MODEL = "sentence-transformers/all-MiniLM-L6-v2"
DOCS = [
    DocumentInput("final.md", "# Cup final 1923\n\n## Attendance\n\n"
                  "The match drew a crowd far larger than the ground could hold. Police on "
                  "horseback cleared the pitch before kick-off.\n\n## Result\n\n"
                  "The home side won by two goals to nil after a scoreless first half.\n"),
    DocumentInput("games.md", "# Summer Games 1924\n\n## Ceremony\n\n"
                  "The opening ceremony was held in the main stadium in front of the crowd. "
                  "Athletes from forty nations marched behind their flags.\n\n## Legacy\n\n"
                  "The motto citius, altius, fortius was first used at these Games.\n"),
]
runner = CliRunner()


# ----------------------------------------------------------------------------- the text


def test_identity_round_trip_and_plain_is_bare():
    assert identity(MODEL, PLAIN) == MODEL
    assert identity(MODEL, TITLE_SECTION) == f"{MODEL}#title-section"
    assert split_identity(f"{MODEL}#title-section") == (MODEL, TITLE_SECTION)
    assert split_identity(MODEL) == (MODEL, PLAIN)
    # a '#' that is not a known recipe belongs to the model id
    assert split_identity("org/model#v2") == ("org/model#v2", PLAIN)
    with pytest.raises(InvalidInputError, match="unknown fact recipe 'title'"):
        identity(MODEL, "title")


def test_fact_text_prefixes_title_and_section_and_drops_a_repeated_title():
    assert fact_text(PLAIN, "It rained.", "Cup final", "Cup final > Weather") == "It rained."
    assert fact_text(TITLE_SECTION, "It rained.", "Cup final", "Cup final > Weather") == \
        "Cup final — Weather: It rained."
    assert fact_text(TITLE_SECTION, "It rained.", None, "Weather") == "Weather: It rained."
    assert fact_text(TITLE_SECTION, "It rained.", "Cup final", "") == "Cup final: It rained."
    assert fact_text(TITLE_SECTION, "It rained.", "", "  >  > ") == "It rained."


def test_hostile_titles_are_cleaned_and_bounded():
    ctx = context_of("Evil\x00\x1b[31m\u2028title\n\twith\rbreaks", "A\x07 > B")
    assert all(ord(c) >= 32 and c not in "\u2028\u2029\x7f" for c in ctx)
    assert ctx.startswith("Evil [31m title with breaks")
    huge = context_of(" ".join(["word"] * 10_000), " > ".join(f"s{i}" for i in range(5000)))
    assert len([w for w in huge.split() if w not in "—>"]) <= CONTEXT_WORDS
    # the deepest headings are kept when the path is long
    assert huge.endswith("s4999")


def test_short_recipe_keeps_the_name_and_the_deepest_heading_within_its_tokens():
    assert DEFAULT_RECIPE == TITLE_SECTION_SHORT
    assert identity(MODEL, TITLE_SECTION_SHORT) == f"{MODEL}#title-section-short"
    assert split_identity(f"{MODEL}#title-section-short") == (MODEL, TITLE_SECTION_SHORT)
    assert fact_text(TITLE_SECTION_SHORT, "It rained.", "Cup final", "Cup final > Weather") == \
        "Cup final — Weather: It rained."
    # a long title gives up its tail first; the heading stays while the title keeps 2 words
    ctx = short_context_of("io_destroy - destroy an asynchronous I/O context",
                           "io_destroy - destroy an asynchronous I/O context > Return value")
    assert ctx.startswith("io_destroy - ") and ctx.endswith(" — Return value")
    assert count_tokens(ctx + ": ") <= CONTEXT_TOKENS
    assert short_context_of(None, "A > B > Weather") == "Weather"
    assert short_context_of("", "  >  > ") == ""
    assert fact_text(TITLE_SECTION_SHORT, "It rained.", "", "") == "It rained."


def test_hostile_input_to_the_short_recipe_is_cleaned_and_cut():
    ctx = short_context_of("Evil\x00\x1b[31m\u2028title", "A\x07 > B\r\nC")
    assert all(ord(c) >= 32 and c not in "\u2028\u2029\x7f" for c in ctx)
    huge = short_context_of(" ".join(["word"] * 10_000), " > ".join(f"s{i}" for i in range(5000)))
    assert count_tokens(huge + ": ") <= CONTEXT_TOKENS and huge.startswith("word word")
    # one unbreakable word longer than the bound leaves no prefix rather than a cut word
    assert short_context_of("x" * 5000, "") == ""


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=400), st.text(max_size=400), st.text(min_size=1, max_size=80))
def test_short_context_is_always_within_its_tokens(title, section, content):
    text = fact_text(TITLE_SECTION_SHORT, content, title, section)
    assert text.endswith(content)
    ctx = short_context_of(title, section)
    assert ctx == "" or count_tokens(ctx + ": ") <= CONTEXT_TOKENS
    assert "\n" not in ctx and "\x00" not in ctx


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=400), st.text(max_size=400), st.text(min_size=1, max_size=80))
def test_context_is_always_bounded_and_keeps_the_fact(title, section, content):
    text = fact_text(TITLE_SECTION, content, title, section)
    assert text.endswith(content)
    ctx = context_of(title, section)
    assert len([w for w in ctx.split() if w not in ("—", ">")]) <= CONTEXT_WORDS
    assert "\n" not in ctx and "\x00" not in ctx


def test_bind_wraps_the_bare_model_and_refuses_others():
    model = default_embedder()
    bound = bind(model, f"{MODEL}#title-section")
    assert isinstance(bound, RecipeEmbedder) and bound.model_id == f"{MODEL}#title-section"
    assert bind(model, MODEL) is model
    assert bind(bound, bound.model_id) is bound
    with pytest.raises(EmbeddingModelMismatchError):
        bind(bound, MODEL)  # a bound embedder is never re-bound to another recipe
    with pytest.raises(EmbeddingModelMismatchError):
        bind(model, "other/model#title-section")
    # queries are embedded as they are: the recipe only changes facts
    assert np.array_equal(bound.encode(["crowd at the final"]),
                          model.encode(["crowd at the final"]))


# ----------------------------------------------------------------------------- the CKF


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, Path]:
    out = {}
    for recipe in (PLAIN, TITLE_SECTION):
        path = tmp_path_factory.mktemp(recipe) / "kb.ckf"
        with CKF.create(path, recipe=recipe) as ckf:
            ingest_texts(ckf, DOCS)
        out[recipe] = path
    return out


def _copy(src: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "copy.ckf"
    shutil.copytree(src, dst)
    return dst


def test_vectors_are_the_recipe_text_embedded(built):
    model = default_embedder()
    with CKF.open(built[TITLE_SECTION]) as ckf:
        assert ckf.model_id == f"{MODEL}#title-section" and ckf.recipe == TITLE_SECTION
        rows = np.arange(ckf.n_rows)
        facts = ckf.facts(rows)
        texts = [fact_text(TITLE_SECTION, f.content, "Cup final 1923" if f.source == "final.md"
                           else "Summer Games 1924", f.section) for f in facts]
        want = model.encode(texts)
        assert np.allclose(ckf.vectors(rows), want, atol=2e-6)
        # the stored text stays the fact alone
        assert all("—" not in f.content for f in facts)
    with CKF.open(built[PLAIN]) as plain:
        assert plain.model_id == MODEL
        assert not np.allclose(plain.vectors(rows), want, atol=1e-3)


def test_open_or_create_refuses_another_recipe(built):
    with pytest.raises(InvalidInputError, match="reembed --recipe plain"):
        CKF.open_or_create(built[TITLE_SECTION], recipe=PLAIN)
    with CKF.open_or_create(built[TITLE_SECTION]) as ckf:  # no recipe: whatever it holds
        assert ckf.recipe == TITLE_SECTION


def test_reembed_gives_what_a_fresh_ingest_gives(built, tmp_path):
    path = _copy(built[PLAIN], tmp_path)
    with CKF.open(path) as ckf:
        ids_before = ckf.fact_ids(np.arange(ckf.n_rows))
        rep = reembed(ckf, TITLE_SECTION)
        assert rep.model_id == f"{MODEL}#title-section" and rep.embedded == ckf.n_rows
        assert ckf.model_id == rep.model_id and ckf.fact_ids(np.arange(ckf.n_rows)) == ids_before
        got = ckf.vectors(np.arange(ckf.n_rows))
        assert ckf.check() == []
    with CKF.open(built[TITLE_SECTION]) as fresh:
        assert np.allclose(got, fresh.vectors(np.arange(fresh.n_rows)), atol=2e-6)
    with CKF.open(path) as again:  # a second call is a no-op
        assert reembed(again, TITLE_SECTION).unchanged
        assert not (path / "reembed").exists()


def test_reembed_interrupted_resumes_and_readers_keep_the_old_vectors(built, tmp_path):
    path = _copy(built[PLAIN], tmp_path)
    calls = []

    def die_after_first_chunk(done: int, total: int) -> None:
        calls.append(done)
        if done >= 2:
            raise KeyboardInterrupt

    with CKF.open(path) as ckf:
        old = ckf.vectors(np.arange(ckf.n_rows)).copy()
        with pytest.raises(KeyboardInterrupt):
            reembed(ckf, TITLE_SECTION, chunk_rows=2, progress=die_after_first_chunk)
        assert ckf.model_id == MODEL and np.array_equal(ckf.vectors(np.arange(ckf.n_rows)), old)
    with CKF.open(path) as ckf:
        rep = reembed(ckf, TITLE_SECTION, chunk_rows=2)
        assert rep.resumed_from == 2 and rep.embedded == ckf.n_rows - 2
        got = ckf.vectors(np.arange(ckf.n_rows))
    with CKF.open(built[TITLE_SECTION]) as fresh:
        assert np.allclose(got, fresh.vectors(np.arange(fresh.n_rows)), atol=2e-6)


def test_reembed_sees_facts_ingested_after_it(built, tmp_path):
    """A document ingested after the re-embedding started is embedded under the new recipe
    (the tail rows, under the writer's lock) and searchable by it."""
    path = _copy(built[PLAIN], tmp_path)
    with CKF.open(path) as ckf:
        late = DocumentInput("late.md", "# Late page\n\nA page that arrived while the "
                             "facts were being embedded again, with enough words to count.\n")

        def ingest_midway(done: int, total: int) -> None:
            if done == 2 and ckf.n_rows == total:
                ingest_texts(ckf, [late])

        reembed(ckf, TITLE_SECTION, chunk_rows=2, progress=ingest_midway)
        assert ckf.document_state("late.md") is not None
        rows = np.asarray(ckf.document_rows("late.md"))
        want = default_embedder().encode(
            [fact_text(TITLE_SECTION, f.content, "Late page", f.section)
             for f in ckf.facts(rows)])
        assert np.allclose(ckf.vectors(rows), want, atol=2e-6)


def test_cli_reembed_and_refusal(built, tmp_path):
    path = _copy(built[TITLE_SECTION], tmp_path)
    res = runner.invoke(app, ["ingest", str(tmp_path), "--ckf", str(path), "--recipe", "plain"])
    assert res.exit_code != 0 and "reembed --recipe plain" in res.output
    res = runner.invoke(app, ["ckf", "reembed", "--ckf", str(path), "--recipe", "plain",
                              "--json"])
    assert res.exit_code == 0, res.output
    with CKF.open(path) as ckf:
        assert ckf.model_id == MODEL
    res = runner.invoke(app, ["ckf", "reembed", "--ckf", str(path), "--recipe", "nope"])
    assert res.exit_code != 0 and "unknown fact recipe 'nope'" in res.output
