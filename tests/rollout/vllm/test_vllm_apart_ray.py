"""vLLM with tp=2 on a pool of its own (two ranks, one engine over vLLM's external launcher), fed by a one-rank
FSDP actor on another pool over the transfer group: both vLLM ranks receive every tensor and slice their own
shard while loading. In sync mode the samples are on-policy, so vLLM's log-probs equal the trainer's only if the
weights arrived exactly."""

from __future__ import annotations

import pytest

from tests.support.run_configs import ODD_LENGTH_REWARD, fit, tiny_config

pytestmark = pytest.mark.slow  # the fast tier skips this file (tagged "slow" in tests/rollout/vllm/BUILD too)


@pytest.fixture(autouse=True)
def _cache(embedded_cache, monkeypatch):  # noqa: F811
    monkeypatch.setenv("VERL_CACHE", embedded_cache)


def test_vllm_tp2_on_its_own_pool_generates_with_the_actors_weights(ray_three_cpus, tmp_path):
    cfg = tiny_config(
        "grpo_tiny_vllm",
        str(tmp_path),
        "placement.devices_per_node=3",
        "placement.pools=[{name: train, roles: [actor], devices: 1}, {name: gen, roles: [rollout], devices: 2}]",
        "rollout.parallel.tp=2",
        "rollout.n=4",
        ODD_LENGTH_REWARD,
        steps=2,
    )
    summary, rows = fit(cfg)
    assert summary["steps"] == 2
    for row in rows:
        assert row["perf/weight_sync_bytes"] == 808_832 * 4  # embedded:tiny-llama in fp32, sent once to both ranks
        assert row["rollout/weight_version"] == row["step"]
        assert row["rollout/logprob_diff_max"] < 1e-4, row["rollout/logprob_diff_max"]
    assert rows[-1]["actor/grad_norm"] > 0
