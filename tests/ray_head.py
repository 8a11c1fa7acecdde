"""Joining the Ray head that `.ci/run` starts, or skipping with the reason.

Gateway tests on a shard set run `cdr serve` in its own process, which must join an existing
cluster (it cannot share the test process's local one), so they need `CDR_RAY_ADDRESS`.
"""

from __future__ import annotations

import os
from types import ModuleType

import pytest

from cdr.cluster.ray_index import export_ray_env


def require_ray_head() -> ModuleType:
    """The `ray` module, or a module-level skip naming what is missing. Call at import time."""
    address = os.environ.get("CDR_RAY_ADDRESS")
    # Before `import ray`: Ray reads its RAY_* settings once, on import. Imported without
    # RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 it dials this machine's routable address instead of
    # the loopback head .ci/run starts, and `connect` refuses (it used to retry for minutes).
    export_ray_env(address)
    ray = pytest.importorskip(
        "ray",
        reason="Ray is not installed: pip install 'cdr-retrieval[ray]' (.ci/run installs it)")
    if not address:
        pytest.skip("no Ray head to join: set CDR_RAY_ADDRESS=127.0.0.1:PORT (.ci/run starts "
                    "one); the gateway runs in its own process and must join a cluster",
                    allow_module_level=True)
    return ray
