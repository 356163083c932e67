"""Recipe checks for the algorithm keys: registered names (with did-you-mean), ranges, DAPO settings."""

from __future__ import annotations

import pytest

from tests.support.fixtures import make_cfg
from verl.config.validate import validate

ALGO_KEYS = (
    "algorithm.",
    "actor.policy_loss",
    "actor.loss_",
    "actor.kl_loss_type",
    "actor.clip",
    "actor.tis",
    "critic.loss",
)


def algo_problems(*updates, severity=None):
    problems = [p for p in validate(make_cfg(*updates), strict=False) if p.key.startswith(ALGO_KEYS)]
    return [p for p in problems if severity is None or p.severity == severity]


def test_defaults_and_every_builtin_name_pass():
    assert algo_problems() == []
    update = {
        "algorithm": {"adv_estimator": "rloo", "kl_penalty": "k3", "kl_ctrl": {"type": "adaptive"}},
        "actor": {"policy_loss": "cispo", "loss_agg_mode": "seq-mean-token-sum-norm", "kl_loss_type": "full"},
    }
    assert algo_problems(update) == []


@pytest.mark.parametrize(
    "update, key, suggestion",
    [
        ({"algorithm": {"adv_estimator": "reinforce_plus_pluss"}}, "algorithm.adv_estimator", "reinforce_plus_plus"),
        ({"actor": {"policy_loss": "vanila"}}, "actor.policy_loss", "vanilla"),
        ({"actor": {"loss_agg_mode": "token_mean"}}, "actor.loss_agg_mode", "token-mean"),
        ({"algorithm": {"kl_penalty": "low_var"}}, "algorithm.kl_penalty", "low_var_kl"),
        ({"actor": {"kl_loss_type": "msee"}}, "actor.kl_loss_type", "mse"),
        ({"algorithm": {"kl_ctrl": {"type": "adaptiv"}}}, "algorithm.kl_ctrl.type", "adaptive"),
        (
            {"algorithm": {"adv_estimator": "gae"}, "critic": {"loss_agg_mode": "seq-mean-token-men"}},
            "critic.loss_agg_mode",
            "seq-mean-token-mean",
        ),
    ],
)
def test_unregistered_names_get_a_suggestion(update, key, suggestion):
    (p,) = algo_problems(update)
    assert p.key == key and p.severity == "error"
    assert f"did you mean '{suggestion}'" in p.fix


def test_critic_loss_mode_is_checked_only_when_a_critic_runs():
    assert algo_problems({"critic": {"loss_agg_mode": "nope"}}) == []  # grpo: no critic


def test_a_spec_of_the_wrong_type():
    (p,) = algo_problems({"actor": {"policy_loss": 3}})
    assert p.key == "actor.policy_loss" and "registered policy loss name or a {_target_" in p.message
    (p,) = algo_problems({"actor": {"policy_loss": {"name": "gspo"}}})
    assert "needs '_target_'" in p.message


@pytest.mark.parametrize(
    "update, key, text",
    [
        ({"actor": {"clip_ratio_c": 1.0}}, "actor.clip_ratio_c", "must be > 1"),
        ({"actor": {"clip_ratio": 1.0}}, "actor.clip_ratio", "[0, 1)"),
        ({"actor": {"clip_ratio_low": -0.1}}, "actor.clip_ratio_low", "[0, 1)"),
        ({"actor": {"clip_ratio_high": -0.1}}, "actor.clip_ratio_high", ">= 0"),
        ({"actor": {"tis_imp_ratio_cap": 0.0}}, "actor.tis_imp_ratio_cap", "> 0"),
        ({"actor": {"loss_norm_length": 0}}, "actor.loss_norm_length", ">= 1"),
        ({"algorithm": {"kl_ctrl": {"type": "adaptive", "horizon": 0}}}, "algorithm.kl_ctrl.horizon", ">= 1"),
        ({"algorithm": {"overlong_buffer": {"enable": True, "len": 0}}}, "algorithm.overlong_buffer.len", "[1, data"),
        (
            {"algorithm": {"overlong_buffer": {"enable": True, "len": 600}}, "data": {"max_response_length": 512}},
            "algorithm.overlong_buffer.len",
            "max_response_length=512",
        ),
        (
            {"algorithm": {"overlong_buffer": {"enable": True, "len": 64, "penalty_factor": -1.0}}},
            "algorithm.overlong_buffer.penalty_factor",
            ">= 0",
        ),
        (
            {"algorithm": {"filter_groups": {"enable": True}}, "rollout": {"n": 1}},
            "algorithm.filter_groups.enable",
            "drops every group",
        ),
    ],
)
def test_ranges(update, key, text):
    errors = algo_problems(update, severity="error")
    assert [p.key for p in errors] == [key], [p.format() for p in errors]
    assert text in errors[0].message


def test_gspo_warns_about_a_token_level_aggregation():
    (p,) = algo_problems({"actor": {"policy_loss": "gspo"}})
    assert p.severity == "warning" and p.key == "actor.loss_agg_mode" and "seq-mean-token-mean" in p.fix
    assert algo_problems({"actor": {"policy_loss": "gspo", "loss_agg_mode": "seq-mean-token-mean"}}) == []


def test_group_size_warning_follows_the_registry():
    # any estimator that needs the group index warns at n=1, not only grpo and rloo
    for name in ("opo", "drgrpo", "reinforce_plus_plus_baseline"):
        problems = [
            p for p in validate(make_cfg({"algorithm": {"adv_estimator": name}, "rollout": {"n": 1}}), strict=False)
        ]
        assert any(p.key == "rollout.n" and name in p.message for p in problems), name
    problems = validate(
        make_cfg({"algorithm": {"adv_estimator": "reinforce_plus_plus"}, "rollout": {"n": 1}}), strict=False
    )
    assert not any(p.key == "rollout.n" for p in problems)


@pytest.mark.parametrize(
    "key, switch", [("algorithm.kl_penalty", "algorithm.use_kl_in_reward"), ("actor.kl_loss_type", "actor.use_kl_loss")]
)
def test_full_kl_is_refused_in_a_run(key, switch):
    section, name = key.split(".")
    s_section, s_name = switch.split(".")
    cfg = make_cfg({section: {name: "full"}}, {s_section: {s_name: True}})
    problems = [p for p in validate(cfg, installed=None) if p.key == key]
    assert problems and "low_var_kl" in problems[0].fix
    off = make_cfg({section: {name: "full"}})  # not used: no problem
    assert not [p for p in validate(off, installed=None) if p.key == key and p.severity == "error"]
