"""What the benchmark reports say about the machine they ran on."""

from __future__ import annotations

from pathlib import Path


def cpu_name(default: str = "unknown") -> str:
    """The CPU's model name from /proc/cpuinfo (Linux), else `default`."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return default
