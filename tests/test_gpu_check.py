"""The GPU check, tests/gpu/run.sh, where there is no GPU: its dry run passes (its plan, every GPU test file
collects, every GPU benchmark takes the arguments the script gives it), without --dry-run it exits with status 2
saying there is no GPU, and the budget table in its header agrees with its variables and fits the total."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "gpu" / "run.sh"
BASH = "/bin/bash" if os.path.exists("/bin/bash") else "bash"


def _env(path: str | None = None) -> dict:
    env = dict(os.environ)
    env["VERL_GPU_PYTHON"] = sys.executable  # this interpreter has the project's dependencies
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    env["PATH"] = path if path is not None else os.environ.get("PATH", "/usr/bin:/bin")
    env.pop("PYTEST_ADDOPTS", None)
    return env


def _run(*args: str, path: str | None = None, timeout: int = 540) -> subprocess.CompletedProcess:
    return subprocess.run(
        [BASH, str(SCRIPT), *args], cwd=ROOT, env=_env(path), capture_output=True, text=True, timeout=timeout
    )


def test_dry_run_collects_every_gpu_test_and_checks_the_benchmarks():
    out = _run("--dry-run")
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-6000:]
    assert "dry run: OK" in text
    # Both collections ran (tests/gpu with the plan's node ids, and the Triton file on its own) and found tests.
    assert len(re.findall(r"collect .*: \d+ tests? collected", text)) == 2, text[-6000:]
    for bench in ("gpu_grpo_step", "logprob_kernels", "gpu_weight_sync"):
        assert f"{bench}: " in text, bench
    assert "run config checked" in text  # the GRPO benchmark's run config passed verl's own checks


def test_without_a_gpu_it_exits_2_and_says_so():
    # A PATH without nvidia-smi, whatever this machine has.
    dirs = [
        d
        for d in os.environ.get("PATH", "/usr/bin:/bin").split(os.pathsep)
        if d and not (Path(d) / "nvidia-smi").exists()
    ]
    out = _run(path=os.pathsep.join(dirs), timeout=60)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "no NVIDIA GPU here" in out.stderr and "--dry-run" in out.stderr
    assert "setup" not in out.stdout  # the check comes before anything is installed
    bad = _run("--no-such-flag", timeout=60)
    assert bad.returncode == 2 and "unknown argument" in bad.stderr


def test_budget_table_matches_the_variables_and_fits_the_total():
    text = SCRIPT.read_text()
    table = {
        m.group(1): int(m.group(2))
        for m in re.finditer(r"^# \|[^|]*\| (B_\w+|TOTAL_BUDGET_S) +\| +(\d+) \|$", text, re.M)
    }
    variables = {m.group(1): int(m.group(2)) for m in re.finditer(r"^(B_\w+|TOTAL_BUDGET_S)=(\d+)$", text, re.M)}
    assert table and table == variables, (table, variables)
    total = variables.pop("TOTAL_BUDGET_S")
    assert sum(variables.values()) <= total <= 8 * 60
    # Every section of the plan names a budget of the table, and every budget of the table is used.
    named = set(re.findall(r'^  "\w+\|(B_\w+)\|', text, re.M)) | {"B_SETUP", "B_SETUP_OPTIONAL"}
    assert named == set(variables), named ^ set(variables)
