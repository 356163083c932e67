"""The reward-function registry, get_reward_fn specs, and the built-in arithmetic/gsm8k/math_boxed scorers."""

from __future__ import annotations

import functools

import pytest
from omegaconf import OmegaConf

from verl.config.errors import ConfigError
from verl.reward import functions
from verl.reward.functions import REWARD_FNS, get_reward_fn, register_reward


def only_problem(info: pytest.ExceptionInfo):
    (problem,) = info.value.problems
    return problem


def length_reward(prompt, response, ground_truth, extra, *, scale=1.0):
    """A reward for tests: scale x the response length."""
    return scale * len(response)


def make_prefix_reward(prefix):
    """A factory: the reward function it returns scores 1.0 for responses starting with `prefix`."""
    return lambda prompt, response, ground_truth, extra: float(response.startswith(prefix))


# --------------------------------------------------------------------------- registry and specs


def test_builtins_are_registered():
    assert {"arithmetic", "gsm8k", "math_boxed"} <= set(REWARD_FNS)
    assert get_reward_fn("gsm8k") is functions.gsm8k


def test_unknown_name_suggests_the_nearest_and_names_the_key():
    with pytest.raises(ConfigError) as info:
        get_reward_fn("gsm8")
    problem = only_problem(info)
    assert problem.key == "reward.fn"
    assert "unknown reward function 'gsm8'" in problem.message
    assert "did you mean 'gsm8k'?" in problem.fix
    assert "arithmetic" in problem.fix and "math_boxed" in problem.fix  # the registered names are listed


@pytest.fixture
def registered_names():
    """Names a test registers are removed after it."""
    before = set(REWARD_FNS.names())
    yield
    for name in set(REWARD_FNS.names()) - before:
        REWARD_FNS.unregister(name)


def test_register_reward_adds_a_name_and_refuses_a_clash(registered_names):
    @register_reward("always_one")
    def always_one(prompt, response, ground_truth, extra):
        return 1.0

    assert functions.REWARD_FNS["always_one"] is always_one
    assert get_reward_fn("always_one")("p", "r", "g", {}) == 1.0
    register_reward("always_one")(always_one)  # the same function again is fine (a module imported twice)
    with pytest.raises(ValueError, match="'always_one' is already registered"):
        register_reward("always_one")(length_reward)


def test_target_mapping_binds_kwargs():
    fn = get_reward_fn({"_target_": f"{__name__}.length_reward", "scale": 0.5})
    assert isinstance(fn, functools.partial)
    assert fn("p", "abcd", "g", {}) == 2.0  # 0.5 x 4 characters


def test_target_mapping_from_omegaconf():
    fn = get_reward_fn(OmegaConf.create({"_target_": f"{__name__}.length_reward", "scale": 2}))
    assert fn("p", "abc", "g", {}) == 6.0  # 2 x 3


def test_target_may_be_a_registered_name():
    fn = get_reward_fn({"_target_": "gsm8k", "flexible": True})
    assert fn("", "the answer is 12", "12", {}) == 1.0  # no "####": only the flexible fallback finds 12
    assert get_reward_fn("gsm8k")("", "the answer is 12", "12", {}) == 0.0


def test_target_with_partial_false_uses_the_factory_result():
    fn = get_reward_fn({"_target_": f"{__name__}.make_prefix_reward", "_partial_": False, "prefix": "yes"})
    assert fn("", "yes!", "", {}) == 1.0
    assert fn("", "no", "", {}) == 0.0


def test_target_with_an_unknown_kwarg_is_a_config_error():
    with pytest.raises(ConfigError) as info:
        get_reward_fn({"_target_": "gsm8k", "flexibel": True})
    problem = only_problem(info)
    assert problem.key == "reward.fn"
    assert "flexibel" in problem.message


def test_target_naming_an_unknown_registered_name():
    with pytest.raises(ConfigError) as info:
        get_reward_fn({"_target_": "math_boxd"})
    problem = only_problem(info)
    assert problem.key == "reward.fn._target_"
    assert "did you mean 'math_boxed'?" in problem.fix


def test_a_callable_is_used_as_is():
    assert get_reward_fn(length_reward) is length_reward


def test_wrong_signature_fails_at_load_time():
    with pytest.raises(ConfigError) as info:
        get_reward_fn(lambda response: 1.0)
    problem = only_problem(info)
    assert problem.key == "reward.fn"
    assert "fn(prompt, response, ground_truth, extra)" in problem.message


def test_wrong_spec_type():
    with pytest.raises(ConfigError) as info:
        get_reward_fn(3)
    assert "got int" in only_problem(info).message


# --------------------------------------------------------------------------- arithmetic


