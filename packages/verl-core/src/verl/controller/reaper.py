"""Ends a local Ray cluster's processes once the driver that started it is gone, killed or not.

Run as a script, never imported by the run (it must start in milliseconds and load neither torch nor Ray):

    python reaper.py <driver pid> <tag>

Ray's head processes notice a killed driver, but its agents then retry the dead GCS for up to a minute and
actors may linger. Every process of the cluster inherits VERL_RUN=<tag> from the driver's environment;
once the driver has exited (this process is re-parented) or asks for it (SIGTERM at a normal shutdown),
each process still carrying the tag is killed. Linux only (/proc); elsewhere it exits at once.
"""

from __future__ import annotations

import os
import signal
import sys
import time

TAG_VAR = "VERL_RUN"
POLL_S = 0.2


def tagged(tag: str) -> list[int]:
    """Pids of the processes whose environment holds VERL_RUN=<tag> (this one excluded)."""
    entry = f"\0{TAG_VAR}={tag}\0".encode()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                if entry in b"\0" + f.read():
                    found.append(int(name))
        except OSError:  # gone meanwhile, or another user's
            continue
    return found


def reap(tag: str, timeout_s: float = 10.0) -> int:
    """SIGKILL the tagged processes until none is left (a dying raylet may still start one); how many were hit."""
    hit: set[int] = set()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        pids = tagged(tag)
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                hit.add(pid)
            except ProcessLookupError:
                pass
        time.sleep(POLL_S)
    return len(hit)


def main(driver: int, tag: str) -> None:
    asked = []
    signal.signal(signal.SIGTERM, lambda *_: asked.append(True))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C meant for the run must not end the cleanup
    while not asked and os.getppid() == driver:
        time.sleep(POLL_S)
    reap(tag)


if __name__ == "__main__":
    if sys.platform.startswith("linux") and len(sys.argv) == 3:
        main(int(sys.argv[1]), sys.argv[2])
