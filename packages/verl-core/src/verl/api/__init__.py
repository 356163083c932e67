"""Entry points for services around a run: `RewardServer` (external scores over HTTP)."""

from verl.api.reward_server import RewardServer

__all__ = ["RewardServer"]
