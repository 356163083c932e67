"""Kill anywhere, resume, and get the uninterrupted run: `verl train` processes, or one of their Ray workers,
SIGKILLed at seeded random moments (during generation, the update, a checkpoint save or its pruning: a checkpoint
every step), each resumed with `trainer.resume=auto`, end with the uninterrupted run's weights and every logged
metric bit for bit, each step logged once, only complete checkpoints on disk, and no process of theirs left.

One torch thread per process: at one thread a seeded run repeats bit for bit (tests/e2e/test_reproducible.py),
so any difference is the resume's.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.support.processes import cmdline, descendants, env_values
from tests.support.run_configs import ODD_LENGTH_REWARD, RECIPES, tiny_overrides

pytestmark = pytest.mark.slow  # the fast tier skips this file (tagged "slow" in tests/BUILD too)

STEPS = 8
MEASURED = ("timing/", "perf/", "memory/")  # wall-clock and memory readings, not results of the computation
COMMON = (
    "placement.threads_per_worker=1",
    "rollout.n=4",
    "checkpoint.save_every=1",  # a save (and a prune: keep_last 2) every step, so kills land in them too
    "checkpoint.keep_last=2",
    "checkpoint.save_hf=true",
    ODD_LENGTH_REWARD,  # rewards with spread, so every step changes the weights
)
# The kinds of run: in-process workers; FSDP over two Ray workers (a multi-rank checkpoint save); the rollout on a
# worker of its own, one step off the policy (a batch in flight at every checkpoint, weights over a transfer group).
MODES = {
    "local": ("grpo_tiny", ("trainer.controller=local",)),
    "fsdp_dp2_ray": ("grpo_tiny", ("trainer.controller=ray", "placement.devices_per_node=2")),
    "one_step_off": ("grpo_tiny_async", ("trainer.controller=ray",)),
    "megatron_tp2": ("grpo_tiny_megatron", ()),  # TP=2 over two Ray workers: a distributed checkpoint
}
# Where kills aim: the driver inside a step or a save, and under Ray one of its workers too.
AIMS = {
    "local": ["save", "step", "step"],
    "fsdp_dp2_ray": ["save", "step", "worker"],
    "one_step_off": ["save", "step", "worker"],
    "megatron_tp2": ["save", "step", "worker"],
}


def _cmd(out: Path, mode: str) -> list[str]:
    recipe, extra = MODES[mode]
    overrides = (*tiny_overrides(str(out), steps=STEPS), *COMMON, *extra)
    return [sys.executable, "-m", "verl.cli", "train", str(RECIPES / f"{recipe}.yaml"), *overrides]


def _env(cache: str) -> dict:
    path = os.pathsep.join(p for p in sys.path if p)  # the child imports what this process imports
    return {**os.environ, "VERL_CACHE": cache, "OMP_NUM_THREADS": "1", "PYTHONPATH": path}


def _logged(run: Path) -> list[dict]:
    path = run / "logs" / "metrics.jsonl"
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:  # a line a kill cut short
            pass
    return rows


def _saving(root: Path) -> bool:
    return root.is_dir() and any(".tmp-" in name or ".old-" in name for name in os.listdir(root))


def _workers(driver: int) -> list[int]:
    """The Ray worker processes under `driver` (Ray names each after its actor's class)."""
    return sorted(p for p in descendants(driver) if cmdline(p).startswith("ray::") and cmdline(p).endswith("Worker"))


def _kill_at(proc: subprocess.Popen, run: Path, rng: random.Random, aims: list[str]) -> str:
    """SIGKILL `proc` (or, aiming at a "worker", one of its Ray workers) at a moment drawn from `rng`: inside a
    checkpoint save, or some time into a step after a drawn number of further steps. Returns where it aimed, or
    "finished" when the run ended first."""
    done = len(_logged(run))
    aim = rng.choice(aims)
    after, delay = rng.randint(0, 2), rng.uniform(0.0, 0.3)
    root = run / "checkpoints"
    deadline = time.monotonic() + 300
    while proc.poll() is None and time.monotonic() < deadline:
        if len(_logged(run)) >= done + after and (aim != "save" or _saving(root)):
            if aim != "save":
                time.sleep(delay)
            if aim == "worker" and (workers := _workers(proc.pid)):
                os.kill(rng.choice(workers), signal.SIGKILL)
                try:  # the driver notices, names the worker and stops by itself
                    proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    raise AssertionError("the run went on for 60 s after one of its workers was killed") from None
                assert proc.returncode != 0, "a run whose worker was killed ended as if it had finished"
            else:
                proc.send_signal(signal.SIGKILL)
                proc.wait()
            return f"{aim} (after {len(_logged(run))} steps logged)"
        time.sleep(0.001)
    assert proc.poll() is not None, "the run neither finished nor reached its kill point within 300 s"
    return "finished"


def _results(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in row.items() if k != "time" and not k.startswith(MEASURED)} for row in rows]


