"""The CKF store end to end with the real default model, on real documentation.

Two corpora are embedded once per module and copied per test: Python's own language reference
topics (`pydoc_data.topics`) plus the hand-written fixtures as files, and the fixtures alone
ingested as in-memory documents (sources independent of paths, so copies stay valid).
"""

from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cdr.ckf import (
    CKF,
    CKFBusyError,
    DocumentInput,
    FactStatus,
    chunk_blocks,
    ingest,
    ingest_texts,
)
from cdr.ckf.sources import parse_bytes
from cdr.cli.samples import pydoc_topics_dir
from cdr.errors import EmbeddingModelMismatchError, InvalidInputError, NotFoundError
from cdr.ngrams import NgramIndex, ngram_hashes
from cdr.retrieval.embed import RemoteEmbedder, default_embedder
from cdr.retrieval.fact_recipe import fact_text
from cdr.text.tokens import count_tokens_batch

DATA = Path(__file__).parent / "data" / "ckf"
TOPICS = ["assert", "pass", "del", "return", "yield", "break", "continue", "global",
          "nonlocal", "raise", "while", "if", "for", "with", "lambda"]
FIXTURES = ["indexes.md", "page.html", "notes.txt"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("corpus")
    pydoc_topics_dir(root / "topics", topics=TOPICS)
    for name in FIXTURES:
        shutil.copy(DATA / name, root / name)
    return root


@pytest.fixture(scope="module")
def base(corpus, tmp_path_factory):
    """(path of a CKF built from `corpus` with source type official, its ingest report)."""
    path = tmp_path_factory.mktemp("base") / "base.ckf"
    with CKF.create(path) as ckf:
        report = ingest(ckf, [corpus], source_type="official")
    return path, report


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    path = tmp_path_factory.mktemp("small") / "small.ckf"
    with CKF.create(path) as ckf:
        ingest_texts(ckf, [DocumentInput(n, (DATA / n).read_bytes()) for n in FIXTURES])
    return path


def _copy(src: Path, tmp_path: Path) -> CKF:
    dst = tmp_path / "copy.ckf"
    shutil.copytree(src, dst)
    return CKF.open(dst)


def _doc_rows(ckf: CKF, source: str) -> list[int]:
    return ckf.document_rows(source)


def _selectable_everything(ckf: CKF, query: np.ndarray) -> set[int]:
    return set(ckf.select(query, -1.0).indices.tolist())


# ----------------------------------------------------------------------------- round trip


def test_round_trip_on_real_corpus(base, corpus):
    path, report = base
    files = sorted(p for p in corpus.rglob("*") if p.is_file())
    assert report.documents == report.documents_new == len(files) == len(TOPICS) + 3
    assert report.skipped == [] and report.stale == []
    with CKF.open(path) as ckf:
        assert ckf.check() == []
        assert ckf.model_id == "sentence-transformers/all-MiniLM-L6-v2#title-section-short"
        assert ckf.dim == 384
        assert isinstance(ckf.embeddings, np.memmap)  # mapped, not loaded
        # every document holds exactly the facts the chunker makes of it, in order
        expected_total = 0
        for f in files:
            kind = {".md": "md", ".html": "html", ".txt": "txt"}[f.suffix]
            drafts = chunk_blocks(parse_bytes(f.read_bytes(), kind).blocks)
            facts = ckf.facts(_doc_rows(ckf, str(f)))
            assert [x.content for x in facts] == [d.content for d in drafts]
            assert [x.id for x in facts] == [d.id for d in drafts]
            assert all(x.source in {str(p) for p in files} for x in facts)
            expected_total += len(drafts)
        assert report.facts_added == expected_total
        contents = [x.content for x in ckf.facts(range(ckf.n_rows))]
        assert len(set(contents)) == ckf.n_rows == report.embedded  # duplicates stored once
        # per-row arrays agree with the content they were computed from
        assert np.array_equal(ckf.token_counts, count_tokens_batch(contents))
        ref = NgramIndex.from_texts(contents)
        assert np.array_equal(ckf.ngram_index.offsets, ref.offsets)
        assert np.array_equal(ckf.ngram_index.hashes, ref.hashes)
        sample = list(range(0, ckf.n_rows, 7))
        # each vector is the model's reading of the fact under the CKF's recipe
        rows = ckf.committer.fact_contexts(0, ckf.n_rows)
        again = default_embedder().encode(
            [fact_text(ckf.recipe, *rows[i]) for i in sample])
        assert np.allclose(np.asarray(ckf.embeddings[sample]), again, atol=1e-5)
        assert np.allclose(np.linalg.norm(ckf.embeddings, axis=1), 1.0, atol=1e-5)


def test_importance_by_source_type_and_document_declaration(base):
    path, _ = base
    with CKF.open(path) as ckf:
        by_source = {d["source"].rsplit("/", 1)[1]: (d["source_type"], d["importance"])
                     for d in ckf.documents()}
        assert by_source["page.html"] == ("internal", 0.70)  # <meta name="cdr-source-type">
        assert by_source["indexes.md"] == ("official", 0.80)  # front matter
        assert by_source["notes.txt"] == ("official", 0.80)  # the ingest's source type
        rows = _doc_rows(ckf, ckf.document(next(s for s in (d["source"] for d in ckf.documents())
                                                   if s.endswith("page.html")))["source"])
        assert np.allclose(ckf.importance[rows], 0.70)


def test_select_is_exact_sorted_gated_and_limited(base):
    path, _ = base
    with CKF.open(path) as ckf:
        q = ckf.encode_query("assert statement for debugging assertions")
        sel = ckf.select(q, 0.3)
        sims = np.asarray(ckf.embeddings) @ q
        expected = np.flatnonzero((sims >= 0.3) & ckf.active)
        assert set(sel.indices.tolist()) == set(expected.tolist())
        assert np.all(np.diff(sel.relevances) <= 0)
        assert np.allclose(sel.relevances, sims[sel.indices], atol=1e-6)
        assert np.array_equal(sel.embeddings, np.asarray(ckf.embeddings[sel.indices]))
        assert sel.indices.dtype == np.int64 and sel.relevances.dtype == np.float32
        top = ckf.select(q, 0.3, limit=3)
        assert top.indices.tolist() == sel.indices[:3].tolist()
        assert "assert" in ckf.facts(top.indices[:1])[0].section.lower()
        assert len(ckf.select(q, 1.01)) == 0
        assert len(ckf.select(q, -1.0, limit=0)) == 0


@pytest.mark.parametrize(
    ("vector", "message"),
    [
        (np.ones(383, np.float32), "dimension 384"),
        (np.ones((2, 384), np.float32), "dimension 384"),
        (np.zeros(384, np.float32), "zero"),
        (np.full(384, np.nan, np.float32), "NaN"),
    ],
)
def test_select_rejects_bad_query_vectors(base, vector, message):
    with CKF.open(base[0]) as ckf, pytest.raises(InvalidInputError, match=message):
        ckf.select(vector, 0.4)


def test_select_rejects_bad_limit_and_gate(base):
    with CKF.open(base[0]) as ckf:
        q = np.ones(384, np.float32)
        with pytest.raises(InvalidInputError, match="limit"):
            ckf.select(q, 0.4, limit=-1)
        with pytest.raises(InvalidInputError, match="min_relevance"):
            ckf.select(q, float("nan"))
        with pytest.raises(InvalidInputError, match="out of range"):
            ckf.facts([ckf.n_rows])


# ----------------------------------------------------------------------------- re-ingest


def test_reingest_unchanged_embeds_nothing(base, corpus, tmp_path):
    ckf = _copy(base[0], tmp_path)
    rows_before = ckf.n_rows
    report = ingest(ckf, [corpus], source_type="official")
    assert report.embedded == 0
    assert report.documents_unchanged == report.documents == len(TOPICS) + 3
    assert report.facts_added == report.facts_removed == 0
    assert report.facts_kept == base[1].facts_added
    assert ckf.n_rows == rows_before and ckf.check() == []
    ckf.close()


def test_changed_document_reembeds_only_new_content(small, tmp_path):
    ckf = _copy(small, tmp_path)
    original = (DATA / "indexes.md").read_text()
    para_old = ("A major reason for using a partial index is to avoid indexing common values.")
    assert para_old in " ".join(original.split())
    changed = original.replace(
        "A major reason for using a partial index is to avoid indexing common values.",
        "The main reason for using a partial index is to skip indexing common values.",
    ).replace(
        "Only B-tree indexes can be declared unique.",
        "Only B-tree indexes can be declared unique.\n\nA unique index is created "
        "automatically for every primary key and unique constraint of a table.",
    ).replace(
        "- It reduces the size of the index.\n- It speeds up queries that do use the index.\n"
        "- It speeds up many table update operations.\n", "",
    )
    old_rows = _doc_rows(ckf, "indexes.md")
    old_ids = {f.id for f in ckf.facts(old_rows)}
    rep = ingest_texts(ckf, [("indexes.md", changed)])
    new_drafts = chunk_blocks(parse_bytes(changed.encode(), "md").blocks)
    new_ids = {d.id for d in new_drafts}
    assert rep.documents_changed == 1
    assert rep.embedded == len(new_ids - old_ids) >= 2
    assert rep.facts_added == len(new_ids - old_ids)
    assert rep.facts_removed == len(old_ids - new_ids)
    assert rep.facts_kept == len(old_ids & new_ids) > 0
    gone = [r for r in old_rows if ckf.facts([r])[0].id in old_ids - new_ids]
    assert np.all(ckf.status[gone] == FactStatus.DELETED)
    for r in gone:  # never selected, even by its own vector
        assert r not in _selectable_everything(ckf, np.asarray(ckf.embeddings[r]))
    # the same content again: nothing new to embed; the original back: old vectors reused
    assert ingest_texts(ckf, [("indexes.md", changed)]).embedded == 0
    back = ingest_texts(ckf, [("indexes.md", original)])
    assert back.embedded == 0 and back.documents_changed == 1
    assert set(_doc_rows(ckf, "indexes.md")) == set(old_rows)
    assert np.all(ckf.status[old_rows] == FactStatus.ACTIVE)
    assert ckf.check() == []
    ckf.close()


def test_delete_document_never_selected_again(base, tmp_path):
    ckf = _copy(base[0], tmp_path)
    source = next(d["source"] for d in ckf.documents() if d["source"].endswith("assert.txt"))
    rows = _doc_rows(ckf, source)
    held = Counter(r for d in ckf.documents() for r in ckf.document_rows(d["doc_id"]))
    shared = [r for r in rows if held[r] > 1]
    removed = ckf.delete_document(source)
    assert removed == len(rows) - len(shared)
    only_here = [r for r in rows if r not in shared]
    assert np.all(ckf.status[only_here] == FactStatus.DELETED)
    assert not ckf.active[only_here].any()
    for r in only_here:
        assert r not in _selectable_everything(ckf, np.asarray(ckf.embeddings[r]))
    with pytest.raises(NotFoundError, match="no document"):
        ckf.delete_document(source)
    assert ckf.check() == []
    # still so after reopening from disk
    path = ckf.path
    ckf.close()
    with CKF.open(path) as again:
        assert not again.active[only_here].any()
        assert again.stats()["facts_by_status"]["DELETED"] == len(only_here)


def test_duplicate_paragraph_stored_once_until_last_holder_goes(small, tmp_path):
    ckf = _copy(small, tmp_path)
    shared = ("Connection pools must be sized from measurements of the database, not from "
              "the number of application threads that happen to exist.")
    own = ("Only document A has this paragraph, which is about replication lag, how it is "
           "measured on a standby server, and when an alert should fire.")
    rep = ingest_texts(ckf, [("a.md", f"# A\n\n{shared}\n\n{own}"),
                             ("b.md", f"# B\n\n{shared}\n")])
    assert rep.embedded == 2  # the shared paragraph once, plus A's own
    (row,) = ckf.rows_for_ids([ckf.facts(_doc_rows(ckf, "b.md"))[0].id]).tolist()
    assert ckf.facts([row])[0].source == "a.md"
    ckf.delete_document("a.md")
    fact = ckf.facts([row])[0]
    assert fact.status == FactStatus.ACTIVE and fact.source == "b.md"
    assert ckf.delete_document("b.md") == 1
    assert ckf.facts([row])[0].status == FactStatus.DELETED
    assert ckf.check() == []
    ckf.close()


def test_quarantine_is_never_selected_and_survives_reingest(small, tmp_path):
    ckf = _copy(small, tmp_path)
    rows = _doc_rows(ckf, "notes.txt")
    target = ckf.facts(rows[:1])[0]
    q = np.asarray(ckf.embeddings[target.row])
    assert ckf.select(q, 0.99).indices.tolist() == [target.row]
    ckf.quarantine([target.id])
    assert ckf.status[target.row] == FactStatus.QUARANTINED
    assert target.row not in _selectable_everything(ckf, q)
    # re-ingesting a changed version of its document keeps the quarantine
    text = (DATA / "notes.txt").read_text() + "\nAn appended paragraph about release notes.\n"
    ingest_texts(ckf, [("notes.txt", text)])
    assert ckf.status[target.row] == FactStatus.QUARANTINED
    assert target.row not in _selectable_everything(ckf, q)
    ckf.unquarantine([target.row])
    assert ckf.select(q, 0.99).indices.tolist() == [target.row]
    assert ckf.check() == []
    ckf.close()


def test_vanished_file_is_stale_but_selectable_until_it_returns(tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    for n in FIXTURES:
        shutil.copy(DATA / n, docs / n)
    with CKF.create(tmp_path / "s.ckf") as ckf:
        ingest(ckf, [docs])
        rows = _doc_rows(ckf, str(docs / "notes.txt"))
        (docs / "notes.txt").rename(tmp_path / "notes.txt")
        rep = ingest(ckf, [docs])
        assert rep.stale == [str((docs / "notes.txt").resolve())]
        assert np.all(ckf.status[rows] == FactStatus.STALE) and ckf.active[rows].all()
        assert ckf.stats()["stale_documents"] == 1
        (tmp_path / "notes.txt").rename(docs / "notes.txt")
        rep = ingest(ckf, [docs])
        assert rep.stale == [] and rep.embedded == 0
        assert np.all(ckf.status[rows] == FactStatus.ACTIVE)


# ----------------------------------------------------------------------------- bad input


def test_bad_files_are_skipped_with_reasons_and_the_rest_ingested(tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    shutil.copy(DATA / "notes.txt", docs / "good.txt")
    (docs / "empty.md").write_bytes(b"")
    (docs / "blank.txt").write_bytes(b"\n   \n")
    (docs / "binary.txt").write_bytes(b"\x00\x01\x02 not text \x00")
    (docs / "latin1.md").write_bytes("# Caf\xe9\n\nCr\xe8me br\xfbl\xe9e".encode("latin-1"))
    (docs / "tiny.md").write_text("# T\n\nHi.\n")
    (docs / "bad.md").write_text("---\nimportance: high\n---\n\n# X\n\nEnough words here to "
                                 "form one complete fact about something.\n")
    with CKF.create(tmp_path / "s.ckf") as ckf:
        rep = ingest(ckf, [docs])
        reasons = {Path(p).name: r for p, r in rep.skipped}
        assert reasons == {
            "bad.md": "declared importance must be a number in (0, 1], got 'high'",
            "binary.txt": "binary file (contains NUL bytes)",
            "latin1.md": "not valid UTF-8 text (byte 0xe9 at offset 5); convert it to UTF-8",
        }
        assert {Path(p).name: r for p, r in rep.empty} == {  # no fact in them: not errors
            "blank.txt": "empty file (whitespace only)",
            "empty.md": "empty file",
            "tiny.md": "no facts: its text is under 10 tokens",
        }
        assert rep.documents_new == 1 and ckf.check() == []


def test_invalid_ingest_arguments(small, tmp_path):
    ckf = _copy(small, tmp_path)
    with pytest.raises(InvalidInputError, match=r"unknown source type 'blog'.*regulatory"):
        ingest(ckf, [DATA / "notes.txt"], source_type="blog")
    with pytest.raises(InvalidInputError, match=r"importance must be in \(0, 1\]"):
        ingest(ckf, [DATA / "notes.txt"], importance=1.5)
    with pytest.raises(NotFoundError, match="no such file"):
        ingest(ckf, [tmp_path / "missing"])
    ckf.close()


def test_importance_settable_per_ingest_and_per_document(small, tmp_path):
    ckf = _copy(small, tmp_path)
    reg = DocumentInput("reg.md", "# R\n\nA rule that every bank must follow when reporting "
                        "capital.", source_type="regulatory")
    own = DocumentInput("x.md", "# X\n\nA page about a topic with enough words to make one "
                        "fact.", importance=0.33)
    plain = DocumentInput("p.md", "# P\n\nA plain page that says nothing about its own weight "
                          "or where it came from.")
    rep = ingest_texts(ckf, [reg, own, plain], source_type="web", importance=0.55)
    assert rep.documents_new == 3
    imp = {d["source"]: d["importance"] for d in ckf.documents()}
    # per document (caller or declared type) beats per ingest, which beats the type default
    assert (imp["reg.md"], imp["x.md"], imp["p.md"]) == (0.90, 0.33, 0.55)
    ckf.set_document_importance("x.md", 0.5)
    assert np.allclose(ckf.importance[_doc_rows(ckf, "x.md")], 0.5)
    with pytest.raises(InvalidInputError, match="importance"):
        ckf.set_document_importance("x.md", 0)
    ckf.close()


# ----------------------------------------------------------------------------- model, store


def test_model_mismatch_names_both_models(small):
    other = RemoteEmbedder("text-embedding-3-small", "http://127.0.0.1:9/v1")
    with pytest.raises(EmbeddingModelMismatchError) as exc:
        CKF.open(small, other)
    assert exc.value.expected == "sentence-transformers/all-MiniLM-L6-v2#title-section-short"
    assert exc.value.got == "text-embedding-3-small"
    assert "all-MiniLM-L6-v2" in str(exc.value) and "text-embedding-3-small" in str(exc.value)


def test_create_and_open_errors(small, tmp_path):
    with pytest.raises(InvalidInputError, match="already a CKF"):
        CKF.create(small)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    with pytest.raises(InvalidInputError, match="not an empty directory"):
        CKF.create(tmp_path / "full")
    with pytest.raises(NotFoundError, match="no CKF at"):
        CKF.open(tmp_path / "nothing")


def test_create_beside_the_gateways_session_files(tmp_path):
    """`cdr serve --ckf NEWDIR` keeps its sessions in NEWDIR before the first upload creates
    the CKF there: those files are the only ones a new CKF may find in its directory."""
    root = tmp_path / "served.ckf"
    root.mkdir()
    for name in ("sessions.sqlite3", "sessions.sqlite3-wal", "sessions.jobs.sqlite3-shm"):
        (root / name).write_bytes(b"")
    with CKF.create(root) as ckf:
        assert ckf.n_rows == 0
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "sessions.txt").write_text("x")
    with pytest.raises(InvalidInputError, match="not an empty directory"):
        CKF.create(tmp_path / "other")


def test_float16_store_selects_like_float32(small, tmp_path):
    with CKF.create(tmp_path / "h.ckf", dtype="float16") as half, CKF.open(small) as full:
        ingest_texts(half, [DocumentInput(n, (DATA / n).read_bytes()) for n in FIXTURES])
        assert half.embeddings.dtype == np.float16 and half.check() == []
        q = full.encode_query("how large should a connection pool be")
        a, b = full.select(q, 0.0, limit=5), half.select(q, 0.0, limit=5)
        ids = lambda c, s: [f.id for f in c.facts(s.indices)]  # noqa: E731
        assert ids(full, a) == ids(half, b)
        assert np.allclose(a.relevances, b.relevances, atol=2e-3)
        assert b.embeddings.dtype == np.float32


def test_compact_renumbers_and_keeps_answers(base, tmp_path):
    ckf = _copy(base[0], tmp_path)
    for d in ckf.documents()[:4]:
        ckf.delete_document(d["doc_id"])
    q = ckf.encode_query("exceptions raised inside a with statement")
    before = [(f.id, round(r, 5)) for f, r in zip(
        ckf.facts(ckf.select(q, 0.2).indices), ckf.select(q, 0.2).relevances.tolist(),
        strict=True)]
    n_deleted = int((ckf.status == FactStatus.DELETED).sum())
    res = ckf.compact()
    assert res["rows_after"] == res["rows_before"] - n_deleted
    assert ckf.n_rows == res["rows_after"] and ckf.check() == []
    after = [(f.id, round(r, 5)) for f, r in zip(
        ckf.facts(ckf.select(q, 0.2).indices), ckf.select(q, 0.2).relevances.tolist(),
        strict=True)]
    assert after == before
    contents = [f.content for f in ckf.facts(range(ckf.n_rows))]
    assert np.array_equal(ckf.ngram_index.hashes, NgramIndex.from_texts(contents).hashes)
    assert np.array_equal(ckf.ngram_hashes[ckf.ngram_offsets[0]:ckf.ngram_offsets[1]],
                          ngram_hashes(contents[0]))
    assert sorted(p.name for p in ckf.path.iterdir() if ".e0." in p.name) == []
    ckf.close()


def test_second_handle_refreshes_and_writers_exclude_each_other(small, tmp_path):
    a = _copy(small, tmp_path)
    b = CKF.open(a.path)
    n = a.n_rows
    ingest_texts(a, [("new.md", "# New\n\nA new paragraph that the other handle has not seen "
                                "yet, about write-ahead logging.")])
    assert b.n_rows == n and b.refresh() and b.n_rows == n + 1
    assert not b.refresh()
    # the per-row state is read through to the state the handle caught up to, and read-only
    assert b.generation == b.latest_generation() and len(b.active) == len(b.importance) == n + 1
    with pytest.raises(AttributeError, match="read-only"):
        b.n_rows = 0
    with a.writing(), pytest.raises(CKFBusyError, match="another process"), \
            b.writing(lock_timeout=0.1):
        pass
    a.close()
    b.close()


def test_old_handle_refuses_to_read_rows_after_compaction(small, tmp_path):
    a = _copy(small, tmp_path)
    stale_handle = CKF.open(a.path)
    first = stale_handle.fact_ids([0])
    assert first == [a.facts([0])[0].id]
    a.delete_document("indexes.md")
    a.compact()
    with pytest.raises(NotFoundError, match="compacted"):
        stale_handle.facts([0])
    assert stale_handle.refresh() and stale_handle.fact_ids([0]) == a.fact_ids([0])
    a.close()
    stale_handle.close()


def test_new_chunking_rechunks_unchanged_files_and_embeds_only_new_texts(small, tmp_path):
    from cdr.ckf import ChunkConfig

    ckf = _copy(small, tmp_path)
    before = {f.id for f in ckf.facts(range(ckf.n_rows))}
    docs = [DocumentInput(n, (DATA / n).read_bytes()) for n in FIXTURES]
    assert ingest_texts(ckf, docs).documents_unchanged == 3
    cfg = ChunkConfig(target_tokens=40)
    rep = ingest_texts(ckf, docs, chunking=cfg)
    after = {d.id for n in FIXTURES
             for d in chunk_blocks(parse_bytes((DATA / n).read_bytes(), n.rsplit(".", 1)[1])
                                   .blocks, cfg)}
    assert rep.documents_changed == 3
    assert rep.embedded == len(after - before) > 0
    assert len(after & before) > 0  # facts that fit either way kept their rows and vectors
    ckf.close()


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    """2,000 random unit rows in three 'documents'; one deleted, a few rows quarantined."""
    rng = np.random.default_rng(3)
    ckf = CKF.create(tmp_path_factory.mktemp("syn") / "syn.ckf")
    for part in range(3):
        vecs = rng.standard_normal((700 if part < 2 else 600, 384)).astype(np.float32)
        vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
        ckf.append_raw([f"synthetic fact {part}-{i}" for i in range(len(vecs))], vecs,
                       source=f"syn-{part}")
    ckf.delete_document("syn-1")
    ckf.quarantine([5, 17, 1500])
    assert ckf.check() == []
    yield ckf
    ckf.close()


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), gate=st.floats(-0.2, 0.3),
       limit=st.one_of(st.none(), st.integers(0, 3000)))
