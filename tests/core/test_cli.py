"""The `verl` command: exit codes, printed config and plan, problems on stderr, never a traceback."""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

import pytest

from verl import backends, cli
from verl.backends import BackendSpec
from verl.config import layout_checks

INSTALLED = {
    "fsdp": BackendSpec("fsdp", "train", "verl-fsdp"),
    "hf": BackendSpec("hf", "rollout", "verl-rollout"),
    "sglang": BackendSpec("sglang", "rollout", "verl-rollout", requires=("sglang",), extra="verl-rollout[sglang]"),
    # a rollout backend whose library is missing here (vLLM itself may be installed where these tests run)
    "vllm": BackendSpec("vllm", "rollout", "verl-rollout", requires=("no_such_vllm_xyz",), extra="verl-rollout[vllm]"),
    "torch": BackendSpec("torch", "kernels", "verl-kernels"),
}

RECIPE = """\
model: {path: embedded:tiny-llama}
data: {train_files: ["embedded:arithmetic"], train_batch_size: 16}
actor: {ppo_mini_batch_size: 4}
rollout: {n: 4}
reward: {fn: arithmetic}
placement: {nnodes: 1, devices_per_node: 2, device: cpu}
"""


@pytest.fixture(autouse=True)
def fixed_environment(monkeypatch):
    # The CLI asks the environment; these tests fix its answers so they hold on any machine and path.
    monkeypatch.setattr(backends, "installed_backends", lambda: INSTALLED)
    monkeypatch.setattr(cli, "installed_backends", lambda: INSTALLED)
    monkeypatch.setattr(layout_checks, "_cuda_available", lambda: False)


def recipe(tmp_path: Path, text: str = RECIPE) -> str:
    path = tmp_path / "recipe.yaml"
    path.write_text(textwrap.dedent(text))
    return str(path)


def run(capsys, *argv: str):
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, out, err


def test_validate_prints_resolved_config_and_plan(tmp_path, capsys):
    code, out, err = run(capsys, "validate", recipe(tmp_path))
    assert code == 0, err
    assert "# resolved config" in out and "train_batch_size: 16" in out
    assert "output_dir: outputs/verl/run" in out  # interpolations resolved
    assert "# plan" in out and "16 prompts x 4 samples = 64 samples/step" in out
    assert "actor dp1 | rollout tp0 dp1" in out
    assert err == ""


def test_validate_applies_overrides(tmp_path, capsys):
    code, out, err = run(capsys, "validate", recipe(tmp_path), "data.train_batch_size=8", "rollout.n=2")
    assert code == 0, err
    assert "8 prompts x 2 samples = 16 samples/step" in out


def test_validate_reports_every_problem_and_exits_2(tmp_path, capsys):
    code, out, err = run(capsys, "validate", recipe(tmp_path), "actor.ppo_mini_batch_size=5", "rollout.top_p=2.0")
    assert code == 2
    assert "actor.ppo_mini_batch_size" in err and "data.train_batch_size=16 is not a multiple" in err
    assert "rollout.top_p" in err
    assert "2 errors" in err


@pytest.mark.parametrize(
    "overrides, line",
    [
        (["actor.lora.rank=8"], "weight sync: the base weights with the LoRA adapters merged in"),
        (["actor.lora.rank=8", "rollout.backend=vllm", "rollout.lora_sync=adapter"], "weight sync: the LoRA adapters"),
        ([], None),
    ],
)
def test_the_plan_says_what_a_lora_actor_sends_its_rollout(tmp_path, capsys, overrides, line):
    code, out, err = run(capsys, "validate", recipe(tmp_path), *overrides)
    assert code == 0, err
    if line is None:
        assert "weight sync:" not in out
    else:
        assert line in out


def test_the_plan_says_when_ranks_are_balanced(tmp_path, capsys):
    on = "trainer.balance_ranks=true"
    code, out, err = run(capsys, "validate", recipe(tmp_path), on)  # 2 devices: the actor at DP 2
    assert code == 0, err
    assert "balanced ranks: each step's prompt groups are placed on the actor's 2 data-parallel ranks" in out
    assert "ranks by token count" in out
    code, out, err = run(capsys, "validate", recipe(tmp_path), on, "trainer.balance_cost=attention")
    assert code == 0, err
    assert "ranks by tokens and attention (trainer.balance_ranks, trainer.balance_cost)" in out
    code, out, err = run(capsys, "validate", recipe(tmp_path))
    assert code == 0, err
    assert "balanced ranks" not in out  # off by default
    code, out, err = run(capsys, "validate", recipe(tmp_path), on, "placement.devices_per_node=1")
    assert code == 0, err
    assert "balanced ranks" not in out  # one rank: nothing to balance


APART = "placement.pools=[{name: train, roles: [actor], devices: 1}, {name: gen, roles: [rollout]}]"


