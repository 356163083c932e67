"""The one line a run ends with."""

from __future__ import annotations

from verl.trainer.summary import format_summary

RUN = {"steps": 150, "seconds": 81.4, "tokens_per_s": 1028.2}


def test_the_summary_shows_before_and_after_or_what_there_is():
    both = format_summary("grpo_tiny", {**RUN, "val_accuracy_before": 0.475, "val_accuracy_after": 0.81})
    assert both == (
        "verl grpo_tiny: held-out greedy accuracy 47.5% -> 81.0% (+33.5 pts); 150 steps in 81 s; 1028 tokens/s"
    )
    after = format_summary("x", {**RUN, "val_accuracy_before": None, "val_accuracy_after": 0.5})
    assert "held-out greedy accuracy 50.0% at the end;" in after
    none = format_summary("x", {**RUN, "val_accuracy_before": None, "val_accuracy_after": None})
    assert "no validation set;" in none


def test_the_summary_says_when_the_first_step_was_done():
    line = format_summary("x", {**RUN, "val_accuracy_before": None, "val_accuracy_after": None, "first_step_s": 7.94})
    assert line.endswith("150 steps in 81 s (the first done 7.9 s after start); 1028 tokens/s")


def test_seconds_since_the_process_started():
    import os
    import subprocess
    import sys

    code = "import time; time.sleep(1.0); from verl.utils.process import seconds_since_start as s; print(s())"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, env=env).stdout
    assert 1.0 <= float(out) < 10.0  # the sleep, plus the interpreter's start-up
