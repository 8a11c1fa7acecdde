"""The gateway's `KnowledgeBase` protocol: both backends implement all of it, the shared part
(emptiness, warming, the writer thread, the watcher) is one class, and a document is deleted
through the protocol whichever backend holds it (the shard set's own run is in
tests/test_gateway_ray_writes.py, on a real Ray head)."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from cdr.errors import NotFoundError
from cdr.gateway.ckf_snapshots import LocalKnowledgeBase
from cdr.gateway.knowledge_base import KnowledgeBase, WatchedKnowledgeBase, is_empty
from cdr.gateway.shard_kb import ShardSetKnowledgeBase


def _members(cls: type) -> set[str]:
    names = set(vars(cls)) | set(vars(cls).get("__annotations__", {}))
    return {n for n in names if not n.startswith("_")}


def test_both_backends_implement_the_whole_protocol_on_one_shared_base():
    needed = _members(KnowledgeBase)
    assert needed == {"path", "current", "latest", "current_is_empty", "warm", "reload",
                      "start_watching", "check_writable", "route", "submit",
                      "delete_document", "close"}
    for cls in (LocalKnowledgeBase, ShardSetKnowledgeBase):
        assert issubclass(cls, WatchedKnowledgeBase)
        missing = {n for n in needed - {"path"} if not callable(getattr(cls, n, None))}
        assert not missing, (cls.__name__, missing)
        # The shared logic is written once: neither backend writes its own.
        assert not {"current_is_empty", "warm", "start_watching", "submit"} & set(vars(cls))


@pytest.fixture
def ckf_copy(tiny_ckf_path: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(tiny_ckf_path, tmp_path / "ckf"))


def test_a_local_kb_reads_deletes_and_follows_its_writes(ckf_copy: Path):
    kb = LocalKnowledgeBase(ckf_copy)
    try:
        assert isinstance(kb, KnowledgeBase)
        snap = kb.current()
        assert snap is not None and not kb.current_is_empty() and not is_empty(snap)
        docs = snap.documents()
        with pytest.raises(NotFoundError, match="no document"):
            kb.delete_document("doesnotexist")
        for doc in docs:
            found, removed = kb.delete_document(doc["doc_id"]).result(timeout=60)
            assert found == doc["doc_id"] and removed == doc["n_facts"] > 0
        # The write reloaded the snapshot before its future finished: readers see it.
        assert kb.current() is not snap and kb.current_is_empty()
        assert kb.current().documents() == []  # type: ignore[union-attr]
    finally:
        kb.close()


def test_a_kb_without_a_ckf_is_empty_and_says_so_on_delete(tmp_path: Path):
    kb = LocalKnowledgeBase(tmp_path / "none-yet")
    try:
        assert kb.current() is None and kb.current_is_empty()
        with pytest.raises(NotFoundError, match="there is no CKF yet"):
            kb.delete_document("x")
    finally:
        kb.close()


def test_the_watcher_follows_a_write_made_elsewhere(ckf_copy: Path):
    from cdr.ckf import CKF

    kb = LocalKnowledgeBase(ckf_copy, watch_seconds=0.05)
    try:
        kb.start_watching()
        before = kb.current()
        assert before is not None
        doc = before.documents()[0]
        with CKF.open(ckf_copy) as other:  # another process's writer, as far as kb knows
            other.delete_document(doc["doc_id"])
        deadline = time.monotonic() + 30
        while kb.current() is before and time.monotonic() < deadline:
            time.sleep(0.05)
        after = kb.current()
        assert after is not before and after is not None
        assert doc["doc_id"] not in {d["doc_id"] for d in after.documents()}
    finally:
        kb.close()
