"""A vision-language model on the FSDP engine (one gloo rank): log-probs on image prompts equal plain transformers'
on each row alone, left-padded rows and a text row beside them included; a step trains the vision tower too."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForImageTextToText, AutoTokenizer

from tests.support.engines import gloo_world_one  # noqa: F401
from tests.support.fixtures import embedded_cache, tiny_vlm_dir  # noqa: F401
from tests.support.image_batches import R, image_batch
from verl.config.schema import OptimConfig
from verl.engine_protocol import EngineConfig
from verl.protocol import DataProto
from verl_fsdp.engine import FSDPEngine


def _transformers_log_probs(model_dir: str, batch: DataProto) -> torch.Tensor:
    """Each row alone, unpadded, through transformers' model with its own position computation."""
    model = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="sdpa")
    out = []
    for i in range(len(batch)):
        ids = batch.batch["input_ids"][i][batch.batch["attention_mask"][i].bool()][None]
        images = batch.non_tensor_batch["multi_modal_inputs"][i]
        kwargs = {"mm_token_type_ids": (ids == model.config.image_token_id).int(), **images}
        with torch.no_grad():
            logits = model(input_ids=ids, **kwargs).logits[0, -R - 1 : -1]
        out.append(torch.log_softmax(logits.float(), -1).gather(-1, batch.batch["responses"][i][:, None])[:, 0])
    return torch.stack(out)


def test_image_prompt_log_probs_equal_transformers(gloo_world_one, tiny_vlm_dir, embedded_cache):  # noqa: F811
    batch = image_batch(tiny_vlm_dir, embedded_cache)
    assert batch.batch["attention_mask"][2].sum() < batch.batch["attention_mask"][0].sum()  # the text row is padded
    engine = FSDPEngine(EngineConfig(model_path=tiny_vlm_dir, total_steps=1))
    assert type(engine.model).__name__ == "Qwen2_5_VLForConditionalGeneration"
    got = engine.infer(batch, micro_batch_size=4).batch["log_probs"]
    torch.testing.assert_close(got, _transformers_log_probs(tiny_vlm_dir, batch), rtol=0, atol=1e-5)
    by_two = engine.infer(batch, micro_batch_size=2).batch["log_probs"]  # (a micro-batch of text rows only too)
    torch.testing.assert_close(by_two, got, rtol=0, atol=1e-5)


def test_a_step_on_image_prompts_trains_the_vision_tower(gloo_world_one, tiny_vlm_dir, embedded_cache):  # noqa: F811
    batch = image_batch(tiny_vlm_dir, embedded_cache)
    engine = FSDPEngine(
        EngineConfig(model_path=tiny_vlm_dir, optim=OptimConfig(lr=1e-3, weight_decay=0.0), total_steps=1)
    )
    before = {name: t.clone() for name, t in engine.weights()}

    def nll(out, mb):
        loss = -out["log_probs"].mean()
        return loss, {"loss": float(loss.detach())}

    metrics = engine.train_step(batch, nll, micro_batch_size=2)
    assert metrics["grad_norm"] > 0
    moved = {name for name, t in engine.weights() if not torch.equal(t, before[name])}
    # (streamed under the checkpoint's names, as Qwen2.5-VL's published weights have them)
    assert any(n.startswith("visual.blocks.") for n in moved) and any(n.startswith("model.layers.") for n in moved)
    with pytest.raises(ValueError, match="image tokens and their images"):  # pixels that are not these rows'
        bad = image_batch(tiny_vlm_dir, embedded_cache)
        bad.non_tensor_batch["multi_modal_inputs"][2] = bad.non_tensor_batch["multi_modal_inputs"][0]
        engine.infer(bad, micro_batch_size=4)
