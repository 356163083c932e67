"""`reward.fn: default`: each sample scored by the scorer its `data_source` names, so one run can mix data sets.

The table below maps the data sources `verl data prepare` writes (and the names data sets are published under) to
registered scorers; `register_source` adds one. A source like "reasoning_gym/chain_sum" falls back to the entry
of its prefix ("reasoning_gym/*")."""

from __future__ import annotations

from typing import Any, Callable

from verl.registry import Registry
from verl.reward.functions import REWARD_FNS, register_reward

SOURCE_SCORERS = Registry("data source scorer", ("prompt", "response", "ground_truth", "extra"))

# data source -> the registered reward function that scores it
DEFAULT_SCORERS = {
    "openai/gsm8k": "gsm8k",
    "gsm8k": "gsm8k",
    "lighteval/MATH": "math_verify",
    "hendrycks/competition_math": "math_verify",
    "HuggingFaceH4/MATH-500": "math_verify",
    "math": "math_verify",
    "BytedTsinghua-SIA/DAPO-Math-17k": "math_verify",
    "math_dapo": "math_verify",
    "multiple_choice": "multiple_choice",
    "cais/mmlu": "multiple_choice",
    "Idavidrein/gpqa": "multiple_choice",
    "reasoning_gym/*": "reasoning_gym",
    "mbpp": "code_tests",
    "google-research-datasets/mbpp": "code_tests",
    "hiyouga/geometry3k": "math_boxed",
    "embedded/arithmetic": "arithmetic",
    "embedded/shapes": "arithmetic",  # (the first line, exactly the count)
}


def register_source(source: str, scorer: str | Callable[..., Any]) -> None:
    """Score rows of `source` ("name", or "prefix/*" for every "prefix/...") with a registered reward function's
    name or a function of the reward signature."""
    fn = REWARD_FNS.get(scorer, key="reward.fn") if isinstance(scorer, str) else scorer
    SOURCE_SCORERS.register(source)(fn)


def scorer_for(source: str) -> Callable[..., Any]:
    """The scorer of `source`: its own entry, else its prefix's ("reasoning_gym/*"), else an error listing them."""
    if source in SOURCE_SCORERS:
        return SOURCE_SCORERS.get(source)
    prefix = source.split("/", 1)[0] + "/*"
    if "/" in source and prefix in SOURCE_SCORERS:
        return SOURCE_SCORERS.get(prefix)
    raise ValueError(
        f"reward.fn=default has no scorer for data_source {source!r}; it knows {', '.join(SOURCE_SCORERS.names())}. "
        "Set reward.fn to a scorer, or register one: verl.reward.dispatch.register_source(source, scorer) in a "
        "trainer.plugins module"
    )


@register_reward("default")
def default(prompt: str, response: str, ground_truth: str, extra: dict) -> Any:
    """The scorer that the sample's data_source names (`DEFAULT_SCORERS`, `register_source`)."""
    return scorer_for(str(extra.get("data_source", "")))(prompt, response, ground_truth, extra)


for _source, _scorer in DEFAULT_SCORERS.items():
    register_source(_source, _scorer)
