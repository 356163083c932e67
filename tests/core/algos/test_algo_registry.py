"""Registries: names, aliases, duplicates, did-you-mean, _target_ specs and callables."""

from __future__ import annotations

import functools

import pytest

from verl.algos import ADV_ESTIMATORS, AGG_MODES, KL_ESTIMATORS, POLICY_LOSSES, Registry, UnknownNameError
from verl.config.errors import ConfigError


def test_builtin_names():
    assert {
        "gae",
        "grpo",
        "drgrpo",
        "rloo",
        "reinforce_plus_plus",
        "reinforce_plus_plus_baseline",
        "remax",
        "opo",
    } <= set(ADV_ESTIMATORS.names())
    assert {"vanilla", "dual_clip", "gspo", "cispo"} <= set(POLICY_LOSSES.names())
    assert {"k1", "kl", "abs", "mse", "k2", "low_var_kl", "k3", "full"} <= set(KL_ESTIMATORS.names())
    assert set(AGG_MODES.names()) == {
        "token-mean",
        "seq-mean-token-mean",
        "seq-mean-token-sum",
        "seq-mean-token-sum-norm",
    }


def test_register_get_alias_unregister():
    reg = Registry("widget")

    @reg.register("one", aliases=("uno",), colour="red")
    def one():
        return 1

    assert reg.get("one") is one and reg.get("uno") is one
    assert one.colour == "red" and reg.attr("uno", "colour") == "red"
    assert reg.names() == ["one", "uno"] and "one" in reg
    reg.unregister("uno")
    assert reg.names() == ["one"]


def test_duplicate_name_is_a_clear_error_and_leaves_nothing_behind():
    reg = Registry("widget")
    reg.register("a")(lambda: 1)

    def other():
        return 2

    with pytest.raises(ValueError, match="widget 'a' is already registered"):
        reg.register("b", aliases=("a",))(other)
    assert reg.names() == ["a"]  # 'b' was not added either


def test_registering_the_same_function_again_is_harmless():
    reg = Registry("widget")

    def f():
        return 1

    reg.register("f")(f)
    reg.register("f")(f)  # a plugin imported twice
    assert reg.get("f") is f


def test_unknown_name_lists_names_and_suggests():
    with pytest.raises(UnknownNameError) as info:
        ADV_ESTIMATORS.get("grppo", key="algorithm.adv_estimator")
    text = str(info.value)
    assert isinstance(info.value, KeyError)
    assert text.startswith("algorithm.adv_estimator: unknown advantage estimator 'grppo'; did you mean 'grpo'?")
    assert "gae" in text and "rloo" in text and "_target_" in text


def test_target_spec_binds_kwargs_with_partial():
    spec = {"_target_": "verl.algos.aggregation.seq_mean_token_sum_norm", "norm_length": 7}
    fn = AGG_MODES.get(spec)
    assert isinstance(fn, functools.partial) and fn.keywords == {"norm_length": 7}


def test_target_spec_without_kwargs_is_the_function_itself():
    fn = ADV_ESTIMATORS.get({"_target_": "verl.algos.advantages.gae"})
    assert fn is ADV_ESTIMATORS.get("gae")
    # with kwargs it is a functools.partial; the metadata is still found through it
    assert ADV_ESTIMATORS.attr({"_target_": "verl.algos.advantages.rloo", "index": None}, "requires") == ("index",)


def test_bad_target_names_the_key():
    with pytest.raises(ConfigError) as info:
        ADV_ESTIMATORS.get({"_target_": "verl.algos.advantages.nope"}, key="algorithm.adv_estimator")
    assert info.value.problems[0].key == "algorithm.adv_estimator._target_"
    with pytest.raises(ConfigError, match="unexpected keyword argument 'gamma'") as info:
        ADV_ESTIMATORS.get({"_target_": "verl.algos.advantages.rloo", "gamma": 1.0}, key="algorithm.adv_estimator")
    assert info.value.problems[0].key == "algorithm.adv_estimator"
    with pytest.raises(ValueError, match="needs '_target_'"):
        ADV_ESTIMATORS.get({"name": "gae"})


def test_callables_pass_through_and_other_types_are_rejected():
    def mine(*a, **k):
        return None

    assert POLICY_LOSSES.get(mine) is mine
    with pytest.raises(TypeError, match="registered name"):
        POLICY_LOSSES.get(3)
