"""Peak memory per phase of a step: bytes torch allocated on the GPU, or on CPU the process's resident set.

On Linux the CPU peak is the kernel's high-water mark (VmHWM), reset at each phase's start through
/proc/self/clear_refs; elsewhere it is the process's peak since it started (ru_maxrss), so it only grows.
"""

from __future__ import annotations

import contextlib
import resource
from typing import Dict, Iterator

import torch

GIB = 2**30


def reset_peak(device: torch.device) -> None:
    """Start a new peak: the GPU's allocator statistics, or the process's resident high-water mark."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return
    with contextlib.suppress(OSError):
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current resident set


def peak_gib(device: torch.device) -> float:
    """The peak since the last reset_peak: torch's allocated bytes on a GPU, the resident set on CPU (GiB)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / GIB
    with contextlib.suppress(OSError, ValueError):
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024 / GIB  # kB
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GIB  # kB on Linux


class PhasePeaks:
    """`with peaks("update"): ...` records the phase's peak; `take()` returns memory/<phase>_peak_gib for each phase
    seen since the last take (the highest of its calls) and starts over."""

    def __init__(self, device: torch.device):
        self.device = device
        self.peaks: Dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        reset_peak(self.device)
        try:
            yield
        finally:
            self.peaks[phase] = max(self.peaks.get(phase, 0.0), peak_gib(self.device))

    def take(self) -> Dict[str, float]:
        out = {f"memory/{phase}_peak_gib": value for phase, value in self.peaks.items()}
        self.peaks = {}
        return out
