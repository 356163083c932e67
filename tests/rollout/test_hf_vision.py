"""The hf rollout on image prompts (the embedded tiny Qwen2.5-VL and Qwen3-VL): sampled responses' log-probs equal the FSDP actor's
on the same rows, colocated (generation on the actor's module) and on a copy of its own after a weight sync (the
checkpoint's names load into the model's renamed parameters); image markers are never sampled."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoTokenizer

from tests.support.engines import gloo_world_one  # noqa: F401
from tests.support.fixtures import embedded_cache  # noqa: F401
from tests.support.image_batches import image_batch
from verl.config.schema import OptimConfig, RolloutConfig
from verl.data.vision import vision_token_ids
from verl.engine_protocol import EngineConfig, RolloutSettings
from verl.protocol import DataProto
from verl_fsdp.engine import FSDPEngine
from verl_rollout.hf import HFRollout

NEW = 8


@pytest.fixture(scope="module", params=["tiny-qwen2.5-vl", "tiny-qwen3-vl"])
def vlm_dir(request, embedded_cache):  # noqa: F811
    from verl.embedded.models import materialize_embedded_model

    return materialize_embedded_model(request.param, embedded_cache)


def _prompts(model_dir: str, cache: str) -> DataProto:
    """The image batch's prompts (three with an image, one text), as the data loader hands them to the rollout."""
    batch = image_batch(model_dir, cache)
    width = batch.batch["input_ids"].shape[1] - batch.batch["responses"].shape[1]
    tensors = {k: batch.batch[k][:, :width] for k in ("input_ids", "attention_mask", "position_ids")}
    return DataProto.from_dict(tensors, dict(batch.non_tensor_batch))


def _rollout(model_dir: str, actor: FSDPEngine | None = None) -> HFRollout:
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    settings = RolloutSettings(max_new_tokens=NEW, eos_ids=(tokenizer.eos_token_id,), pad_id=tokenizer.pad_token_id)
    shared = dict(module=actor.model, gather=actor.gathered) if actor is not None else {}
    return HFRollout(RolloutConfig(temperature=1.0), model_path=model_dir, settings=settings, **shared)


def _check_against_actor(actor: FSDPEngine, rollout: HFRollout, prompts: DataProto) -> DataProto:
    torch.manual_seed(0)
    out = rollout.generate(prompts, n=2)
    assert len(out) == 8 and [bool(m) for m in out.non_tensor_batch["multi_modal_inputs"]] == [1, 1, 1, 1, 0, 0, 1, 1]
    mask = out.batch["response_mask"]
    assert mask.sum() > 8  # (several tokens per row: the comparison covers positions past the first)
    assert not torch.isin(out.batch["responses"], torch.tensor(vision_token_ids(actor.model.config))).any()
    want = actor.infer(out, micro_batch_size=8).batch["log_probs"]
    assert ((want - out.batch["rollout_log_probs"]) * mask).abs().max() < 1e-5
    return out


def test_colocated_image_prompts_sample_with_the_actors_log_probs(gloo_world_one, vlm_dir, embedded_cache):  # noqa: F811
    actor = FSDPEngine(EngineConfig(model_path=vlm_dir, total_steps=1))
    _check_against_actor(actor, _rollout(vlm_dir, actor), _prompts(vlm_dir, embedded_cache))


def test_a_rollout_copy_follows_the_actor_after_a_weight_sync(gloo_world_one, vlm_dir, embedded_cache):  # noqa: F811
    actor = FSDPEngine(EngineConfig(model_path=vlm_dir, optim=OptimConfig(lr=5e-2, weight_decay=0.0), total_steps=1))
    rollout = _rollout(vlm_dir)
    batch = image_batch(vlm_dir, embedded_cache)

    def nll(out, mb):
        loss = -out["log_probs"].mean()
        return loss, {"loss": float(loss.detach())}

    actor.train_step(batch, nll, micro_batch_size=4)
    moved = rollout.update_weights(actor.weights())
    assert moved == sum(p.numel() * 4 for p in rollout.module.parameters())  # every tensor, the vision tower's too
    _check_against_actor(actor, rollout, _prompts(vlm_dir, embedded_cache))


def test_the_rollout_service_continues_image_prompts_turn_by_turn(gloo_world_one, vlm_dir, embedded_cache):  # noqa: F811
    """trainer.mode=async's service on the hf rollout: image prompts as requests, one token a turn (each turn the
    prompt, its images and the tokens so far computed again, as after a weight load); the finished samples'
    log-probs are the actor's on the whole rows."""
    import time

    from verl.rollout_batch import assemble_rollout, pad_rows, unpadded_prompts
    from verl.workers.rollout_server import Request, RolloutServer

    actor = FSDPEngine(EngineConfig(model_path=vlm_dir, total_steps=1))
    rollout = _rollout(vlm_dir)
    prompts = _prompts(vlm_dir, embedded_cache)
    images = prompts.non_tensor_batch["multi_modal_inputs"]
    eos = rollout.eos_ids
    server = RolloutServer(rollout, eos_ids=eos, pad_id=rollout.pad_token_id, max_new_tokens=NEW, chunk=1)
    try:
        torch.manual_seed(0)
        server.submit([Request(str(i), ids, images=images[i]) for i, ids in enumerate(unpadded_prompts(prompts))])
        done, deadline = {}, time.monotonic() + 120
        while len(done) < len(prompts) and time.monotonic() < deadline:
            done.update({f.id: f for f in server.poll(timeout_s=1.0)})
    finally:
        server.close()
    rows = [done[str(i)] for i in range(len(prompts))]
    assert sum(len(f.tokens) for f in rows) > 2 * len(rows)  # (turns past the first: continued with their images)
    batch = assemble_rollout(
        prompts,
        pad_rows([f.tokens for f in rows], NEW, rollout.pad_token_id, torch.long),
        pad_rows([f.log_probs for f in rows], NEW, 0.0, torch.float32),
        torch.tensor([len(f.tokens) for f in rows]),
        eos_ids=eos,
    )
    mask = batch.batch["response_mask"]
    want = actor.infer(batch, micro_batch_size=8).batch["log_probs"]
    assert ((want - batch.batch["rollout_log_probs"]) * mask).abs().max() < 1e-5