@pytest.mark.parametrize(
    ("response", "ground_truth", "score"),
    [
        ("42", "42", 1.0),
        ("  42  ", "42", 1.0),
        ("42\nbecause 40 + 2", "42", 1.0),  # everything after the first line is ignored
        ("\n 42\n43", "42", 1.0),  # leading blank lines are whitespace, not the first line
        ("420", "42", 0.0),
        ("4 2", "42", 0.0),
        ("42.0", "42", 0.0),  # exact string match, not numeric
        ("", "42", 0.0),
        ("-7", " -7 ", 1.0),
        ("x", "", 0.0),
    ],
)
def test_arithmetic(response, ground_truth, score):
    assert functions.arithmetic("1+1=", response, ground_truth, {}) == score


# --------------------------------------------------------------------------- gsm8k


@pytest.mark.parametrize(
    ("response", "ground_truth", "kwargs", "score"),
    [
        ("3 + 4 = 7\n#### 7", "7", {}, 1.0),
        ("#### 1,000", "1000", {}, 1.0),  # commas removed
        ("#### 1000", "1,000", {}, 1.0),
        ("#### 1000.00", "1000", {}, 1.0),  # numeric comparison
        ("#### -5", "-5", {}, 1.0),
        ("#### 5", "-5", {}, 0.0),
        ("#### 3\nwait, #### 4", "4", {}, 1.0),  # the last marker
        ("#### 4\nwait, #### 3", "4", {}, 0.0),
        ("#### $18.", "18", {}, 1.0),
        ("the answer is 72", "72", {}, 0.0),  # strict: no marker, no answer
        ("the answer is 72", "72", {"flexible": True}, 1.0),
        ("5 apples, then 72 total.", "72", {"flexible": True}, 1.0),
        ("72 apples, then 5 left", "72", {"flexible": True}, 0.0),  # flexible takes the last number
        ("#### 8 and then 72", "8", {"flexible": True}, 1.0),  # the marker still wins when present
        ("no numbers", "72", {"flexible": True}, 0.0),
        ("#### 71", "72", {"format_score": 0.1}, 0.1),  # parsed but wrong
        ("no answer", "72", {"format_score": 0.1}, 0.0),  # nothing parsed: no format credit
        ("#### 72", "#### 72", {}, 1.0),  # a ground truth in gsm8k's own "####" form
        ("#### 72", 72, {}, 1.0),  # a ground truth stored as a number
    ],
)
def test_gsm8k(response, ground_truth, kwargs, score):
    assert functions.gsm8k("q", response, ground_truth, {}, **kwargs) == score


def test_gsm8k_bad_ground_truth_raises():
    with pytest.raises(ValueError, match="gsm8k ground truth 'seventy' is not a number"):
        functions.gsm8k("q", "#### 70", "seventy", {})


# --------------------------------------------------------------------------- math_boxed


@pytest.mark.parametrize(
    ("response", "ground_truth", "score"),
    [
        (r"so $\boxed{\frac{1}{2}}$.", "0.5", 1.0),
        (r"\boxed{1/2}", r"\frac{1}{2}", 1.0),
        (r"\boxed{0.5}", r"\dfrac12", 1.0),
        (r"\boxed{\left(3, 4\right)}", "(3,4)", 1.0),
        (r"\boxed{\text{5 cm}}", "5cm", 1.0),
        (r"\boxed{1,000}", "1000", 1.0),
        (r"\boxed{-2}", "-2", 1.0),
        (r"\boxed{2}", "-2", 0.0),
        (r"\boxed{1} no, \boxed{2}", "2", 1.0),  # multiple boxes: the last
        (r"\boxed{1} no, \boxed{2}", "1", 0.0),
        (r"\boxed{\frac{\sqrt{3}}{2}}", r"\frac{\sqrt3}{2}", 1.0),  # nested braces
        ("the answer is 5", "5", 0.0),  # no box
        (r"\boxed{5", "5", 0.0),  # unclosed box
        (r"\boxed{}", "", 0.0),
        (r"\boxed{4}", r"The sum is $\boxed{4}$.", 1.0),  # a full solution as ground truth: its box
    ],
)
def test_math_boxed(response, ground_truth, score):
    assert functions.math_boxed("q", response, ground_truth, {}) == score


def test_math_boxed_format_score():
    assert functions.math_boxed("q", r"\boxed{3}", "4", {}, format_score=0.1) == 0.1
    assert functions.math_boxed("q", "3", "4", {}, format_score=0.1) == 0.0


def test_episode_return_sums_the_turn_rewards_discounted():
    fn = get_reward_fn("episode_return")
    agent = {"turns": 3, "turn_rewards": [1.0, 0.0, 2.0]}
    assert fn("p", "r", "", {"agent": agent}) == 3.0
    assert get_reward_fn({"_target_": "episode_return", "discount": 0.5})("p", "r", "", {"agent": agent}) == 1.5
    assert fn("p", "r", "", {"agent": {"turns": 1, "turn_rewards": []}}) == 0.0
    with pytest.raises(ValueError, match="set rollout.agent.loop"):
        fn("p", "r", "", {})
