"""How long this process has been running: start-up (imports, Ray, workers) is part of a run's cost."""

from __future__ import annotations

import os
import time

_IMPORTED = time.monotonic()  # the fallback where /proc is not there: this module's first import


def seconds_since_start() -> float:
    """Seconds since this process started (Linux: its start time in /proc; elsewhere since this module's import)."""
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22: start time, clock ticks after boot
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return uptime - ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return time.monotonic() - _IMPORTED
