"""vLLM on image prompts (CUDA): the embedded tiny Qwen2.5-VL and Qwen3-VL, with vLLM processing each prompt's
images itself from the pictures the rollout rebuilds (verl_rollout.image_requests). Sampled responses' log-probs
equal the FSDP actor's on the same rows (the image pixels vLLM computed on are the actor's), before and after a
weight sync of the language and vision weights; image markers are never sampled.

Skipped without CUDA or without vLLM (its vision-language models import torchvision, which the CPU build here
lacks: tests/rollout/vllm/test_vllm_rollout.py checks that refusal)."""

from __future__ import annotations

import gc

import pytest
import torch
from transformers import AutoTokenizer

from tests.support.engines import cuda_world_one  # noqa: F401
from tests.support.fixtures import embedded_cache  # noqa: F401
from tests.support.image_batches import image_batch
from verl.config.schema import OptimConfig, RolloutConfig
from verl.data.vision import vision_token_ids
from verl.embedded.models import materialize_embedded_model
from verl.engine_protocol import EngineConfig, RolloutSettings
from verl.protocol import DataProto

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
GPU_TOL = 1e-3  # (fp32: vLLM's kernels reduce in another order than torch's, and may use TF32)


def _nll(out, mb):
    loss = -out["log_probs"].mean()
    return loss, {"loss": float(loss.detach())}


@pytest.mark.parametrize("name", ["tiny-qwen2.5-vl", "tiny-qwen3-vl"])
def test_vllm_samples_image_prompts_with_the_actors_log_probs(cuda_world_one, embedded_cache, name):  # noqa: F811
    pytest.importorskip("vllm", reason="vllm is not installed")
    from verl_fsdp.engine import FSDPEngine
    from verl_rollout.vllm import VLLMRollout

    folder = materialize_embedded_model(name, embedded_cache)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    settings = RolloutSettings(
        max_new_tokens=8,
        eos_ids=(tokenizer.eos_token_id,),
        pad_id=tokenizer.pad_token_id,
        max_prompt_length=64,
        device="cuda",
        dtype="float32",
    )
    rollout = VLLMRollout(
        RolloutConfig(temperature=1.0, gpu_memory_utilization=0.2), model_path=folder, settings=settings
    )
    optim = OptimConfig(lr=5e-2, weight_decay=0.0)
    actor = FSDPEngine(EngineConfig(model_path=folder, device="cuda", dtype="float32", optim=optim, total_steps=1))
    batch = image_batch(folder, embedded_cache)  # three shapes prompts (one image each) and a text prompt
    width = batch.batch["input_ids"].shape[1] - batch.batch["responses"].shape[1]
    tensors = {k: batch.batch[k][:, :width] for k in ("input_ids", "attention_mask", "position_ids")}
    prompts = DataProto.from_dict(tensors, dict(batch.non_tensor_batch))
    markers = torch.tensor(vision_token_ids(actor.model.config))

    def check(engine: VLLMRollout) -> float:
        out = engine.generate(prompts, n=2)
        assert [bool(m) for m in out.non_tensor_batch["multi_modal_inputs"]] == [1, 1, 1, 1, 0, 0, 1, 1]
        mask = out.batch["response_mask"]
        assert mask.sum() > 8 and not torch.isin(out.batch["responses"], markers).any()
        want = actor.infer(out, micro_batch_size=8).batch["log_probs"]
        diff = float(((want - out.batch["rollout_log_probs"]) * mask).abs().max())
        assert diff < GPU_TOL, diff
        return diff

    before = check(rollout)
    actor.train_step(batch, _nll, micro_batch_size=4)
    moved = rollout.update_weights(actor.weights())
    assert moved == sum(t.numel() * t.element_size() for _, t in actor.weights())  # the vision tower's too
    after = check(rollout)
    print(f"{name}: vLLM vs actor log-probs on image prompts, max |diff| {before:.2e}; after a sync {after:.2e}")
    del rollout
    gc.collect()
    torch.cuda.empty_cache()