@pytest.mark.parametrize(
    "overrides, lines",
    [
        (
            [APART],
            [
                "weight sync: pool 'train' -> pool 'gen' over a transfer group (the actor's rank 0 and the rollout's "
                "1 rank, gloo)",
                "mode: sync: each step generates on the rollout's pool, then trains",
                "1 device in pool 'gen' (node 0)",
            ],
        ),
        ([APART, "trainer.mode=one_step_off"], ["mode: one_step_off: the rollout generates step k+1's batch"]),
        (
            [APART, "trainer.mode=async", "trainer.max_staleness=3"],
            ["mode: async: the rollout service (1 replica) generates up to 3 batch(es) ahead"],
        ),
    ],
)
def test_the_plan_shows_a_rollout_apart_and_the_mode(tmp_path, capsys, overrides, lines):
    code, out, err = run(capsys, "validate", recipe(tmp_path), *overrides)  # 2 devices: one pool each
    assert code == 0, err
    for line in lines:
        assert line in out


def test_load_errors_exit_2_without_traceback(tmp_path, capsys):
    code, out, err = run(capsys, "validate", recipe(tmp_path, RECIPE + "actr: {}\n"))
    assert code == 2 and "actr" in err


def test_load_and_semantic_problems_are_reported_together(tmp_path, capsys):
    # A typo, a wrong type and a batch size that does not divide: one run shows all three.
    code, out, err = run(
        capsys,
        "validate",
        recipe(tmp_path),
        "actor.ppo_mini_bach_size=4",
        "rollout.parallel.tp=two",
        "actor.ppo_micro_batch_size_per_device=3",
    )
    assert code == 2
    assert "did you mean 'ppo_mini_batch_size'" in err
    assert "rollout.parallel.tp: expected int, got str 'two'" in err
    assert "actor.ppo_micro_batch_size_per_device" in err
    assert "3 errors" in err


def test_missing_recipe_file(tmp_path, capsys):
    code, out, err = run(capsys, "train", str(tmp_path / "nope.yaml"), "--dry-run")
    assert code == 2 and "nope.yaml" in err and "not found" in err


@pytest.mark.parametrize(
    "argv",
    [
        ["--dry-run", "data.train_batch_size=8"],
        ["data.train_batch_size=8", "--dry-run"],
        ["rollout.n=4", "--dry-run", "data.train_batch_size=8"],
    ],
)
def test_dry_run_anywhere_after_the_recipe(tmp_path, capsys, argv):
    code, out, err = run(capsys, "train", recipe(tmp_path), *argv)
    assert code == 0, err
    assert "train_batch_size: 8" in out  # the override after --dry-run was applied
    assert "8 prompts x 4 samples" in out
    assert "validates and plans only" not in out  # a dry run starts nothing


def test_dry_run_before_the_recipe(tmp_path, capsys):
    code, out, err = run(capsys, "train", "--dry-run", recipe(tmp_path))
    assert code == 0 and "# plan" in out


def test_train_validates_plans_and_calls_the_trainer(tmp_path, capsys, monkeypatch):
    calls = []
    monkeypatch.setattr(cli, "start_trainer", lambda cfg, plan, name: calls.append((cfg, plan, name)) or 0)
    code, out, err = run(capsys, "train", recipe(tmp_path))
    assert code == 0, err
    ((cfg, plan, name),) = calls
    assert cfg.data.train_batch_size == 16 and plan.layout("actor").dp == 2
    assert name == "recipe"  # the run is named after the recipe file, in its summary line


