"""The vllm and sglang rollout engines on CUDA: the same rollout contract as on CPU (tests/rollout/engine_contract.py).

Skipped without CUDA, and per engine when its library is not installed (CUDA builds of vLLM and SGLang live
in a GPU machine's environment, not in this repository's CPU resolves). On GPU the sleep/wake cycle really
frees and restores the KV cache and the weights.
"""

from __future__ import annotations

import pytest
import torch

from tests.rollout import engine_contract as contract
from tests.support.engines import cuda_world_one, make_llama_dir  # noqa: F401
from tests.support.fixtures import embedded_cache  # noqa: F401

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
# fp32 on GPU: the engines' kernels reduce in another order than torch's (and may use TF32).
GPU_TOL = 1e-3


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory) -> str:
    return make_llama_dir(str(tmp_path_factory.mktemp("llama")), hidden_size=128, head_dim=64)


@pytest.fixture(scope="module", params=["vllm", "sglang"])
def rollout(request, cuda_world_one, llama_dir):  # noqa: F811
    pytest.importorskip(request.param, reason=f"{request.param} is not installed")
    from verl.config.schema import RolloutConfig

    if request.param == "vllm":
        from verl_rollout.vllm import VLLMRollout as cls
    else:
        from verl_rollout.sglang import SGLangRollout as cls
    from verl.engine_protocol import RolloutSettings

    cfg = RolloutConfig(temperature=1.0, gpu_memory_utilization=0.2, free_cache_engine=True)
    # (the engines take their settings as one RolloutSettings: keyword arguments here would fail at construction)
    return cls(cfg, model_path=llama_dir, settings=RolloutSettings(**contract.SETTINGS, device="cuda", dtype="float32"))


def test_generate_layout(rollout):
    contract.check_layout(rollout)


def test_eos_ends_the_mask_and_is_included(rollout):
    contract.check_eos_ends_the_mask(rollout)


def test_greedy_is_deterministic_and_sampling_varies(rollout):
    contract.check_greedy_and_sampling(rollout)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_log_probs_match_the_fsdp_actor(rollout, llama_dir, temperature):
    contract.check_log_probs_match_the_actor(rollout, llama_dir, temperature, device="cuda", tol=GPU_TOL)


def test_weight_sync_follows_the_actor(rollout, llama_dir):
    contract.check_weight_sync_follows_the_actor(rollout, llama_dir, device="cuda", tol=GPU_TOL)


def test_sleep_frees_memory_and_the_cycle_generates(rollout, llama_dir):
    torch.cuda.synchronize()
    before = torch.cuda.mem_get_info()[0]
    rollout.sleep()
    torch.cuda.synchronize()
    freed = torch.cuda.mem_get_info()[0] - before
    assert freed > 0, "sleep released no GPU memory"
    with pytest.raises(RuntimeError, match="update_weights"):  # the weights were discarded: sync first
        rollout.generate(contract.prompts(), n=1)
    contract.check_sleep_then_sync_then_generate(rollout, llama_dir, device="cuda", tol=GPU_TOL)


@pytest.fixture(scope="module")
def vllm_lora_rollout(cuda_world_one, llama_dir):  # noqa: F811
    """vLLM serving a LoRA actor's adapters (rollout.lora_sync: adapter) on the base weights it loaded."""
    pytest.importorskip("vllm", reason="vllm is not installed")
    from verl.config.schema import RolloutConfig
    from verl.engine_protocol import RolloutSettings
    from verl_rollout.vllm import VLLMRollout

    cfg = RolloutConfig(temperature=1.0, gpu_memory_utilization=0.2, free_cache_engine=True, lora_sync="adapter")
    return VLLMRollout(
        cfg,
        model_path=llama_dir,
        settings=RolloutSettings(**contract.SETTINGS, device="cuda", dtype="float32", lora_rank=8),
    )


def test_vllm_adapter_sync_follows_the_actor_through_sleep(vllm_lora_rollout, llama_dir):
    """Sleep offloads the base weights (they are not re-sent), the adapters alone arrive after each update."""
    contract.check_adapter_sync_follows_the_actor(vllm_lora_rollout, llama_dir, device="cuda", tol=GPU_TOL, rank=8)


def test_weight_check_names_a_tensor_that_never_arrived(rollout, llama_dir):
    """verl.workers.weight_check on GPU, where vLLM keeps every parameter readable (on CPU its linear weights are
    packed away): q_proj lands in the fused qkv_proj, which the check names."""
    if not hasattr(rollout, "weight_fingerprints"):
        pytest.skip(f"{type(rollout).__name__} offers no weight fingerprints (the check skips it)")
    dropped = "model.layers.0.self_attn.q_proj.weight"
    problem = contract.check_weights_verified_after_sync(rollout, llama_dir, dropped, device="cuda")
    assert problem.startswith("model.layers.0.self_attn.qkv_proj.weight on rank(s) 0")


