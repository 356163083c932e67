"""Peak memory per phase: on CPU the process's resident high-water mark, reset at each phase's start."""

from __future__ import annotations

import sys

import pytest
import torch

from verl.utils.memory import PhasePeaks, peak_gib, reset_peak


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the per-phase CPU peak reads Linux's /proc")
def test_each_phase_reports_its_own_peak():
    peaks = PhasePeaks(torch.device("cpu"))
    reset_peak(torch.device("cpu"))
    baseline = peak_gib(torch.device("cpu"))  # the resident set now
    with peaks("big"):
        big = torch.ones(256 * 2**20 // 4)  # 256 MiB, touched
        del big
    with peaks("small"):
        small = torch.ones(1024)
        del small
    with peaks("big"):  # a second, smaller call of a phase keeps the phase's highest
        pass
    out = peaks.take()
    assert set(out) == {"memory/big_peak_gib", "memory/small_peak_gib"}
    assert out["memory/big_peak_gib"] >= baseline + 0.24
    # the big tensor was freed before "small" started: its peak is its own, not the process's so far
    assert out["memory/small_peak_gib"] < out["memory/big_peak_gib"] - 0.2
    assert peaks.take() == {}  # taken: the next step starts over
