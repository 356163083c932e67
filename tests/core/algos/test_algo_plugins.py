"""A custom estimator is picked up by name from a recipe, without any change to verl's code.

Three ways in: the decorator in a module that is already imported (this file), the decorator in a module
the recipe lists under trainer.plugins, and a {_target_: module.fn, **kwargs} spec in the recipe.
"""

from __future__ import annotations

import sys
import textwrap

import pytest
import torch

from verl.algos import ADV_ESTIMATORS, KL_ESTIMATORS, POLICY_LOSSES, compute_advantages, load_plugins
from verl.config.errors import ConfigError
from verl.config.loader import load_config
from verl.config.placement import enabled_roles
from verl.config.validate import validate

RECIPE = """\
model: {path: /tmp/m}
data: {train_files: [a.parquet], train_batch_size: 8}
actor: {ppo_mini_batch_size: 4}
rollout: {n: 2}
"""


@ADV_ESTIMATORS.register("test_batch_mean_baseline")
def batch_mean_baseline(token_level_rewards, response_mask, *, config):
    """A_i = (r_i - mean of the batch's scores) * config.lam on every response token (no index, no values)."""
    scores = token_level_rewards.sum(dim=-1)
    adv = ((scores - scores.mean()) * config.lam).unsqueeze(-1) * response_mask
    return adv, adv


def recipe(tmp_path, extra: str = ""):
    path = tmp_path / "recipe.yaml"
    path.write_text(RECIPE + textwrap.dedent(extra))
    return load_config(path)


def problems_at(cfg, *prefixes):
    return [p for p in validate(cfg, strict=False) if p.key.startswith(prefixes)]


@pytest.fixture
def plugin_dir(tmp_path, monkeypatch):
    """Write modules onto sys.path; afterwards forget them and every registration they made."""
    monkeypatch.syspath_prepend(str(tmp_path))
    registries = (ADV_ESTIMATORS, POLICY_LOSSES, KL_ESTIMATORS)
    before = [set(r.names()) for r in registries]
    written = []

    def write(name: str, text: str) -> None:
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(text))
        written.append(name)

    yield write
    for name in written:
        sys.modules.pop(name, None)
    for registry, names in zip(registries, before):
        for extra in set(registry.names()) - names:
            registry.unregister(extra)


REWARDS = torch.tensor([[0.0, 1.0], [0.0, 3.0], [2.0, 0.0]])
MASK = torch.tensor([[1, 1], [1, 1], [1, 0]], dtype=torch.bool)
INDEX = ["p", "p", "q"]


def test_an_estimator_registered_in_a_test_file_is_picked_up_from_a_recipe(tmp_path):
    cfg = recipe(tmp_path, "algorithm: {adv_estimator: test_batch_mean_baseline, lam: 0.5}\n")
    assert problems_at(cfg, "algorithm", "rollout.n", "critic.loss") == []
    assert "critic" not in enabled_roles(cfg)
    adv, _ = compute_advantages(cfg.algorithm.adv_estimator, REWARDS, MASK, config=cfg.algorithm, index=INDEX)
    # scores 1, 3, 2 -> mean 2 -> (-1, 1, 0) * lam 0.5 on response tokens
    torch.testing.assert_close(adv, torch.tensor([[-0.5, -0.5], [0.5, 0.5], [0.0, 0.0]]))


def test_a_plugin_module_listed_in_the_recipe_registers_its_estimator(tmp_path, plugin_dir):
    plugin_dir(
        "verl_test_plugin_loo",
        """
        import torch
        from verl.algos import ADV_ESTIMATORS

        @ADV_ESTIMATORS.register("plugin_leave_one_out", requires=("index",))
        def leave_one_out(token_level_rewards, response_mask, *, index, **_):
            scores = token_level_rewards.sum(-1)
            adv = torch.zeros_like(scores)
            for i, uid in enumerate(index):
                others = [scores[j] for j in range(len(index)) if index[j] == uid and j != i]
                if others:
                    adv[i] = scores[i] - sum(others) / len(others)
            return adv.unsqueeze(-1) * response_mask, adv.unsqueeze(-1) * response_mask
        """,
    )
    cfg = recipe(
        tmp_path,
        """
        algorithm: {adv_estimator: plugin_leave_one_out}
        trainer: {plugins: [verl_test_plugin_loo]}
        """,
    )
    assert "plugin_leave_one_out" not in ADV_ESTIMATORS  # nothing imported it yet
    assert problems_at(cfg, "algorithm", "trainer", "rollout.n") == []  # validate loads the plugins first
    adv, _ = compute_advantages(cfg.algorithm.adv_estimator, REWARDS, MASK, config=cfg.algorithm, index=INDEX)
    # p: 1 - 3 = -2, 3 - 1 = 2; q: alone -> 0
    torch.testing.assert_close(adv, torch.tensor([[-2.0, -2.0], [2.0, 2.0], [0.0, 0.0]]))
    with pytest.raises(ValueError, match="'plugin_leave_one_out' needs index"):
        compute_advantages("plugin_leave_one_out", REWARDS, MASK, config=cfg.algorithm)


