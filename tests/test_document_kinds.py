"""The registry of document kinds (`cdr.ckf.kinds`): every registered kind goes through ingest
and back, a kind whose extra is missing is refused naming the extra (ingest and upload alike),
and a suffix the registry lacks behaves as it always did. The upload refusal is checked against a
real server without pypdf in `tests/test_gateway_upload_missing_extra.py`."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from cdr.ckf import CKF, DocumentInput, ingest, ingest_documents
from cdr.ckf import kinds as kinds_module
from cdr.ckf.kinds import REGISTRY, available_suffixes, declared_settings, kind_for_suffix
from cdr.gateway.errors import ApiError
from cdr.gateway.routes_ckf import _check_upload
from tests.test_ckf_parse import _pdf


def _paragraph(kind: str) -> str:
    return (f"The {kind} sample explains that vacuum reclaims storage occupied by dead tuples, "
            "that it should run regularly on busy tables, and that autovacuum automates the "
            "vacuum and analyze commands so that an administrator rarely has to run them by "
            f"hand on the {kind} test database.")


def _sample(kind: str) -> tuple[str, bytes]:
    """A small document of each registered kind, declaring its source type where it can."""
    para = _paragraph(kind)
    if kind == "md":
        return "guide.md", f"---\nsource_type: official\n---\n# Vacuum\n\n{para}\n".encode()
    if kind == "txt":
        return "notes.txt", f"Vacuum\n======\n\n{para}\n".encode()
    if kind == "html":
        return "page.html", (
            '<html><head><meta name="cdr-source-type" content="official"><title>Vacuum</title>'
            f"</head><body><main><h1>Vacuum</h1><p>{para}</p></main></body></html>").encode()
    if kind == "pdf":
        words = para.split()
        lines = [" ".join(words[i:i + 10]) for i in range(0, len(words), 10)]
        return "manual.pdf", _pdf([lines], [("Vacuum", 0)])
    raise AssertionError(f"no sample for the registered kind {kind!r}: add one")


@pytest.fixture(scope="module")
def ckf(tmp_path_factory: pytest.TempPathFactory) -> CKF:
    return CKF.create(tmp_path_factory.mktemp("kinds") / "kb.ckf")


@pytest.mark.parametrize("kind", sorted(REGISTRY))
def test_each_registered_kind_round_trips_through_ingest(ckf: CKF, kind: str) -> None:
    if not REGISTRY[kind].available:
        pytest.skip(REGISTRY[kind].missing())
    name, data = _sample(kind)
    assert kind_for_suffix(Path(name).suffix) is REGISTRY[kind]
    report = ingest_documents(ckf, [DocumentInput(name, data)])  # kind from the suffix
    assert report.skipped == [] and report.documents_new == 1 and report.facts_added >= 1
    [doc] = [d for d in ckf.documents() if d["source"] == name]
    assert doc["kind"] == kind
    assert doc["source_type"] == ("official" if REGISTRY[kind].declares else "user")
    rows = np.flatnonzero(ckf.active)
    text = " ".join(f.content for f in ckf.facts(rows) if f.source == name)
    assert " ".join(_paragraph(kind).split()) in " ".join(text.split())
    # Unchanged bytes are recognised as such: nothing re-parsed, nothing added.
    again = ingest_documents(ckf, [DocumentInput(name, data)])
    assert (again.documents_unchanged, again.facts_added) == (1, 0)


def test_declared_settings_come_from_the_kinds_that_declare() -> None:
    assert declared_settings("md", "---\nimportance: 0.9\nsource_type: official\n---\n") == {
        "importance": "0.9", "source_type": "official"}
    assert declared_settings("html", '<meta name="cdr-importance" content="0.3">') == {
        "importance": "0.3"}
    assert declared_settings("txt", "source_type: official") == {}
    assert declared_settings("nope", "anything") == {}


@pytest.fixture
def pdf_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    """PDF registered but its module missing: what an installation without the `pdf` extra
    sees."""
    missing = dataclasses.replace(REGISTRY["pdf"], module="cdr_test_no_such_module")
    monkeypatch.setitem(kinds_module.REGISTRY, "pdf", missing)


EXTRA = "pip install 'cdr-retrieval[pdf]'"


def test_an_unavailable_kind_is_refused_naming_its_extra(tmp_path: Path,
                                                         pdf_unavailable: None) -> None:
    data = b"%PDF-1.4\nwhatever follows\n"
    with CKF.create(tmp_path / "kb.ckf") as ckf:
        report = ingest_documents(ckf, [DocumentInput("manual.pdf", data)])
    [(source, reason)] = report.skipped
    assert source == "manual.pdf"
    assert reason == f"PDF support needs cdr_test_no_such_module: {EXTRA}"
    with pytest.raises(ApiError) as info:
        _check_upload("manual.pdf", data)
    assert info.value.status == 415 and EXTRA in str(info.value)
    assert ".pdf" not in available_suffixes() and ".md" in available_suffixes()


def test_unknown_suffixes_behave_as_before(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "data.xyz").write_text(_paragraph("xyz"), encoding="utf-8")
    (docs / "guide.md").write_text(f"# Vacuum\n\n{_paragraph('md')}\n", encoding="utf-8")
    with CKF.create(tmp_path / "kb.ckf") as ckf:
        report = ingest(ckf, [docs])  # a folder: files of unknown suffixes are not picked up
        assert (report.documents, report.skipped) == (1, [])
        assert [Path(d["source"]).name for d in ckf.documents()] == ["guide.md"]
        # given as content without a kind, an unknown suffix is read as plain text
        report = ingest_documents(ckf, [DocumentInput("notes.xyz", _paragraph("xyz"))])
        assert report.skipped == [] and report.documents_new == 1
        assert {d["source"]: d["kind"] for d in ckf.documents()}["notes.xyz"] == "txt"
    with pytest.raises(ApiError) as info:  # and an upload of one is refused, listing the rest
        _check_upload("data.xyz", b"text")
    assert info.value.status == 415
    assert "unsupported file type '.xyz'; supported: " in str(info.value)
    assert ".md" in str(info.value)
