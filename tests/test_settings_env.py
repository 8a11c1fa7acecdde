"""One module reads the environment: `cdr.settings`. Everything else asks it, at call time.

Why one reader: every `CDR_*` variable is then listed, typed and documented in one table
(`docs/reference/settings.md` is generated from it), and a variable nobody listed is refused
at its first read instead of being silently honoured by one module."""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

import cdr
from cdr import settings

SRC = Path(cdr.__file__).parent
ENV_FUNCTIONS = {"environ", "environb", "getenv", "getenvb", "putenv", "unsetenv"}


def _environment_uses(path: Path, root: Path = SRC.parent) -> list[str]:
    """`os.environ` / `os.getenv` / ... and `from os import environ`-style imports in a file,
    in source order."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if (isinstance(node, ast.Attribute) and node.attr in ENV_FUNCTIONS
                and isinstance(node.value, ast.Name) and node.value.id == "os"):
            found.append((node.lineno, f"{path.relative_to(root)}:{node.lineno} os.{node.attr}"))
        elif isinstance(node, ast.ImportFrom) and node.module == "os":
            names = [a.name for a in node.names if a.name in ENV_FUNCTIONS]
            if names:
                found.append((node.lineno, f"{path.relative_to(root)}:{node.lineno} from os "
                                           f"import {', '.join(names)}"))
    return [use for _, use in sorted(found)]


def test_only_cdr_settings_reads_or_writes_the_environment() -> None:
    found = [use for p in sorted(SRC.rglob("*.py")) if p != SRC / "settings.py"
             for use in _environment_uses(p)]
    assert not found, found


def test_the_scan_finds_each_form_it_forbids(tmp_path: Path) -> None:
    """The check above must be able to fail."""
    sample = SRC / "settings.py"
    assert any("os.environ" in use for use in _environment_uses(sample))
    probe = tmp_path / "probe.py"
    probe.write_text("import os\nfrom os import getenv\n"
                     "x = os.getenv('A')\nos.environ['B'] = '1'\n")
    uses = [u.split(" ", 1)[1] for u in _environment_uses(probe, tmp_path)]
    assert uses == ["from os import getenv", "os.getenv", "os.environ"]


def test_env_reads_at_call_time_not_at_import(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CDR_LOCAL_THREADS", "3")
    assert settings.env("CDR_LOCAL_THREADS") == "3"
    monkeypatch.setenv("CDR_LOCAL_THREADS", "5")
    assert settings.env("CDR_LOCAL_THREADS") == "5"
    monkeypatch.delenv("CDR_LOCAL_THREADS")
    assert settings.env("CDR_LOCAL_THREADS") is None
    assert settings.env("CDR_LOCAL_THREADS", "7") == "7"


def test_an_unlisted_cdr_variable_is_refused_by_name() -> None:
    bogus = "CDR_" + "NO_SUCH_SETTING"  # spelled apart: the settings-table test greps for names
    with pytest.raises(KeyError, match=f"{bogus} is not a documented setting"):
        settings.env(bogus)
    with pytest.raises(KeyError, match=bogus):
        settings.export({bogus: "1"})
    assert bogus not in os.environ


def test_other_conventions_pass_through(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", "/somewhere")
    assert settings.env("XDG_CACHE_HOME") == "/somewhere"


def test_export_sets_for_what_starts_next_and_can_keep_the_users_value(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CDR_READ_TIMEOUT_SECONDS", "30")  # restored after the test
    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "1")
    settings.export({"CDR_READ_TIMEOUT_SECONDS": "15", "RAY_USAGE_STATS_ENABLED": "0"},
                    overwrite=False)
    assert settings.env("CDR_READ_TIMEOUT_SECONDS") == "30"
    assert settings.environment()["RAY_USAGE_STATS_ENABLED"] == "1"
    settings.export({"CDR_READ_TIMEOUT_SECONDS": "15"})
    assert settings.env("CDR_READ_TIMEOUT_SECONDS") == "15"


def test_environment_is_a_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CDR_LOCAL_N_CTX", "4096")
    copy = settings.environment()
    copy["CDR_LOCAL_N_CTX"] = "1"
    assert settings.env("CDR_LOCAL_N_CTX") == "4096"


def test_cache_dir_follows_cdr_cache_dir_then_xdg_then_home(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CDR_CACHE_DIR", str(tmp_path / "c"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert settings.cache_dir() == tmp_path / "c"
    monkeypatch.delenv("CDR_CACHE_DIR")
    assert settings.cache_dir() == tmp_path / "x" / "cdr"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert settings.cache_dir() == tmp_path / "home" / ".cache" / "cdr"
    # The demo's samples and the model installer share it.
    from cdr.cli import samples
    from cdr.retrieval import models
    assert samples.cache_dir() == settings.cache_dir()
    assert models.reference_llm_path().parent == settings.cache_dir() / "llm"
