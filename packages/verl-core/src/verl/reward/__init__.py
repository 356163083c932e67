"""Rewards: reward functions (`functions`), answer parsing (`answers`) and batch scoring (`manager`)."""

from verl.reward.functions import REWARD_FNS, get_reward_fn, register_reward
from verl.reward.manager import RewardFunctionError, RewardManager, make_reward_manager

__all__ = [
    "REWARD_FNS",
    "RewardFunctionError",
    "RewardManager",
    "get_reward_fn",
    "make_reward_manager",
    "register_reward",
]
