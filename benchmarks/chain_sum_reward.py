"""reasoning-gym's chain_sum as a user's own reward module, for both sides of vs_trl.py's real-model run: verl calls
`score` (`reward.fn={_target_: chain_sum_reward.score}`), TRL's GRPOTrainer `trl_reward`. The rule is verl's
reasoning_gym scorer's: the answer is the last line's final clause (after its last "=" or " is "), right when it is
the sum as a number. One function, so both runs score alike (TRL's side has neither verl nor reasoning-gym)."""

from __future__ import annotations

import re


def final_clause(response: str) -> str:
    lines = [line.strip() for line in response.strip().splitlines() if line.strip()]
    clause = re.split(r"=| is ", lines[-1])[-1].strip() if lines else ""
    return clause[:-1].rstrip() if clause.endswith(".") else clause


def score(prompt: str, response: str, ground_truth: str, extra: dict) -> float:
    try:
        return 1.0 if float(final_clause(response).replace(",", "")) == float(ground_truth) else 0.0
    except ValueError:
        return 0.0


def trl_reward(completions: list, ground_truth: list, **_) -> list:
    return [score("", c, g, {}) for c, g in zip(completions, ground_truth)]