def test_vllm_adapters_that_never_arrived_are_named(vllm_lora_rollout, llama_dir):
    problem = contract.check_adapters_verified_after_load(vllm_lora_rollout, llama_dir, device="cuda", rank=8)
    assert ".lora_" in problem


@pytest.fixture(scope="module")
def moe_dir(embedded_cache) -> str:  # noqa: F811
    from verl.embedded.models import materialize_embedded_model

    return materialize_embedded_model("tiny-qwen3-moe", embedded_cache)


@pytest.fixture(scope="module")
def vllm_moe_rollout(cuda_world_one, moe_dir):  # noqa: F811
    """vLLM serving the embedded tiny Qwen3-MoE (8 experts, top-2), synced under per-expert checkpoint names."""
    pytest.importorskip("vllm", reason="vllm is not installed")
    from verl.config.schema import RolloutConfig
    from verl.engine_protocol import RolloutSettings
    from verl_rollout.vllm import VLLMRollout

    cfg = RolloutConfig(temperature=1.0, gpu_memory_utilization=0.2, free_cache_engine=True)
    return VLLMRollout(
        cfg, model_path=moe_dir, settings=RolloutSettings(**contract.SETTINGS, device="cuda", dtype="float32")
    )


def test_vllm_mixture_of_experts_log_probs_and_weight_sync_follow_the_actor(vllm_moe_rollout, moe_dir):
    """On CPU vLLM's in-place reload of fused experts is refused (it changes them); on GPU it must follow the actor."""
    contract.check_log_probs_match_the_actor(vllm_moe_rollout, moe_dir, 1.0, device="cuda", tol=GPU_TOL)
    contract.check_weight_sync_follows_the_actor(vllm_moe_rollout, moe_dir, device="cuda", tol=GPU_TOL)


def test_vllm_returns_the_routes_the_megatron_actor_replays(cuda_world_one, moe_dir):  # noqa: F811
    """Routing replay R3 through vLLM (its model runner V2 returns each sample's routed experts): the experts are
    HF's top-k at the positions vLLM computed, and the megatron actor routed to them gives vLLM's log-probs."""
    pytest.importorskip("vllm", reason="vllm is not installed")
    import types

    from tests.support.megatron_workers import hf_routes
    from verl.config.schema import RolloutConfig
    from verl.engine_protocol import EngineConfig, RolloutSettings
    from verl_megatron.engine import MegatronEngine
    from verl_rollout.vllm import VLLMRollout

    settings = RolloutSettings(**contract.SETTINGS, device="cuda", dtype="float32", routes=True)
    rollout = VLLMRollout(
        RolloutConfig(temperature=1.0, gpu_memory_utilization=0.2), model_path=moe_dir, settings=settings
    )
    batch = rollout.generate(contract.prompts(), n=2, temperature=1.0)
    routes = batch.batch["routed_experts"]
    real = batch.batch["attention_mask"].bool()
    computed = (routes[..., 0, 0] >= 0) & real
    assert float(computed.sum()) >= float(real.sum()) - len(real)  # every real token but (at most) each row's last
    same = (routes.sort(dim=-1).values.long() == hf_routes(moe_dir, batch)).all(-1).all(-1)[computed]
    print(f"vLLM routes equal HF's top-k at {float(same.float().mean()):.4f} of the computed positions")
    assert float(same.float().mean()) > 0.95  # (GPU kernels may part near-ties)
    parallel = types.SimpleNamespace(tp=1, pp=1, vpp=None, cp=1, ep=1, dp=None)
    actor = MegatronEngine(EngineConfig(model_path=moe_dir, device="cuda", dtype="float32", parallel=parallel))
    mask = batch.batch["response_mask"].bool()
    replayed = actor.infer(batch, micro_batch_size=6, replay=True).batch["log_probs"]
    gap = float((replayed - batch.batch["rollout_log_probs"]).abs()[mask].max())
    print(f"max |megatron replaying vLLM's routes - vLLM| log-prob: {gap:.2e}")
    assert gap < GPU_TOL


def test_vllm_weight_check_follows_experts_into_their_fused_parameters(vllm_moe_rollout, moe_dir):
    """Each expert's checkpoint tensors land in the layer's fused w13 / w2: an expert that never arrived is named."""
    dropped = "model.layers.0.mlp.experts.3.up_proj.weight"
    problem = contract.check_weights_verified_after_sync(vllm_moe_rollout, moe_dir, dropped, device="cuda")
    assert problem.startswith("model.layers.0.mlp.experts.w13_weight on rank(s) 0")
