"""Peak memory per phase of a step: bytes torch allocated on the GPU, or on CPU the process's resident set.

Nothing is reset: the process's high-water mark (Linux's VmHWM, what `time -v` and monitors report) and torch's
peak allocator statistics stay the whole run's. A phase's peak is instead
- the high-water mark, when the phase raised it (it then happened in the phase, exactly), else
- the most a sampler thread saw while the phase ran (every `interval_s`, and at its start and end): a spike
  shorter than the interval between samples can be missed, and the phase peak is then a lower bound.
"""

from __future__ import annotations

import contextlib
import os
import resource
import threading
from typing import Dict, Iterator

import torch

GIB = 2**30
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def current_bytes(device: torch.device) -> int:
    """What the phase holds now: torch's allocated bytes on a GPU, the process's resident set on CPU."""
    if device.type == "cuda":
        return int(torch.cuda.memory_allocated(device))
    with contextlib.suppress(OSError, ValueError, IndexError):
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * _PAGE
    return high_water_bytes(device)


def high_water_bytes(device: torch.device) -> int:
    """The run's peak so far, never reset here: torch's max allocated bytes on a GPU, VmHWM on Linux, else
    ru_maxrss."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    with contextlib.suppress(OSError, ValueError):
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024  # kB
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # kB on Linux


class _Sampler:
    """The most `current_bytes` read, every `interval_s` on a thread of its own, between start and stop."""

    def __init__(self, device: torch.device, interval_s: float):
        self.device, self.interval_s = device, interval_s
        self.most = current_bytes(device)
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="verl-memory-sampler", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._done.wait(self.interval_s):
            self.most = max(self.most, current_bytes(self.device))

    def stop(self) -> int:
        self._done.set()
        self._thread.join()
        return max(self.most, current_bytes(self.device))


class PhasePeaks:
    """`with peaks("update"): ...` records the phase's peak; `take()` returns memory/<phase>_peak_gib for each phase
    seen since the last take (the highest of its calls) and starts over."""

    def __init__(self, device: torch.device, interval_s: float = 0.005):
        self.device, self.interval_s = device, interval_s
        self.peaks: Dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        before = high_water_bytes(self.device)
        sampler = _Sampler(self.device, self.interval_s)
        try:
            yield
        finally:
            sampled = sampler.stop()
            after = high_water_bytes(self.device)
            peak = after if after > before else sampled  # (a new high happened in this phase: it is the peak)
            self.peaks[phase] = max(self.peaks.get(phase, 0.0), peak / GIB)

    def take(self) -> Dict[str, float]:
        out = {f"memory/{phase}_peak_gib": value for phase, value in self.peaks.items()}
        self.peaks = {}
        return out
