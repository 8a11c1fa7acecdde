"""`cdr ckf reembed` killed for real (issue 26): a SIGKILL of the process doing it leaves the
CKF serving its old vectors under its old identity, and the next run resumes from the staged
chunks instead of starting over, ending with the vectors a run never killed gives."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np

from cdr.ckf import CKF, DocumentInput, ingest_texts
from cdr.ckf.reembed import STAGING, reembed

# Reembeds two rows per chunk and, after each chunk is staged, says how many rows are done
# and waits, so the test can kill it between chunks at a point it knows.
CHILD = """
import sys, time
from cdr.ckf import CKF
from cdr.ckf.reembed import reembed

def tell(done, total):
    print(done, total, flush=True)
    time.sleep(0.5)

with CKF.open(sys.argv[1]) as ckf:
    reembed(ckf, "title-section", chunk_rows=2, progress=tell)
print("finished", flush=True)
"""

DOCS = [DocumentInput(f"page{i}.md", f"# Page {i}\n\n" + "\n\n".join(
    f"## Part {j}\n\nPart {j} of page {i} says something about topic {j * i + 7} at some "
    f"length here. It goes on to a second sentence about the same topic, number {j + i}."
    for j in range(4)) + "\n") for i in range(4)]


def test_a_killed_reembed_resumes_and_readers_keep_the_old_vectors(tmp_path: Path) -> None:
    path = tmp_path / "kb.ckf"
    with CKF.create(path, recipe="plain") as ckf:
        ingest_texts(ckf, DOCS)
        n = ckf.n_rows
        old = ckf.vectors(np.arange(n)).copy()
        ident = ckf.model_id
    assert n >= 8
    shutil.copytree(path, tmp_path / "never-killed.ckf")
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(path)], stdout=subprocess.PIPE,
                             text=True, env=os.environ.copy())
    try:
        assert child.stdout is not None
        done = 0
        for line in child.stdout:  # wait for two staged chunks, then kill mid-run
            done = int(line.split()[0])
            if done >= 4:
                break
        assert 4 <= done < n, f"the child got to {done} of {n} rows"
        child.send_signal(signal.SIGKILL)
        assert child.wait(60) == -signal.SIGKILL
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert (path / STAGING / "progress.json").exists()
    with CKF.open(path) as ckf:  # the old vectors and identity, untouched
        assert ckf.model_id == ident
        np.testing.assert_array_equal(ckf.vectors(np.arange(n)), old)
        rep = reembed(ckf, "title-section", chunk_rows=2)
        assert rep.resumed_from >= 4 and rep.embedded == n - rep.resumed_from
        got = ckf.vectors(np.arange(n)).copy()
        assert ckf.model_id.endswith("#title-section") and ckf.check() == []
    assert not (path / STAGING).exists()
    with CKF.open(tmp_path / "never-killed.ckf") as ckf:
        reembed(ckf, "title-section", chunk_rows=2)
        np.testing.assert_allclose(got, ckf.vectors(np.arange(n)), atol=2e-6)
