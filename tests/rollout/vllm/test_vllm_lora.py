"""A LoRA actor's adapters served by vLLM's CPU build (rollout.lora_sync: adapter): after each load vLLM generates
with the trained policy (its log-probs equal the FSDP actor's), reloads replace the adapters in place, and only
the adapters' bytes move. (The merged path is the full-weight sync, tests/rollout/vllm/test_vllm_rollout.py, fed
`weights()`, whose merge tests/fsdp/test_lora.py checks against plain transformers and peft.)

Runs in the Pants resolve `vllm`.
"""

from __future__ import annotations

import pytest

from tests.rollout import engine_contract as contract
from tests.support.engines import gloo_world_one  # noqa: F401
from verl.config.schema import ParallelConfig, RolloutConfig
from verl.engine_protocol import RolloutSettings
from verl_rollout.vllm import VLLMRollout, lora_slot

pytestmark = pytest.mark.slow  # the fast tier skips this file (tagged "slow" in tests/rollout/vllm/BUILD too)


@pytest.fixture(scope="module")
def rollout(gloo_world_one, llama_dir):  # noqa: F811
    return VLLMRollout(
        RolloutConfig(temperature=1.0, parallel=ParallelConfig(tp=1), lora_sync="adapter"),
        model_path=llama_dir,
        settings=RolloutSettings(**contract.SETTINGS, lora_rank=8),
    )


def test_before_any_adapter_it_generates_with_the_base(rollout, llama_dir):
    contract.check_log_probs_match_the_actor(rollout, llama_dir, temperature=1.0)


def test_adapter_sync_follows_the_actor(rollout, llama_dir):
    contract.check_adapter_sync_follows_the_actor(rollout, llama_dir, rank=8)


def test_lora_slot_is_the_smallest_rank_vllm_takes():
    assert [lora_slot(r) for r in (1, 4, 8, 9, 64, 300)] == [1, 8, 8, 16, 64, 320]
    with pytest.raises(ValueError, match="up to rank 512"):
        lora_slot(1024)


def test_adapters_that_never_reached_vllm_are_named(rollout, llama_dir):
    problem = contract.check_adapters_verified_after_load(rollout, llama_dir, rank=8)
    assert ".lora_" in problem and "on rank(s) 0" in problem
