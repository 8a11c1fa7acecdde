"""The package is `mypy --strict` clean (with pyproject's [tool.mypy]: the optional extras the
dev tools never install, and untyped dependencies, read as Any), so a type error in `src/cdr`
fails here rather than in a user's type checker, which reads it through `py.typed`."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# The integrations and telemetry subclass these packages' types: without them installed, mypy
# would read those bases as Any and --strict refuses to subclass Any.
TYPED_EXTRAS = ("langchain_core", "llama_index.core", "opentelemetry.trace")


@pytest.mark.integration
def test_the_package_is_mypy_strict_clean() -> None:
    pytest.importorskip("mypy", reason="mypy is not installed (the dev extra has it)")
    missing = [m for m in TYPED_EXTRAS if importlib.util.find_spec(m.split(".")[0]) is None
               or importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"needs the langchain, llamaindex and otel extras ({', '.join(missing)})")
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-error-summary",
         "--cache-dir", str(ROOT / ".mypy_cache" / "src"), "src/cdr"],
        capture_output=True, text=True, timeout=900, cwd=ROOT, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