def test_train_with_errors_starts_nothing(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(cli, "start_trainer", lambda cfg, plan, name: pytest.fail("trainer started"))
    code, out, err = run(capsys, "train", recipe(tmp_path), "rollout.n=0")
    assert code == 2 and "rollout.n" in err


def test_bad_input_found_while_running_is_a_message_and_exit_2(tmp_path, capsys, monkeypatch):
    """A data row, reward function or worker failing once the run has started: its message, no traceback, unless
    --debug or VERL_DEBUG=1 asks for it."""

    def failing_run(cfg, plan, name):
        raise ValueError("data/train.parquet: row 3: column 'prompt' must be a list of messages")

    monkeypatch.setattr(cli, "start_trainer", failing_run)
    monkeypatch.delenv("VERL_DEBUG", raising=False)
    code, out, err = run(capsys, "train", recipe(tmp_path))
    assert code == 2 and "error: data/train.parquet: row 3" in err and "--debug" in err
    with pytest.raises(ValueError, match="row 3"):
        cli.main(["train", recipe(tmp_path), "--debug"])
    monkeypatch.setenv("VERL_DEBUG", "1")
    with pytest.raises(ValueError, match="row 3"):
        cli.main(["train", recipe(tmp_path)])


def test_a_dead_worker_stops_the_run_with_role_rank_and_the_command_that_resumes(tmp_path, capsys, monkeypatch):
    from verl.controller import WorkerError

    def worker_died(cfg, plan, name):
        raise WorkerError(
            "actor_rollout", "update_actor", {1: "ActorDiedError: the actor died unexpectedly"}, {1: None}, 2
        )

    monkeypatch.setattr(cli, "start_trainer", worker_died)
    out_dir = tmp_path / "run"
    path = recipe(tmp_path)
    code, _, err = run(capsys, "train", path, f"trainer.output_dir={out_dir}")
    assert code == 2 and "role 'actor_rollout': method 'update_actor' failed on rank 1 (of 2)" in err
    assert "before its first checkpoint" in err and f"verl train {path} trainer.output_dir={out_dir}" in err

    (out_dir / "checkpoints" / "step_4").mkdir(parents=True)
    (out_dir / "checkpoints" / "step_4" / "COMPLETE").write_text("{}")
    code, _, err = run(capsys, "train", path, f"trainer.output_dir={out_dir}", "trainer.resume=disable")
    assert f"last checkpoint ({out_dir / 'checkpoints' / 'step_4'})" in err
    assert err.strip().splitlines()[-2].endswith("trainer.resume=disable trainer.resume=auto")


def test_missing_engine_fails_train_but_only_warns_in_dry_run_and_validate(tmp_path, capsys):
    path = recipe(tmp_path)
    code, out, err = run(capsys, "train", path, "rollout.backend=vllm")
    assert code == 2 and "error: rollout.backend" in err
    for argv in (["train", path, "rollout.backend=vllm", "--dry-run"], ["validate", path, "rollout.backend=vllm"]):
        code, out, err = run(capsys, *argv)
        assert code == 0 and "warning: rollout.backend" in err


def test_cuda_recipe_fails_train_here_but_plans(tmp_path, capsys):
    path = recipe(tmp_path)
    code, out, err = run(capsys, "train", path, "placement.device=cuda")
    assert code == 2 and "placement.device=cpu" in err
    code, out, err = run(capsys, "train", path, "placement.device=cuda", "--dry-run")
    assert code == 0 and "cuda devices" in out


def test_placement_errors_print_no_plan(tmp_path, capsys):
    code, out, err = run(
        capsys,
        "validate",
        recipe(tmp_path),
        "placement.devices_per_node=3",
        "actor.backend=megatron",
        "actor.parallel.tp=2",
    )
    assert code == 2
    assert "no plan" in out and "actor.parallel.tp" in err


def test_info_lists_backends_libraries_and_devices(capsys):
    code, out, err = run(capsys, "info")
    assert code == 0
    assert "fsdp" in out and "verl-fsdp" in out
    assert "missing: sglang" in out and "verl-rollout[sglang]" in out
    assert "megatron" in out and "not installed (pip install verl-megatron)" in out
    for lib in ("torch", "transformers", "ray", "megatron-core", "vllm", "sglang", "triton", "tensordict", "omegaconf"):
        assert f"\n  {lib} " in out
    assert "CUDA:" in out


def test_info_into_a_closed_pipe_exits_quietly(monkeypatch, capsys):
    # `verl info | head -1`: the reader goes away; the command must not end in a BrokenPipeError traceback.
    read_end, write_end = os.pipe()
    os.close(read_end)
    stdout = os.fdopen(write_end, "w", buffering=1)
    monkeypatch.setattr(sys, "stdout", stdout)
    assert cli.main(["info"]) == 0
    stdout.close()
    assert "Traceback" not in capsys.readouterr().err


@pytest.mark.parametrize("argv", [[], ["bogus"], ["train"], ["validate", "r.yaml", "--nope"], ["info", "extra"]])
def test_bad_arguments_exit_2(capsys, argv):
    code, out, err = run(capsys, *argv)
    assert code == 2 and "usage" in err


@pytest.fixture
def own_paths(monkeypatch):
    """sys.path, PYTHONPATH and imported modules as they were, after the test."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
    yield
    for name in [n for n in sys.modules if n.startswith("beside_recipe_") or n.startswith("in_cwd_")]:
        del sys.modules[name]


SCORE = "def score(prompt, response, ground_truth, extra):\n    return float(response == ground_truth)\n"


def test_a_reward_module_beside_the_recipe_or_in_the_working_directory_imports(
    tmp_path, capsys, monkeypatch, own_paths
):
    import subprocess

    recipes, work = tmp_path / "recipes", tmp_path / "work"
    recipes.mkdir(), work.mkdir()
    (recipes / "beside_recipe_rewards.py").write_text(SCORE)
    (work / "in_cwd_rewards.py").write_text(SCORE)
    monkeypatch.chdir(work)
    for module in ("beside_recipe_rewards", "in_cwd_rewards"):
        text = RECIPE.replace("reward: {fn: arithmetic}", f"reward: {{fn: {{_target_: {module}.score}}}}")
        code, out, err = run(capsys, "validate", recipe(recipes, text))
        assert code == 0, err
        # worker processes started from here find it too (a local Ray cluster's inherit this environment)
        child = subprocess.run([sys.executable, "-c", f"import {module}"], env=os.environ, capture_output=True)
        assert child.returncode == 0, child.stderr.decode()


def test_a_reward_module_nowhere_on_the_path_says_where_modules_are_found(tmp_path, capsys, own_paths):
    text = RECIPE.replace("reward: {fn: arithmetic}", "reward: {fn: {_target_: in_cwd_nowhere.score}}")
    code, out, err = run(capsys, "validate", recipe(tmp_path, text))
    assert code == 2 and "cannot import module 'in_cwd_nowhere'" in err
    assert "working directory or beside the recipe" in err and "PYTHONPATH" in err