def test_select_equals_brute_force(synthetic, seed, gate, limit):
    ckf = synthetic
    q = np.random.default_rng(seed).standard_normal(384).astype(np.float32)
    sel = ckf.select(q, gate, limit)
    emb = np.asarray(ckf.embeddings)
    sims = emb @ (q / np.linalg.norm(q))
    selectable = ckf.status <= FactStatus.STALE
    # Two float32 mat-vecs may round the last bit differently (BLAS blocking), so facts whose
    # similarity ties within 1e-5, or sits within 1e-5 of the gate, may legitimately swap.
    tol = 1e-5
    assert np.all(np.diff(sel.relevances) <= tol)
    np.testing.assert_allclose(sel.relevances, sims[sel.indices], atol=tol)
    sure_in = set(np.flatnonzero(selectable & (sims >= gate + tol)).tolist())
    maybe_in = set(np.flatnonzero(selectable & (sims >= gate - tol)).tolist())
    got = set(sel.indices.tolist())
    assert got <= maybe_in
    if limit is not None and limit < len(sure_in):
        # truncated: exactly `limit` facts, and every fact clearly above the cut-off is in
        assert len(got) == limit
        cut = np.sort(sims[list(sure_in)])[::-1][limit - 1] if limit else np.inf
        sure_in = {i for i in sure_in if sims[i] > cut + tol}
    assert sure_in <= got
    assert not got & ({5, 17, 1500} | set(range(700, 1400)))


def test_append_raw_rejects_wrong_vectors(synthetic):
    with pytest.raises(InvalidInputError, match=r"shape \(1, 384\)"):
        synthetic.append_raw(["one more synthetic fact"], np.ones((1, 383), np.float32))
    with pytest.raises(InvalidInputError, match="unit rows"):
        synthetic.append_raw(["one more synthetic fact"], np.ones((1, 384), np.float32))
    with pytest.raises(InvalidInputError, match="already in the CKF"):
        v = np.zeros((1, 384), np.float32)
        v[0, 0] = 1
        synthetic.append_raw(["synthetic fact 0-1"], v)
