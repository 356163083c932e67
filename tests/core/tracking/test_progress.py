"""Progress: step/total, reward, KL, tokens/s and ETA on a terminal; nothing when stdout is not one."""

from __future__ import annotations

import io

import pytest
import torch
from rich.console import Console

from verl.tracking.progress import Progress, format_eta


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def terminal() -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, force_terminal=True, width=150, color_system=None), out


@pytest.mark.parametrize(("seconds", "text"), [(None, "?"), (0, "0:00:00"), (40.4, "0:00:40"), (3725, "1:02:05")])
def test_format_eta(seconds, text):
    assert format_eta(seconds) == text


def test_eta_from_the_mean_step_time_since_the_first_update():
    clock = Clock()
    progress = Progress(10, enabled=True, console=terminal()[0], clock=clock)
    try:
        progress.update(2, {})  # a resumed run: the first update is at step 2, t = 100
        assert progress.eta(2, clock.now) is None  # nothing to estimate from yet
        clock.now = 112.0
        progress.update(5, {})
        # 3 steps in 12 s = 4 s per step; 5 steps left -> 20 s
        assert progress.eta(5, clock.now) == 20.0
    finally:
        progress.close()


def test_shows_step_metrics_and_eta_on_a_terminal():
    clock = Clock()
    console, out = terminal()
    with Progress(10, enabled=True, console=console, clock=clock) as progress:
        progress.update(1, {})
        clock.now += 10.0
        progress.update(3, {"reward/score/mean": 0.75, "actor/ppo_kl": 0.0012, "perf/tokens_per_s": 1234.5})
    last = out.getvalue().split("\r")[-1]
    # 2 steps in 10 s -> 5 s per step, 7 left -> 35 s
    for part in ("step", "3/10", "reward 0.75", "kl 0.0012", "tok/s 1234", "ETA 0:00:35"):
        assert part in last, (part, last)


def test_metrics_not_yet_seen_show_a_dash():
    console, out = terminal()
    with Progress(None, enabled=True, console=console) as progress:
        progress.update(1, None)
    last = out.getvalue().split("\r")[-1]
    assert "reward -" in last and "kl -" in last and "ETA ?" in last


def test_values_of_any_kind_are_shown_without_failing():
    console, out = terminal()
    with Progress(4, enabled=True, console=console) as progress:
        progress.update(1, {"reward/score/mean": torch.tensor(0.5), "actor/kl": float("nan"), "perf/tokens_per_s": "?"})
    last = out.getvalue().split("\r")[-1]
    assert "reward 0.5" in last and "kl nan" in last and "tok/s -" in last


def test_off_when_stdout_is_not_a_terminal(capsys):
    progress = Progress(10)  # pytest captures stdout: not a terminal
    assert not progress.enabled
    progress.update(1, {"reward/score/mean": 1.0})
    progress.close()
    assert capsys.readouterr().out == ""
