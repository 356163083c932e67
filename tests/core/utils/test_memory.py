"""Peak memory per phase: on CPU the process's resident set, read without resetting the process's high-water mark
(what `time -v` and monitors report must stay the run's)."""

from __future__ import annotations

import sys
import time

import pytest
import torch

from verl.utils.memory import GIB, PhasePeaks, current_bytes, high_water_bytes

CPU = torch.device("cpu")
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the CPU peak reads Linux's /proc")


def _touch(mib: int) -> None:
    t = torch.ones(mib * 2**20 // 4)  # written, so resident
    time.sleep(0.05)  # held for ten sampling intervals, as a phase's tensors are (a shorter spike can be missed)
    del t


@linux_only
def test_each_phase_reports_its_own_peak_and_the_process_peak_is_left_alone():
    peaks = PhasePeaks(CPU)
    baseline = current_bytes(CPU) / GIB
    with peaks("big"):
        _touch(256)
    run_peak = high_water_bytes(CPU) / GIB
    with peaks("small"):
        _touch(1)
    with peaks("middle"):  # below the run's high so far: its peak is the sampler's
        _touch(128)
    with peaks("big"):  # a second, smaller call of a phase keeps the phase's highest
        pass
    out = peaks.take()
    assert set(out) == {"memory/big_peak_gib", "memory/small_peak_gib", "memory/middle_peak_gib"}
    assert out["memory/big_peak_gib"] >= baseline + 0.24
    # the big tensor was freed before "small" started: its peak is its own, not the process's so far
    assert out["memory/small_peak_gib"] < out["memory/big_peak_gib"] - 0.2
    assert baseline + 0.11 <= out["memory/middle_peak_gib"] < out["memory/big_peak_gib"] - 0.1
    assert high_water_bytes(CPU) / GIB >= run_peak  # never reset: the process's peak is still the run's
    assert peaks.take() == {}  # taken: the next step starts over
