"""grpo_tiny_vllm through the trainer in local mode: the actor trains with FSDP, vLLM generates, and after each
update the weights go into vLLM in place; the mismatch metric and truncated importance sampling use its log-probs."""

from __future__ import annotations

import pytest

from tests.support.run_configs import ODD_LENGTH_REWARD, fit, tiny_config

pytestmark = pytest.mark.slow  # the fast tier skips this file (tagged "slow" in tests/rollout/vllm/BUILD too)


@pytest.fixture(autouse=True)
def _cache(embedded_cache, monkeypatch):  # noqa: F811
    monkeypatch.setenv("VERL_CACHE", embedded_cache)


def test_vllm_rollout_trains_syncs_and_reports_the_mismatch(tmp_path):
    cfg = tiny_config(
        "grpo_tiny_vllm",
        str(tmp_path),
        "trainer.controller=local",
        "rollout.n=4",
        "actor.tis_imp_ratio_cap=2.0",
        ODD_LENGTH_REWARD,  # spread on an untrained model, so the update moves the weights
        steps=3,
    )
    summary, rows = fit(cfg)
    assert summary["steps"] == 3
    model_bytes = 808_832 * 4  # embedded:tiny-llama, fp32: every tensor goes into vLLM after every update
    for row in rows:
        assert row["perf/weight_sync_bytes"] == model_bytes
        assert row["timing/weight_sync_s"] > 0
        assert row["weight_sync/checked_params"] > 0  # every sync checked (the CPU build's linear weights: not)
        # vLLM's log-probs of what it sampled equal the FSDP actor's (fp32): generation used the synced weights.
        assert row["rollout/logprob_diff_max"] < 1e-4, row["rollout/logprob_diff_max"]
        assert row["actor/tis_weight_mean"] == pytest.approx(1.0, abs=1e-3)
    assert rows[-1]["actor/grad_norm"] > 0


def test_lora_adapters_alone_reach_vllm_after_every_update(tmp_path):
    """grpo_tiny_lora_vllm with rollout.lora_sync=adapter: each sync moves the adapters alone (rank 16 on every
    linear of the tiny model), and vLLM, serving them on its base weights, samples with the actor's policy."""
    cfg = tiny_config(
        "grpo_tiny_lora_vllm",
        str(tmp_path),
        "trainer.controller=local",
        "rollout.n=4",
        "rollout.lora_sync=adapter",
        "actor.optim.lr=1e-2",
        ODD_LENGTH_REWARD,
        steps=3,
    )
    summary, rows = fit(cfg)
    assert summary["steps"] == 3
    # A and B of q, k, v, o, gate, up, down in 4 layers (hidden 128, 2 of 4 heads for k/v, mlp 384), fp32
    adapter_bytes = 4 * 16 * 4 * (2 * (128 + 128) + 2 * (128 + 64) + 3 * (128 + 384))
    for row in rows:
        assert row["perf/weight_sync_bytes"] == adapter_bytes
        assert row["weight_sync/checked_params"] > 0 and row["weight_sync/unchecked_params"] == 0  # every matrix
        assert row["rollout/logprob_diff_max"] < 1e-4, row["rollout/logprob_diff_max"]
    assert rows[-1]["actor/grad_norm"] > 0
