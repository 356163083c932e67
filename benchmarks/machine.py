"""The machine a benchmark ran on, for its results file."""

from __future__ import annotations

import platform
from pathlib import Path


def cpu_name() -> str:
    """The CPU's model name (from /proc/cpuinfo where there is one)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_line() -> str:
    """CPU, cores, Python and torch: the first facts of every results file."""
    import os

    import torch

    return f"{cpu_name()}, {os.cpu_count()} cores; Python {platform.python_version()}, torch {torch.__version__}"


def write_report(out: str, lines: list[str]) -> None:
    """Write a markdown results file (its folder made if needed) and print it."""
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