def test_a_plugin_estimator_that_needs_values_turns_the_critic_on(tmp_path, plugin_dir):
    plugin_dir(
        "verl_test_plugin_td",
        """
        from verl.algos import ADV_ESTIMATORS

        @ADV_ESTIMATORS.register("plugin_one_step_td", requires=("values",))
        def one_step_td(token_level_rewards, response_mask, *, values, **_):
            adv = (token_level_rewards - values) * response_mask
            return adv, token_level_rewards * response_mask
        """,
    )
    cfg = recipe(
        tmp_path, "algorithm: {adv_estimator: plugin_one_step_td}\ntrainer: {plugins: [verl_test_plugin_td]}\n"
    )
    load_plugins(cfg.trainer.plugins)
    assert "critic" in enabled_roles(cfg)
    values = torch.full((3, 2), 0.5)
    adv, _ = compute_advantages("plugin_one_step_td", REWARDS, MASK, config=cfg.algorithm, values=values)
    torch.testing.assert_close(adv, torch.tensor([[-0.5, 0.5], [-0.5, 2.5], [1.5, 0.0]]))


def test_a_target_spec_in_the_recipe_binds_its_kwargs(tmp_path, plugin_dir):
    plugin_dir(
        "verl_test_plugin_scaled",
        """
        def scaled_score(token_level_rewards, response_mask, *, scale, **_):
            adv = token_level_rewards.sum(-1, keepdim=True) * scale * response_mask
            return adv, adv
        """,
    )
    cfg = recipe(
        tmp_path, "algorithm:\n  adv_estimator: {_target_: verl_test_plugin_scaled.scaled_score, scale: 2.0}\n"
    )
    assert problems_at(cfg, "algorithm") == []
    adv, _ = compute_advantages(cfg.algorithm.adv_estimator, REWARDS, MASK, config=cfg.algorithm)
    torch.testing.assert_close(adv, torch.tensor([[2.0, 2.0], [6.0, 6.0], [4.0, 0.0]]))


def test_a_bad_target_is_reported_at_its_key(tmp_path):
    cfg = recipe(tmp_path, "algorithm:\n  adv_estimator: {_target_: no_such_module_here.fn}\n")
    (problem,) = problems_at(cfg, "algorithm")
    assert problem.key == "algorithm.adv_estimator._target_" and "cannot import" in problem.message


def test_an_unknown_name_in_the_recipe_suggests_the_close_one(tmp_path):
    cfg = recipe(tmp_path, "algorithm: {adv_estimator: grppo}\n")
    (problem,) = problems_at(cfg, "algorithm")
    assert problem.key == "algorithm.adv_estimator"
    assert "did you mean 'grpo'" in problem.fix and "trainer.plugins" in problem.fix


def test_a_plugin_that_is_not_there_is_a_config_error_naming_the_key(tmp_path):
    cfg = recipe(tmp_path, "trainer: {plugins: [verl, no_such_plugin_module]}\n")
    (problem,) = problems_at(cfg, "trainer")
    assert problem.key == "trainer.plugins.1" and "plugin module 'no_such_plugin_module' not found" in problem.message
    with pytest.raises(ConfigError) as info:
        load_plugins(["no_such_plugin_module"])
    assert info.value.problems[0].key == "trainer.plugins.0"


def test_a_plugin_that_fails_while_importing_is_reported(tmp_path, plugin_dir):
    plugin_dir(
        "verl_test_plugin_clash",
        """
        from verl.algos import ADV_ESTIMATORS

        @ADV_ESTIMATORS.register("grpo")  # taken by the built-in
        def my_grpo(*args, **kwargs):
            pass
        """,
    )
    plugin_dir("verl_test_plugin_missing_dep", "import no_such_dependency_here\n")
    with pytest.raises(ConfigError) as info:
        load_plugins(["verl_test_plugin_clash", "verl_test_plugin_missing_dep"])
    clash, missing = info.value.problems
    assert clash.key == "trainer.plugins.0" and "advantage estimator 'grpo' is already registered" in clash.message
    assert missing.key == "trainer.plugins.1" and "no_such_dependency_here" in missing.fix
