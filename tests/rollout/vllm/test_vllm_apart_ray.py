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


def test_async_mode_serves_requests_from_vllms_own_scheduler(ray_three_cpus, tmp_path):
    """trainer.mode=async with vLLM on a pool of its own: the rollout service steps vLLM's scheduler (continuous
    batching, partial rollouts computed anew under new weights), within the staleness bound."""
    cfg = tiny_config(
        "grpo_tiny_vllm",
        str(tmp_path),
        "placement.devices_per_node=2",
        "placement.pools=[{name: train, roles: [actor], devices: 1}, {name: gen, roles: [rollout], devices: 1}]",
        "trainer.mode=async",
        "trainer.max_staleness=1",
        "actor.tis_imp_ratio_cap=2.0",
        "rollout.n=4",
        ODD_LENGTH_REWARD,
        steps=3,
    )
    summary, rows = fit(cfg)
    assert summary["steps"] == 3
    assert [row["rollout/weight_version"] >= row["step"] - 1 for row in rows] == [True] * 3
    assert all(row["async/staleness_max"] <= 1 for row in rows)
    # the first batch was sampled by the weights the trainer starts from: vLLM's log-probs are the trainer's
    assert rows[0]["async/staleness_max"] == 0 and rows[0]["rollout/logprob_diff_max"] < 1e-4
    assert all(row["perf/rollout_tokens_per_s"] > 0 for row in rows)


def test_async_mode_serves_from_a_tp2_replica(ray_three_cpus, tmp_path):
    """trainer.mode=async with one vLLM engine over two ranks: the replica's first rank runs the service and sends
    each of its engine calls to the second (verl.workers.replica_mirror), so both step vLLM's scheduler in lockstep;
    weight syncs land between the same two steps on both ranks, and the weight check reads both shards."""
    cfg = tiny_config(
        "grpo_tiny_vllm",
        str(tmp_path),
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
    assert summary["steps"] == 3
    assert all(row["rollout/replicas"] == 1 for row in rows)  # one engine over the pool's two ranks
    assert all(row["async/staleness_max"] <= 1 for row in rows)
    assert all(row["rollout/weight_version"] >= row["step"] - 1 for row in rows)
    # the first batch was sampled by the weights the trainer starts from, by both shards of the engine
    assert rows[0]["async/staleness_max"] == 0 and rows[0]["rollout/logprob_diff_max"] < 1e-4
    assert all(row["weight_sync/checked_params"] > 0 for row in rows)
    assert all(row["perf/rollout_tokens_per_s"] > 0 for row in rows)
