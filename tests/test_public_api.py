"""The package's public names resolve, and the README's library example runs as written."""

from __future__ import annotations

import re
from pathlib import Path

import cdr


def test_all_names_resolve():
    for name in cdr.__all__:
        assert getattr(cdr, name) is not None, name


def test_readme_library_example_runs(types_ckf_path: Path):
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    block = re.search(r"As a library:\n\n```python\n(.*?)```", readme, re.S).group(1)
    code = block.replace('"my.ckf"', repr(str(types_ckf_path)))
    code = code.replace("print(", "seen.append((")  # collect instead of printing
    code = code.replace(", event.status)", ", event.status))")
    seen: list = []
    exec(compile(code, "README.md", "exec"), {"seen": seen})
    assert seen and seen[-1][2] in cdr.EXIT_REASONS
