"""vLLM beside a 2-rank FSDP actor, through Ray workers. With rollout tp=2 one vLLM engine spans both ranks (vLLM's
external launcher over the workers' gloo group) and both ranks get the same prompts; with tp=1 each rank runs its
own engine on half of the prompts. Either way the weights synced after each update are the actor's: vLLM's
log-probs equal the trainer's on the sampled tokens."""

from __future__ import annotations

import pytest

from tests.support.fixtures import ray_two_cpus  # noqa: F401
from tests.support.run_configs import ODD_LENGTH_REWARD, fit, tiny_config

pytestmark = pytest.mark.slow  # the fast tier skips this file (tagged "slow" in tests/rollout/vllm/BUILD too)


@pytest.fixture(autouse=True)
def _cache(embedded_cache, monkeypatch):  # noqa: F811
    monkeypatch.setenv("VERL_CACHE", embedded_cache)


@pytest.mark.parametrize("tp", [2, 1])
def test_vllm_generates_for_a_two_rank_fsdp_actor(ray_two_cpus, tmp_path, tp):  # noqa: F811
    cfg = tiny_config(
        "grpo_tiny_vllm",
        str(tmp_path),
        "placement.devices_per_node=2",
        f"rollout.parallel.tp={tp}",
        "rollout.n=4",
        ODD_LENGTH_REWARD,
        steps=2,
    )
    summary, rows = fit(cfg)
    assert summary["steps"] == 2
    model_bytes = 808_832 * 4
    for row in rows:
        assert row["perf/weight_sync_bytes"] == 2 * model_bytes  # each rank streams every tensor into its engine
        assert row["rollout/logprob_diff_max"] < 1e-4, row["rollout/logprob_diff_max"]
        # Every sync is checked per engine (verl.workers.weight_check): the embedding and head (vocabulary shards at
        # tp=2), the 9 norms (whole on each rank); the 16 linear weights the CPU build keeps only packed are not.
        engines = 2 // tp
        assert row["weight_sync/checked_params"] == 11 * engines
        assert row["weight_sync/unchecked_params"] == 16 * engines