@pytest.mark.parametrize(
    "mode, seed",
    [("local", 0), ("local", 1), ("fsdp_dp2_ray", 3), ("one_step_off", 3), ("megatron_tp2", 3)],
    ids=lambda v: str(v),
)
def test_killed_anywhere_and_resumed_equals_the_straight_run(tmp_path, embedded_cache, mode, seed):  # noqa: F811
    env = _env(embedded_cache)
    straight = tmp_path / "straight"
    done = subprocess.run(_cmd(straight, mode), env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]

    run, rng, kills, drivers = tmp_path / "killed", random.Random(seed), [], []
    for _ in range(3):
        with open(tmp_path / f"killed-{len(kills)}.stderr", "w") as err:  # a file: a pipe could fill up
            proc = subprocess.Popen(_cmd(run, mode), env=env, stdout=subprocess.DEVNULL, stderr=err)
            drivers.append(proc.pid)
            where = _kill_at(proc, run, rng, AIMS[mode])
        if where == "finished":
            assert proc.returncode == 0, (tmp_path / f"killed-{len(kills)}.stderr").read_text()[-3000:]
            break
        kills.append(where)
    else:  # the last resume, to the end
        done = subprocess.run(_cmd(run, mode), env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
    assert kills, "every run finished before its kill landed: nothing was tested"
    print(f"{mode}, seed {seed}: killed at {kills}")

    # Each step logged once, with the straight run's results, bit for bit.
    rows, expected = _logged(run), _logged(straight)
    assert [r["step"] for r in rows] == [r["step"] for r in expected] == list(range(1, STEPS + 1)), kills
    assert _results(rows) == _results(expected), kills
    # The same final weights, bit for bit (and not the starting model's: training moved them).
    a = load_file(str(straight / "hf" / "model.safetensors"))
    b = load_file(str(run / "hf" / "model.safetensors"))
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), (name, kills)
    # Only complete checkpoints, the last keep_last of them, and no leftovers of a save or a prune.
    names = sorted(os.listdir(run / "checkpoints"))
    assert names == [f"step_{STEPS - 1}", f"step_{STEPS}"], names
    assert all((run / "checkpoints" / n / "COMPLETE").exists() for n in names)
    # No process of the killed runs is left: none names the run's folder, and the Ray processes a killed driver
    # started (they carry its run tag, "<driver pid>-...") are gone once its reaper has run.
    left = [pid for pid in os.listdir("/proc") if pid.isdigit() and str(run) in cmdline(int(pid))]
    assert not left, [cmdline(int(pid)) for pid in left]
    deadline = time.monotonic() + 30
    while orphans := [p for p, tag in env_values("VERL_RUN").items() if int(tag.split("-")[0]) in drivers]:
        assert time.monotonic() < deadline, [cmdline(p) for p in orphans]
        time.sleep(0.5)
