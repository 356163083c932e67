"""A vision-language model on the FSDP engine (one gloo rank): log-probs on image prompts equal plain transformers'
on each row alone, padded (left-padded rows and a text row beside them included) and packed (a shared prompt and its
images computed once; a padding-free stream); a step trains the vision tower too, and a packed step equals a
padded one."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForImageTextToText

from tests.support.engines import gloo_world_one  # noqa: F401
from tests.support.fixtures import embedded_cache, tiny_model_dir, tiny_vlm_dir  # noqa: F401
from tests.support.image_batches import R, image_batch
from verl.config.schema import OptimConfig
from verl.engine_protocol import EngineConfig
from verl.protocol import DataProto
from verl_fsdp.engine import FSDPEngine
from verl_fsdp.vision import image_keys, image_rows


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


@pytest.fixture(scope="module", params=["tiny-qwen2.5-vl", "tiny-qwen3-vl"])
def vlm_dir(request, embedded_cache):  # noqa: F811
    """Each embedded vision-language model's folder: Qwen2.5-VL, and Qwen3-VL (deepstack features, interleaved
    multimodal rotary positions)."""
    from verl.embedded.models import materialize_embedded_model

    return materialize_embedded_model(request.param, embedded_cache)


MODEL_CLASSES = {"qwen2_5_vl": "Qwen2_5_VLForConditionalGeneration", "qwen3_vl": "Qwen3VLForConditionalGeneration"}


def test_image_prompt_log_probs_equal_transformers(gloo_world_one, vlm_dir, embedded_cache):  # noqa: F811
    batch = image_batch(vlm_dir, embedded_cache)
    assert batch.batch["attention_mask"][2].sum() < batch.batch["attention_mask"][0].sum()  # the text row is padded
    engine = FSDPEngine(EngineConfig(model_path=vlm_dir, total_steps=1))
    assert type(engine.model).__name__ == MODEL_CLASSES[engine.model.config.model_type]
    got = engine.infer(batch, micro_batch_size=4).batch["log_probs"]
    torch.testing.assert_close(got, _transformers_log_probs(vlm_dir, batch), rtol=0, atol=1e-5)
    by_two = engine.infer(batch, micro_batch_size=2).batch["log_probs"]  # (a micro-batch of text rows only too)
    torch.testing.assert_close(by_two, got, rtol=0, atol=1e-5)


@pytest.mark.parametrize("layout", ["shared_prefix", "padding_free"])
def test_packed_image_prompts_equal_transformers(gloo_world_one, vlm_dir, embedded_cache, layout, monkeypatch):  # noqa: F811
    """Groups of two rows per prompt, packed: three image prompts whose tokens are equal (one question, images of
    one size) stay three prompts with their own pixels; their rows' log-probs are transformers' on each row alone."""
    import verl_fsdp.engine as fsdp_engine

    batch = image_batch(vlm_dir, embedded_cache, n=2)
    p = batch.batch["input_ids"].shape[1] - R
    assert torch.equal(batch.batch["input_ids"][0, :p], batch.batch["input_ids"][2, :p])  # (different images)
    if layout == "padding_free":  # (SDPA taken as mask-less: the stream flash-attention runs, tests/gpu)
        monkeypatch.setattr(fsdp_engine, "MASKABLE_ATTENTION", ())
    engine = FSDPEngine(EngineConfig(model_path=vlm_dir, total_steps=1))
    b = batch.batch
    rows = image_rows(batch)
    pack = engine._pack(b, R, image_keys(rows))
    assert pack is not None
    image_token = engine.model.config.image_token_id
    per_image = int((b["input_ids"][0] == image_token).sum())
    copies = 3 if layout == "shared_prefix" else 6  # each image prompt once, or once per row
    assert int((pack.input_ids == image_token).sum()) == copies * per_image
    got = engine.infer(batch, micro_batch_size=8).batch["log_probs"]
    assert engine._tokens[2] == pack.tokens  # (the engine ran the pack)
    torch.testing.assert_close(got, _transformers_log_probs(vlm_dir, batch), rtol=0, atol=1e-5)


def test_a_packed_step_on_image_prompts_equals_a_padded_one(gloo_world_one, vlm_dir, embedded_cache):  # noqa: F811
    """One step over groups that share image prompts: packed (each prompt and its images computed once, their
    gradients summed over the group's rows) and padded give the same weights (Adam eps=1: weights compare
    gradients), the vision tower's included."""
    batch = image_batch(vlm_dir, embedded_cache, n=2)
    optim = OptimConfig(lr=1e-2, eps=1.0, weight_decay=0.0)
    after, before = {}, dict(FSDPEngine(EngineConfig(model_path=vlm_dir, total_steps=1)).weights())
    for shared in (True, False):
        engine = FSDPEngine(EngineConfig(model_path=vlm_dir, optim=optim, total_steps=1, shared_prefix=shared))
        metrics = engine.train_step(batch, _advantage_loss, micro_batch_size=8)
        assert (metrics["computed_tokens_ratio"] < 0.9) == shared
        after[shared] = dict(engine.weights())
    moved = [n for n, t in after[True].items() if not torch.equal(t, before[n])]
    # (checkpoint names: Qwen2.5-VL's visual.* and model.layers.*, Qwen3-VL's model.visual.* and model.language_model.*)
    assert any("visual.blocks." in n for n in moved) and any(".layers." in n for n in moved)
    for name, t in after[True].items():
        torch.testing.assert_close(t, after[False][name], rtol=0, atol=1e-6, msg=name)


def _advantage_loss(out, mb):
    loss = -(out["log_probs"] * mb.batch["advantages"].to(out["log_probs"].device)).mean()
    return loss, {"loss": float(loss.detach())}


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


def test_a_frozen_vision_tower_stays_as_loaded(gloo_world_one, vlm_dir, embedded_cache):  # noqa: F811
    """actor.freeze_vision_tower: a step trains the language model only; the tower (its merger too) has neither
    gradients nor optimizer state, and its weights are the loaded ones."""
    batch = image_batch(vlm_dir, embedded_cache, n=2)
    optim = OptimConfig(lr=1e-2, weight_decay=0.0)
    engine = FSDPEngine(EngineConfig(model_path=vlm_dir, optim=optim, total_steps=1, freeze_vision_tower=True))
    before = {name: t.clone() for name, t in engine.weights()}
    metrics = engine.train_step(batch, _advantage_loss, micro_batch_size=4)
    assert metrics["grad_norm"] > 0
    moved = {name for name, t in engine.weights() if not torch.equal(t, before[name])}
    tower = {name for name in before if "visual." in name}
    assert tower and any("visual.merger." in n for n in tower)
    assert not moved & tower and any(".layers." in n for n in moved)
    trained = {p for group in engine.optimizer.param_groups for p in group["params"]}
    frozen = [p for n, p in engine.model.named_parameters() if ".visual." in f".{n}"]
    assert frozen and not any(p in trained for p in frozen)


def test_freezing_the_tower_of_a_text_model_is_refused(gloo_world_one, tiny_model_dir):  # noqa: F811
    with pytest.raises(ValueError, match="actor.freeze_vision_tower: .* has no vision tower"):
        FSDPEngine(EngineConfig(model_path=tiny_model_dir, total_steps=1, freeze_vision_tower=True))
