"""vLLM with tensor parallelism 2 beside a 2-rank FSDP actor, through Ray workers: one vLLM engine spans both
ranks (vLLM's external launcher over the workers' gloo group), both ranks get the same prompts, and the weights
synced after each update are the actor's (its log-probs equal the trainer's on the sampled tokens)."""

from __future__ import annotations

import pytest

from tests.fixtures import ray_two_cpus  # noqa: F401
from tests.trainer.run_configs import ODD_LENGTH_REWARD, fit, tiny_config


@pytest.fixture(autouse=True)
def _cache(embedded_cache, monkeypatch):  # noqa: F811
    monkeypatch.setenv("VERL_CACHE", embedded_cache)


def test_vllm_tp2_generates_for_a_two_rank_fsdp_actor(ray_two_cpus, tmp_path):  # noqa: F811
    cfg = tiny_config(
        "grpo_tiny_vllm",
        str(tmp_path),
        "placement.devices_per_node=2",
        "rollout.parallel.tp=2",
        "rollout.n=4",
        ODD_LENGTH_REWARD,
        steps=2,
    )
    summary, rows = fit(cfg)
    assert summary["steps"] == 2
    model_bytes = 808_832 * 4
    for row in rows:
        assert row["perf/weight_sync_bytes"] == 2 * model_bytes  # each rank's shard of the engine loads all
        assert row["rollout/logprob_diff_max"] < 1e-4, row["rollout/logprob_diff_max"]
        # 4 prompts x 4 samples generated once (not once per rank): the batch the actor trained on
        assert row["response_length/mean"] > 0
