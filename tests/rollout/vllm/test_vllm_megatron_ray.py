"""The flagship pairing of recipes/grpo_llama3_8b on CPU: a megatron actor (TP=2 over two Ray workers) with vLLM
generating beside it (one TP=1 engine per rank). After each update the actor's TP shards are assembled into
Hugging Face tensors and loaded into vLLM in place; vLLM's log-probs then equal the trainer's on the sampled tokens
(the mismatch gate), and the weight check finds every readable parameter as sent."""

from __future__ import annotations

import pytest

from tests.support.fixtures import ray_two_cpus  # noqa: F401
from tests.support.run_configs import ODD_LENGTH_REWARD, fit, tiny_config

pytestmark = pytest.mark.slow  # the fast tier skips this file (tagged "slow" in tests/rollout/vllm/BUILD too)


@pytest.fixture(autouse=True)
def _cache(embedded_cache, monkeypatch):  # noqa: F811
    monkeypatch.setenv("VERL_CACHE", embedded_cache)


def test_megatron_tp2_actor_with_vllm_rollouts(ray_two_cpus, tmp_path):  # noqa: F811
    cfg = tiny_config(
        "grpo_tiny_megatron",
        str(tmp_path),
        "rollout.backend=vllm",
        "rollout.n=4",
        "actor.tis_imp_ratio_cap=2.0",
        ODD_LENGTH_REWARD,  # spread on an untrained model, so every update moves the weights
        steps=3,
    )
    summary, rows = fit(cfg)
    assert summary["steps"] == 3
    model_bytes = 808_832 * 4  # embedded:tiny-llama in fp32: each of the two ranks loads every tensor
    for row in rows:
        assert row["perf/weight_sync_bytes"] == 2 * model_bytes
        assert row["perf/weight_sync_comm_bytes"] > 0  # the TP=2 shards exchanged to assemble each tensor
        assert row["rollout/logprob_diff_max"] < 1e-4, row["rollout/logprob_diff_max"]
        assert row["weight_sync/checked_params"] == 2 * 11  # per engine: embedding, head, norms (CPU build)
    assert rows[-1]["actor/grad_norm"] > 0
