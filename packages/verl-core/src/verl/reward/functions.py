"""Reward functions: a registry of built-ins, and `get_reward_fn` that turns `reward.fn` into a callable.

Every reward function has the signature

    fn(prompt: str, response: str, ground_truth: str, extra: dict) -> float | dict

A dict result must hold "score"; its other numeric entries are logged as `reward/extra/<key>`, and an
"acc" entry, when present, is what `reward/accuracy` averages (see `verl.reward.manager`).
`extra` is the sample's `extra_info` with its `data_source` added.
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from verl.config.errors import ConfigError, ConfigProblem
from verl.config.instantiate import instantiate
from verl.registry import Registry
from verl.reward.answers import gsm8k_answer, last_boxed, last_number, math_answers_equal, parse_number

__all__ = ["REWARD_FNS", "RewardFn", "get_reward_fn", "register_reward"]

RewardFn = Callable[[str, str, str, dict[str, Any]], float | dict[str, Any]]
F = TypeVar("F", bound=Callable[..., Any])

# (the task scorers and `default`, which dispatches by data source, register from modules of their own)
REWARD_FNS = Registry(
    "reward function",
    ("prompt", "response", "ground_truth", "extra"),
    builtins=("verl.reward.task_scorers", "verl.reward.dispatch"),
)

CONFIG_KEY = "reward.fn"


def register_reward(name: str) -> Callable[[F], F]:
    """Decorator: make `fn` available as `reward.fn: <name>` in a recipe."""

    return REWARD_FNS.register(name)


def get_reward_fn(spec: str | Mapping | RewardFn, *, key: str = CONFIG_KEY) -> RewardFn:
    """The reward function `spec` names: a registered name, {_target_: pkg.mod.fn, **kwargs}, or a callable.

    Mapping kwargs are bound to the function (functools.partial); `_target_` may also be a registered name
    ({_target_: gsm8k, flexible: true}). With `_partial_: false` the target is called with the kwargs
    and its result is the reward function (a factory, or a class whose instances score).
    """
    if isinstance(spec, str):
        fn = _registered(spec, key)
    elif isinstance(spec, Mapping):  # DictConfig is one too
        fn = _from_mapping(spec, key)
    elif callable(spec):
        fn = spec
    else:
        raise _error(
            key,
            f"expected a registered name, a {{_target_: ...}} mapping or a callable, got {type(spec).__name__}",
            f"set {key} to one of {_names()}, or to {{_target_: pkg.module.fn}}",
        )
    _check_signature(fn, key)
    return fn


def _registered(name: str, key: str) -> RewardFn:
    if name in REWARD_FNS:
        return REWARD_FNS.get(name)
    close = difflib.get_close_matches(name, REWARD_FNS.names(), n=1)
    hint = f"did you mean '{close[0]}'? " if close else ""
    raise _error(
        key,
        f"unknown reward function '{name}'",
        f"{hint}registered: {_names()}; or write {{_target_: pkg.module.fn}} for your own",
    )


def _from_mapping(spec: Any, key: str) -> RewardFn:
    spec = dict(spec)
    target = spec.get("_target_")
    if isinstance(target, str) and "." not in target and ":" not in target:
        spec["_target_"] = _registered(target, f"{key}._target_")
    spec.setdefault("_partial_", True)
    fn = instantiate(spec, key=key)
    if not callable(fn):
        raise _error(key, f"{_describe(target)} returned {type(fn).__name__}, not a callable", "return a function")
    return fn


def _check_signature(fn: RewardFn, key: str) -> None:
    """Fail at load time, not on the first batch, when `fn` cannot take (prompt, response, ground_truth, extra)."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # builtins without a signature: the first call will tell
        return
    try:
        signature.bind("prompt", "response", "ground_truth", {})
    except TypeError as e:
        raise _error(
            key,
            f"{_describe(fn)}{signature} cannot be called as fn(prompt, response, ground_truth, extra) ({e})",
            "give it the signature (prompt: str, response: str, ground_truth: str, extra: dict) -> float | dict",
        ) from None


def is_sequence_reward(fn: Any) -> bool:
    """Whether `fn` scores whole token sequences, fn(input_ids, attention_mask) -> Tensor[B] (a callable whose
    parameters are named so), rather than texts, fn(prompt, response, ground_truth, extra)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return callable(fn) and "input_ids" in params and "attention_mask" in params


def _names() -> str:
    return ", ".join(REWARD_FNS.names())


def _describe(fn: Any) -> str:
    fn = getattr(fn, "func", fn)  # functools.partial
    module = getattr(fn, "__module__", None)
    name = getattr(fn, "__qualname__", None) or repr(fn)
    return f"{module}.{name}" if module else name


def _error(key: str, message: str, fix: str) -> ConfigError:
    return ConfigError([ConfigProblem(key, message, fix=fix)])


# ---------------------------------------------------------------------------- built-ins


@register_reward("arithmetic")
def arithmetic(prompt: str, response: str, ground_truth: str, extra: dict) -> float:
    """1.0 when the response's first line, stripped, is exactly the ground truth; else 0.0."""
    lines = response.strip().split("\n", 1)
    return 1.0 if lines[0].strip() == str(ground_truth).strip() else 0.0


@register_reward("gsm8k")
def gsm8k(
    prompt: str, response: str, ground_truth: str, extra: dict, *, flexible: bool = False, format_score: float = 0.0
) -> float:
    """1.0 when the number after the last "####" equals the ground truth, `format_score` when it differs.

    flexible=True falls back to the last number in the response when it has no "####" answer.
    Numbers compare exactly ("1,000" == "1000" == "1000.0"). No answer found scores 0.0.
    """
    ground_truth = str(ground_truth)
    expected = parse_number(gsm8k_answer(ground_truth) or ground_truth)
    if expected is None:
        raise ValueError(f"gsm8k ground truth {ground_truth!r} is not a number")
    answer = gsm8k_answer(response)
    if answer is None and flexible:
        answer = last_number(response)
    if answer is None:
        return 0.0
    value = parse_number(answer)
    if value is None:
        return 0.0
    return 1.0 if value == expected else float(format_score)


@register_reward("math_boxed")
def math_boxed(prompt: str, response: str, ground_truth: str, extra: dict, *, format_score: float = 0.0) -> float:
    r"""1.0 when the last \boxed{...} equals the ground truth after normalisation; `format_score` when it differs.

    A ground truth that itself holds a \boxed{...} (a full MATH solution) is reduced to that box first.
    See `verl.reward.answers.normalize_math_answer` for what counts as equal.
    """
    reference = last_boxed(ground_truth)
    reference = str(ground_truth) if reference is None else reference
    answer = last_boxed(response)
    if answer is None:
        return 0.0
    return 1.0 if math_answers_equal(answer, reference) else float(format_score)


@register_reward("episode_return")
def episode_return(prompt: str, response: str, ground_truth: str, extra: dict, *, discount: float = 1.0) -> float:
    """An agent episode's return: the sum of its per-turn rewards (env_agent's step rewards), the k-th turn's
    weighted by discount**k."""
    agent = extra.get("agent")
    if agent is None:
        raise ValueError(
            "episode_return scores agent episodes, and this sample has none: set rollout.agent.loop "
            "(env_agent records the environment's step rewards)"
        )
    return float(sum(r * discount**k for k, r in enumerate(agent.get("turn_rewards") or [])))
