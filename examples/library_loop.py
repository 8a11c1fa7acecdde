"""The library loop: a CKF from your documents, then a guide written over several windows.

    python examples/library_loop.py [WORKDIR] [DOCS_DIR]

Builds WORKDIR/my.ckf (default WORKDIR: the current directory) from DOCS_DIR (default: a few
topics of Python's language reference) unless it exists, then writes with the offline
extractive writer: no network, no API key. Each window prints its number, the CRP coverage
score and the session status.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from _docs import ensure_ckf
from cdr import CKF, GenerationConfig, Generator, get_writer


def main(argv: list[str]) -> int:
    workdir = Path(argv[0] if argv else ".").resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    ensure_ckf(workdir / "my.ckf", Path(argv[1]).resolve() if len(argv) > 1 else None)
    os.chdir(workdir)
    # [readme: library]
    gen = Generator(CKF.open("my.ckf"), get_writer("extractive"), GenerationConfig(max_windows=4))
    task = "Write a guide to Python's built-in types"
    for event in gen.run(task, outline="Truth value testing\nSequence types\nMapping types"):
        print(event.number, event.headers["CRP-Context-Coverage-Score"], event.status)
    # [/readme]
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
