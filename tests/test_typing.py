"""The package and the scripts under examples/ are `mypy --strict` clean (with pyproject's
[tool.mypy]: the optional extras the dev tools never install, and untyped dependencies, read as
Any), so a type error in `src/cdr` fails here rather than in a user's type checker, which reads
it through `py.typed`, and the examples show code a user's checker accepts."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
# The integrations and telemetry subclass these packages' types: without them installed, mypy
# would read those bases as Any and --strict refuses to subclass Any.
TYPED_EXTRAS = ("langchain_core", "llama_index.core", "opentelemetry.trace")
# The third-party packages an example imports beyond the core ones: its extra. Without them
# (a bare `make test`) the example is not type-checked, as its run test is skipped.
EXAMPLE_EXTRAS = {"langchain_loop.py": ("langchain_openai",),
                  "llamaindex_rerank.py": ("llama_index.core",)}
ERROR = re.compile(r"^(?P<path>[^:\n]+\.py):\d+: error:", re.M)


def _installed(modules: tuple[str, ...]) -> bool:
    return all(importlib.util.find_spec(m.split(".")[0]) is not None
               and importlib.util.find_spec(m) is not None for m in modules)


def _missing_typed_extras() -> list[str]:
    return [m for m in TYPED_EXTRAS if not _installed((m,))]


class MypyRun:
    """One `mypy --strict` run: which files it was given and what it printed."""

    def __init__(self, package: bool, examples: list[str],
                 proc: subprocess.CompletedProcess[str]) -> None:
        self.package, self.examples, self.proc = package, examples, proc
        self.output = proc.stdout + proc.stderr
        self.errors = [m["path"].replace("\\", "/") for m in ERROR.finditer(self.output)]


@pytest.fixture(scope="module")
def mypy_run() -> MypyRun:
    """The package and the examples checked by one mypy process, with one cache in the clone.

    The examples import the package, so checking them alone analyses most of it and the same
    third-party stubs (numpy, pydantic, FastAPI, OpenAI's 2,000 modules) again: cold, two
    processes cost about 64 s of CPU against 33 s for one over both (load 4), and a clean clone
    (a first `make test`) always runs cold. The package is left out when the extras it
    subclasses are missing (its test then skips, as before)."""
    pytest.importorskip("mypy", reason="mypy is not installed (the dev extra has it)")
    package = not _missing_typed_extras()
    examples = [str(p.relative_to(ROOT)) for p in sorted(EXAMPLES.glob("*.py"))
                if _installed(EXAMPLE_EXTRAS.get(p.name, ()))]
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-error-summary",
         "--cache-dir", str(ROOT / ".mypy_cache"), *(["src/cdr"] if package else []),
         *examples],
        capture_output=True, text=True, timeout=900, cwd=ROOT, check=False)
    return MypyRun(package, examples, proc)


@pytest.mark.integration
def test_the_package_is_mypy_strict_clean(mypy_run: MypyRun) -> None:
    missing = _missing_typed_extras()
    if missing:
        pytest.skip(f"needs the langchain, llamaindex and otel extras ({', '.join(missing)})")
    assert mypy_run.package
    assert not [p for p in mypy_run.errors if p.startswith("src/")], mypy_run.output
    assert mypy_run.proc.returncode == 0 or mypy_run.errors, mypy_run.output


@pytest.mark.integration
def test_examples_are_mypy_strict_clean(mypy_run: MypyRun) -> None:
    assert any(f.endswith("library_loop.py") for f in mypy_run.examples)
    # With the package in the same run, its errors are the test above's; without it, an error
    # in a module of the package an example imports is this test's, as when checked alone.
    mine = [p for p in mypy_run.errors if not (mypy_run.package and p.startswith("src/"))]
    assert not mine, mypy_run.output
    assert mypy_run.proc.returncode == 0 or mypy_run.errors, mypy_run.output
