"""The arithmetic task's reward as a user's own module: verl calls it as `reward.fn={_target_: arith_reward.score}`,
TRL's GRPOTrainer through `trl_reward` (its batch signature). One function, so both runs score alike."""

from __future__ import annotations


def score(prompt: str, response: str, ground_truth: str, extra: dict) -> float:
    """1.0 when the response's first line, stripped, is the ground truth."""
    return 1.0 if response.strip().split("\n", 1)[0].strip() == str(ground_truth).strip() else 0.0


def trl_reward(completions: list, ground_truth: list, **_) -> list:
    return [score("", c, g, {}) for c, g in zip(completions, ground_truth)]
