"""Where the benchmarks live, and `cdr` importable from a checkout without `pip install -e .`.

Imported first by every benchmark script (bench/ is on sys.path when a script runs), so the
path set-up is written once."""

from __future__ import annotations

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
try:
    import cdr  # noqa: F401
except ImportError:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, str(ROOT / "src"))
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))
