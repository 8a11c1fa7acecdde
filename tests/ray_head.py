"""Joining the Ray head that `.ci/run` starts, or skipping with the reason.

Gateway tests on a shard set run `cdr serve` in its own process, which must join an existing
cluster (it cannot share the test process's local one), so they need `CDR_RAY_ADDRESS`.
"""

from __future__ import annotations

import os
from types import ModuleType

import pytest


def require_ray_head() -> ModuleType:
    """The `ray` module, or a module-level skip naming what is missing. Call at import time."""
    ray = pytest.importorskip(
        "ray",
        reason="Ray is not installed: pip install 'cdr-retrieval[ray]' (.ci/run installs it)")
    if not os.environ.get("CDR_RAY_ADDRESS"):
        pytest.skip("no Ray head to join: set CDR_RAY_ADDRESS=127.0.0.1:PORT (.ci/run starts "
                    "one); the gateway runs in its own process and must join a cluster",
                    allow_module_level=True)
    os.environ.setdefault("RAY_AUTH_MODE", "token")
    return ray
