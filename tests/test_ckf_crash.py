"""Crash safety: an ingest killed with SIGKILL leaves the previous consistent state, and the
next ingest resumes from it (finished documents cost nothing again)."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

import cdr
from cdr.ckf import CKF, chunk_blocks, ingest
from cdr.ckf.arrays import ArrayFiles
from cdr.ckf.sources import parse_bytes
from cdr.cli.samples import pydoc_topics_dir

TOPICS = ["assert", "pass", "del", "return", "yield", "global", "nonlocal", "while", "if"]
COMMIT_EVERY = 5

# Runs an ingest in a child process; in the "self" modes it SIGKILLs itself at an exact point
# of the N-th commit: before the arrays are appended, or after they are appended and fsynced
# (and the row state written) but before SQLite commits.
CHILD = textwrap.dedent("""
    import os, signal, sys
    from cdr.ckf import CKF, ingest
    from cdr.ckf.txn import WriteTxn

    mode, ckf_path, corpus, kill_at = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    original = WriteTxn.finish
    calls = [0]

    def finish(self):
        calls[0] += 1
        if calls[0] == kill_at and mode == "before-arrays":
            os.kill(os.getpid(), signal.SIGKILL)
        original(self)
        if calls[0] == kill_at and mode == "after-arrays":
            os.kill(os.getpid(), signal.SIGKILL)

    WriteTxn.finish = finish
    ckf = CKF.open_or_create(ckf_path)
    ingest(ckf, [corpus], commit_every=int(sys.argv[5]))
    print("finished")
""")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return pydoc_topics_dir(tmp_path_factory.mktemp("crash") / "topics", topics=TOPICS)


def _expected_ids(corpus: Path) -> set[str]:
    return {d.id for f in corpus.iterdir()
            for d in chunk_blocks(parse_bytes(f.read_bytes(), "txt").blocks)}


def _child(mode: str, ckf: Path, corpus: Path, kill_at: int = 0) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(Path(cdr.__file__).parents[1]))
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, mode, str(ckf), str(corpus), str(kill_at),
         str(COMMIT_EVERY)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _resume_and_verify(path: Path, corpus: Path) -> None:
    """Open + integrity check on the crashed state, then a re-run that completes."""
    with CKF.open(path) as ckf:
        assert ckf.check() == []
        rows_before = ckf.n_rows
        docs_before = len(ckf.documents())
        rep = ingest(ckf, [corpus], commit_every=COMMIT_EVERY)
        assert rep.skipped == []
        assert rep.documents_unchanged == docs_before  # committed work is not redone
        assert rep.embedded == ckf.n_rows - rows_before  # only what was never committed
        assert ckf.check() == []
        ids = {f.id for f in ckf.facts(range(ckf.n_rows))}
        assert ids == _expected_ids(corpus)
        assert ckf.active.all() and len(ckf.documents()) == len(TOPICS)


@pytest.mark.parametrize("mode", ["before-arrays", "after-arrays"])
def test_sigkill_inside_a_commit_keeps_previous_state(corpus, tmp_path, mode):
    path = tmp_path / "k.ckf"
    proc = _child(mode, path, corpus, kill_at=2)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == -signal.SIGKILL, err.decode()[-2000:]
    with CKF.open(path) as ckf:
        # exactly the first batch is committed (commit 1 = first batch of documents)
        assert ckf.generation == 1
        committed_rows = ckf.n_rows
        assert 0 < committed_rows < len(_expected_ids(corpus))
        files = ArrayFiles(ckf.path, 0, ckf.dim, ckf.dtype)
        size = files.embeddings.stat().st_size
        committed_size = files.committed_sizes(committed_rows, len(ckf.ngram_hashes))[0]
        if mode == "after-arrays":
            assert size > committed_size  # the dead writer's rows are on disk, but ignored
        else:
            assert size == committed_size
        assert np.allclose(np.linalg.norm(ckf.embeddings, axis=1), 1.0, atol=1e-5)
    _resume_and_verify(path, corpus)


def test_sigkill_from_outside_mid_ingest(corpus, tmp_path):
    path = tmp_path / "x.ckf"
    proc = _child("run", path, corpus)
    db = path / "ckf.sqlite"
    deadline = time.monotonic() + 240
    generation = 0
    while time.monotonic() < deadline and proc.poll() is None:
        if db.exists():
            try:
                con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1)
                (generation,) = con.execute(
                    "SELECT CAST(value AS INTEGER) FROM meta WHERE key='generation'").fetchone()
                con.close()
            except sqlite3.Error:
                generation = 0
            if generation >= 2:
                break
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    assert generation >= 2  # it was killed after some commits, whatever it was doing then
    _resume_and_verify(path, corpus)
