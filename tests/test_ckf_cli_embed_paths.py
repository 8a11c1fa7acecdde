"""Mixing the int8 and float32 embedding paths on one CKF, refused by the real command line.

`tests/test_embed_int8.py` checks the refusal in the library (`CKF.open` with the other path's
embedder raises). Here each side is a real `cdr` process: CKFs built by `cdr ingest` on each
path, then `cdr ingest` of a new document with the other path, chosen by `--embedder` or by
`CDR_EMBEDDER` in the environment, must exit 1 with a message naming both paths, and leave
the CKF exactly as it was: its rows, its embedding identity, its generation, its documents
and the bytes of its array files. `cdr ckf reembed --embedder` is the way to move a CKF from
one path to the other, and is checked here to stay one (it is no mixing: every row moves).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("onnxruntime", reason="the int8 path needs the `int8` extra")
pytest.importorskip("onnx", reason="the int8 path needs the `int8` extra")

from cdr.ckf import CKF
from cdr.ckf.schema import DB_NAME
from cdr.cluster.shardset import is_shard_set, read_manifest
from cdr.retrieval.embed import MINILM_INT8_MODEL_ID, MINILM_MODEL_ID
from tests.conftest import run_settings, write_docs

SRC = Path(__file__).resolve().parents[1] / "src"
DOCS = {
    "final.md": "# Cup final 1923\n\n## Attendance\n\nThe match drew a crowd far larger than "
                "the ground could hold. Police on horseback cleared the pitch before "
                "kick-off.\n\n## Result\n\nThe home side won by two goals to nil after a "
                "scoreless first half.\n",
    "games.md": "# Summer Games 1924\n\n## Ceremony\n\nThe opening ceremony was held in the "
                "main stadium in front of the crowd. Athletes from forty nations marched "
                "behind their flags.\n",
}
NEW_DOC = ("# Harbour bridge 1932\n\n## Opening\n\nA horseman cut the ribbon before the "
           "official could, and the crowd on the deck cheered the ferries below.\n")
PATHS = {"float32": MINILM_MODEL_ID, "int8": MINILM_INT8_MODEL_ID}
EMBEDDER = {"float32": "minilm", "int8": "minilm-int8"}


def cdr(*args: str, cwd: Path, env: dict[str, str] | None = None
        ) -> subprocess.CompletedProcess[str]:
    """`cdr ARGS` in a child process with a clean environment (no inherited `CDR_*` but the
    run's own settings, `tests.conftest.RUN_SETTINGS`)."""
    child = {k: v for k, v in os.environ.items() if not k.startswith("CDR_")} | run_settings()
    child["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SRC), child.get("PYTHONPATH")]))
    child.update(env or {})
    return subprocess.run([sys.executable, "-m", "cdr.cli", *args], cwd=cwd, env=child,
                          capture_output=True, text=True, timeout=600, check=False)


def state(ckf: Path) -> dict[str, Any]:
    """Everything a refused ingest must leave alone, the files' bytes first (read before the
    CKF is opened): the array files of a CKF, or of every shard and the manifest of a shard
    set; then each CKF's rows, generation and documents, and the embedding identity."""
    files = {str(p.relative_to(ckf)): hashlib.sha256(p.read_bytes()).hexdigest()
             for p in sorted(ckf.rglob("*")) if p.is_file() and not p.name.startswith(DB_NAME)
             and p.suffix != ".lock"}
    assert any(Path(name).name.startswith("embeddings.") for name in files), files
    if is_shard_set(ckf):
        shards, identity = read_manifest(ckf).paths, read_manifest(ckf).model_id
    else:
        shards, identity = [ckf], None
    out: dict[str, Any] = {"files": files, "shards": []}
    for path in shards:
        with CKF.open(path) as index:
            identity = identity or index.model_id
            out["shards"].append((index.n_rows, index.model_id, index.latest_generation(),
                                  sorted(Path(d["source"]).name for d in index.documents())))
    out["identity"] = identity
    out["rows"] = sum(rows for rows, *_ in out["shards"])
    out["documents"] = sorted(doc for *_, docs in out["shards"] for doc in docs)
    return out


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One CKF per path, each built by `cdr ingest` (with `--embedder` for int8)."""
    root = tmp_path_factory.mktemp("embed-paths")
    docs = write_docs(root / "docs", DOCS)
    out = {}
    for path, embedder in EMBEDDER.items():
        ckf = root / f"{path}.ckf"
        proc = cdr("ingest", str(docs), "--ckf", str(ckf), "--embedder", embedder, cwd=root)
        assert proc.returncode == 0, proc.stderr
        with CKF.open(ckf) as index:
            assert index.model_id.partition("#")[0] == PATHS[path] and index.n_rows >= 3
        out[path] = ckf
    # a float32 shard set (`--shards`: ingest's other branch), two CKFs under one manifest
    proc = cdr("ingest", str(docs), "--ckf", str(root / "set"), "--shards", "2", cwd=root)
    assert proc.returncode == 0, proc.stderr
    assert is_shard_set(root / "set")
    out["float32 shard set"] = root / "set"
    return out


@pytest.mark.parametrize("how", ["--embedder", "CDR_EMBEDDER"])
@pytest.mark.parametrize(("kind", "other"), [("float32", "int8"), ("int8", "float32"),
                                           ("float32 shard set", "int8")])
def test_ingest_with_the_other_path_is_refused_and_the_ckf_unchanged(
        built: dict[str, Path], tmp_path: Path, kind: str, other: str, how: str) -> None:
    ckf_path = kind.split()[0]
    ckf = shutil.copytree(built[kind], tmp_path / "kb.ckf")
    new = write_docs(tmp_path / "new", {"bridge.md": NEW_DOC})
    before = state(ckf)
    if how == "--embedder":
        proc = cdr("ingest", str(new), "--ckf", str(ckf), "--embedder", EMBEDDER[other],
                   cwd=tmp_path)
    else:
        proc = cdr("ingest", str(new), "--ckf", str(ckf), cwd=tmp_path,
                   env={"CDR_EMBEDDER": EMBEDDER[other]})
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    message = " ".join(proc.stderr.split())
    assert message.startswith("error: embedding path mismatch:"), message
    assert (f"made by the {ckf_path} path" in message
            and f"comes from its {other} path" in message), message
    assert "cdr ckf reembed --embedder" in message and "Traceback" not in message
    assert state(ckf) == before


def test_reembed_moves_every_row_to_the_other_path(built: dict[str, Path],
                                                   tmp_path: Path) -> None:
    """The sanctioned move: after it the CKF is wholly on the new path, and ingest with that
    path's embedder is accepted while the old one's is refused."""
    ckf = shutil.copytree(built["float32"], tmp_path / "kb.ckf")
    before = state(ckf)
    proc = cdr("ckf", "reembed", "--ckf", str(ckf), "--embedder", "minilm-int8", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    after = state(ckf)
    assert after["identity"] == built_identity(built["int8"]) != before["identity"]
    assert after["rows"] == before["rows"]
    new = write_docs(tmp_path / "new", {"bridge.md": NEW_DOC})
    refused = cdr("ingest", str(new), "--ckf", str(ckf), "--embedder", "minilm", cwd=tmp_path)
    assert refused.returncode == 1 and "path mismatch" in refused.stderr
    assert state(ckf) == after
    accepted = cdr("ingest", str(new), "--ckf", str(ckf), "--embedder", "minilm-int8",
                   cwd=tmp_path)
    assert accepted.returncode == 0, accepted.stderr
    assert state(ckf)["documents"] == sorted([*after["documents"], "bridge.md"])


def built_identity(ckf: Path) -> str:
    with CKF.open(ckf) as index:
        return str(index.model_id)
