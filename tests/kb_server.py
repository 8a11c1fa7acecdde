"""A `cdr serve --kb NAME=PATH ...` process for tests, and a second small CKF (`hr_ckf`:
Python's `class` and `import` reference topics) to serve beside the gateway test CKF.

A test module pulls the fixture in with `pytest_plugins = ["tests.kb_server"]`.

PYTEST_DONT_REWRITE
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import build_topics_ckf, built_once
from tests.gateway_server import GatewayServer, child_env, free_port


@pytest.fixture(scope="session")
def hr_ckf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return built_once(tmp_path_factory, "hr-ckf",
                      lambda root: build_topics_ckf(root, ("class", "import")))


class KbServer(GatewayServer):
    """`cdr serve --kb NAME=PATH ...` (the CLI, so the option is what is tested)."""

    def __init__(self, env: dict[str, str], args: list[str], workdir: Path) -> None:
        super().__init__(env, via_cli=True, workdir=workdir)
        self.args = args

    def start(self, timeout: float = 90.0) -> GatewayServer:
        self.port = free_port()
        cmd = [sys.executable, "-m", "cdr.cli", "serve", "--host", "127.0.0.1", "--port",
               str(self.port), *self.args]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(cmd, env=child_env(self.env), cwd=self.workdir,
                                         stdout=log, stderr=subprocess.STDOUT)
        self._wait_ready(timeout)
        return self
