"""A megatron actor split TP=2 over its own pool feeds an hf rollout pool of two replicas over the transfer group,
each actor rank sending its own half of every split tensor: after every step both rollout ranks hold the actor's
weights (in Hugging Face names) bitwise."""

from __future__ import annotations

import pytest
import torch

from tests.support.run_configs import ODD_LENGTH_REWARD, tiny_config
from verl.trainer.ppo import PPOTrainer
from verl.workers.actor_rollout_ref import ActorRolloutRefWorker
from verl.workers.rollout import RolloutWorker

pytestmark = pytest.mark.slow  # the fast tier skips this file (tagged "slow" in tests/BUILD too)


def test_megatron_tp2_weights_reach_both_rollout_replicas_bitwise(tmp_path, ray_four_cpus, embedded_cache, monkeypatch):
    """trainer.mode=sync: generate on the rollout's pool, train, sync (one_step_off: tests/e2e/test_disaggregated)."""
    monkeypatch.setenv("VERL_CACHE", embedded_cache)
    cfg = tiny_config(
        "grpo_tiny_megatron",
        str(tmp_path),
        ODD_LENGTH_REWARD,
        "rollout.n=4",
        "checkpoint.save_last=false",
        "placement.devices_per_node=4",
        "placement.pools=[{name: train, roles: [actor, ref], devices: 2}, {name: gen, roles: [rollout], devices: 2}]",
        "trainer.mode=sync",
    )
    with PPOTrainer(cfg) as trainer:
        assert trainer.plan.layout("actor").tp == 2 and trainer.plan.layout("rollout").dp == 2
        for step in range(2):
            metrics = trainer.train_step()
            trainer.step += 1
            actor = trainer.workers.actor_rollout.call(ActorRolloutRefWorker.actor_state)[0]
            states = trainer.workers.rollout.call(RolloutWorker.rollout_state)
            assert len(states) == 2
            for state in states:
                assert state.keys() == actor.keys()
                for name in actor:
                    assert torch.equal(state[name], actor[name]), name
            assert metrics["rollout/weight_version"] == step + 1
            assert metrics["perf/weight_sync_bytes"] == sum(t.numel() * t.element_size() for t in actor.values())
            # each rank sent its own TP half (norms from tp rank 0): nothing gathered on the actor's side
            assert metrics["perf/weight_sync_comm_bytes"] == 0
            assert 0.4 < metrics["perf/weight_sync_max_sender_bytes"] / metrics["perf/weight_sync_bytes"] < 0.6
