"""A rollout on a pool of its own: weights move pool to pool over the transfer group, bitwise; one_step_off
generates the next batch beside the update, its samples one update old, and resumes exactly.

Real Ray actors (2 FSDP actor ranks + 2 hf rollout ranks, or one of each), real gloo groups."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch

from tests.support.run_configs import ODD_LENGTH_REWARD, tiny_config
from verl.trainer.ppo import PPOTrainer
from verl.workers.actor_rollout_ref import ActorRolloutRefWorker
from verl.workers.rollout import RolloutWorker

pytestmark = pytest.mark.slow  # the fast tier skips this file (tagged "slow" in tests/BUILD too)

FOUR_RANKS = (
    "placement.devices_per_node=4",
    "placement.pools=[{name: train, roles: [actor], devices: 2}, {name: gen, roles: [rollout], devices: 2}]",
)


def _config(out, *overrides, steps=2):
    return tiny_config(
        "grpo_tiny_async",
        str(out),
        ODD_LENGTH_REWARD,
        "rollout.n=4",
        "checkpoint.save_last=false",
        *overrides,
        steps=steps,
    )


def _same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name


def test_weights_reach_every_rollout_rank_bitwise(tmp_path, ray_four_cpus, embedded_cache, monkeypatch):
    """FSDP at world size 2 -> two hf rollout replicas: after each step's sync both hold the actor's weights, each
    FSDP rank having sent its own rows.
    (trainer.mode=sync syncs the same way: tests/megatron/test_weight_transfer_ray.py runs it.)"""
    monkeypatch.setenv("VERL_CACHE", embedded_cache)
    with PPOTrainer(_config(tmp_path, *FOUR_RANKS, "rollout.weight_sync_bucket_mb=1")) as trainer:
        start = trainer.workers.rollout.call(RolloutWorker.rollout_state)
        for step in range(2):
            metrics = trainer.train_step()
            trainer.step += 1
            actor = trainer.workers.actor_rollout.call(ActorRolloutRefWorker.actor_state)[0]
            for rollout in trainer.workers.rollout.call(RolloutWorker.rollout_state):
                _same(rollout, actor)
            assert trainer.workers.rollout.call(RolloutWorker.weight_version) == [step + 1, step + 1]
            size = sum(t.numel() * t.element_size() for t in actor.values())
            assert metrics["perf/weight_sync_bytes"] == size
            # each FSDP rank sends its own rows of every tensor (no gather): about half the model each
            assert 0.4 * size < metrics["perf/weight_sync_max_sender_bytes"] < 0.6 * size
            assert metrics["perf/weight_sync_buckets"] >= -(-size // (1 << 20)) >= 2  # 1 MiB buckets, ~3 MB model
            assert metrics["rollout/weight_version"] == step + 1
            assert metrics["weight_sync/checked_params"] == 2 * len(actor)  # both replicas, every parameter
            assert 0 < metrics["perf/train_busy_fraction"] <= 1 and 0 < metrics["perf/rollout_busy_fraction"] <= 1
        assert any(not torch.equal(actor[k], start[0][k]) for k in actor)  # training moved them


def test_one_step_off_trains_on_samples_one_update_old(tmp_path, ray_four_cpus, embedded_cache, monkeypatch):
    monkeypatch.setenv("VERL_CACHE", embedded_cache)
    with PPOTrainer(_config(tmp_path, "actor.recompute_old_log_probs=always", steps=3)) as trainer:
        trainer.fit()
    rows = [json.loads(line) for line in open(os.path.join(tmp_path, "logs", "metrics.jsonl"))]
    assert [r["async/staleness_max"] for r in rows] == [0.0, 1.0, 1.0]
    # Step 1 trains on samples of the weights it starts from: the rollout's log-probs are the trainer's exactly
    # (weights bitwise the same, the same kernels); later steps' samples are one update old, so they differ.
    assert rows[0]["rollout/logprob_diff_max"] < 1e-5
    assert all(r["rollout/logprob_diff_max"] > 1e-4 for r in rows[1:])
    assert [r["rollout/weight_version"] for r in rows] == [1.0, 2.0, 3.0]


def _final_weights(cfg) -> dict:
    with PPOTrainer(cfg) as trainer:
        trainer.fit()
        return trainer.workers.actor_rollout.call(ActorRolloutRefWorker.actor_state)[0]


def test_one_step_off_resumes_exactly(tmp_path, ray_four_cpus, embedded_cache, monkeypatch):
    """4 steps straight vs the same run continued from its step-2 checkpoint: bitwise the same weights. The
    checkpoint holds the batch generated for step 3 (by step 1's weights) and the rollout's sampler state."""
    monkeypatch.setenv("VERL_CACHE", embedded_cache)
    save = ("checkpoint.save_every=2", "checkpoint.keep_last=2")
    straight = _final_weights(_config(tmp_path / "straight", *save, steps=4))
    resumed = tmp_path / "resumed"
    shutil.copytree(tmp_path / "straight" / "checkpoints" / "step_2", resumed / "checkpoints" / "step_2")
    state = torch.load(resumed / "checkpoints" / "step_2" / "trainer_state.pt", weights_only=True)
    assert state["ahead"] is not None and len(state["ahead"]["tensors"]["responses"]) == 4 * 4
    _same(_final_weights(_config(resumed, *save, steps=4)), straight)
