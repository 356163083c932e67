"""trainer.mode=async with a vLLM replica over two GPUs (one engine at TP=2, the rollout service mirrored on its
second rank: verl.workers.replica_mirror), fed by a one-GPU FSDP actor, through Ray. Needs 3 CUDA devices."""

from __future__ import annotations

import pytest
import torch

from tests.support.fixtures import embedded_cache  # noqa: F401
from tests.support.run_configs import ODD_LENGTH_REWARD, fit, tiny_config

pytestmark = pytest.mark.skipif(
    torch.cuda.device_count() < 3, reason=f"needs 3 CUDA devices, found {torch.cuda.device_count()}"
)


@pytest.fixture(autouse=True)
def _cache(embedded_cache, monkeypatch):  # noqa: F811
    monkeypatch.setenv("VERL_CACHE", embedded_cache)


def test_async_mode_serves_from_a_vllm_tp2_replica_on_gpus(tmp_path):
    import ray

    from verl.controller import init_ray

    init_ray(num_gpus=3)
    try:
        cfg = tiny_config(
            "grpo_tiny_vllm",
            str(tmp_path),
            "placement.device=cuda",
            "placement.devices_per_node=3",
            "placement.pools=[{name: train, roles: [actor], devices: 1}, {name: gen, roles: [rollout], devices: 2}]",
            "rollout.parallel.tp=2",
            "trainer.mode=async",
            "trainer.max_staleness=1",
            "actor.tis_imp_ratio_cap=2.0",
            "rollout.n=4",
            ODD_LENGTH_REWARD,
            steps=3,
        )
        summary, rows = fit(cfg)
    finally:
        ray.shutdown()
    assert summary["steps"] == 3
    assert all(row["rollout/replicas"] == 1 for row in rows)
    assert rows[0]["async/staleness_max"] == 0 and rows[0]["rollout/logprob_diff_max"] < 1e-2  # bf16 on GPU
    assert all(row["weight_sync/unchecked_params"] == 0 for row in rows)  # every vLLM parameter readable on GPU
