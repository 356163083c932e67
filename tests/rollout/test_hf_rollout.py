"""The hf rollout engine: masks, shapes, log-probs against the actor, weight updates, shared weights."""

from __future__ import annotations

import pytest
import torch

from tests.rollout import engine_contract as contract
from tests.support.engines import gloo_world_one, llama_dir, make_llama_dir  # noqa: F401
from verl.config.schema import OptimConfig, RolloutConfig
from verl.engine_protocol import EngineConfig, RolloutSettings
from verl.protocol import DataProto
from verl.rollout_batch import response_mask_until_eos
from verl_fsdp.engine import FSDPEngine
from verl_rollout.hf import HFRollout

EOS, PAD = 2, 0


def test_response_mask_until_eos_by_hand():
    responses = torch.tensor([[5, 6, 2, 0, 0], [5, 2, 2, 7, 0], [5, 6, 7, 8, 9], [2, 0, 0, 0, 0]])
    expected = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]])
    assert torch.equal(response_mask_until_eos(responses, [EOS]), expected)


def _prompts(b=3, p=4, seed=0) -> DataProto:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 40, (b, p), generator=g)
    mask = torch.ones(b, p, dtype=torch.long)
    ids[0, :2], mask[0, :2] = PAD, 0  # one left-padded prompt
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    return DataProto.from_dict(
        {"input_ids": ids, "attention_mask": mask, "position_ids": pos}, {"tag": ["a", "b", "c"]}
    )


def _actor(path):
    return FSDPEngine(EngineConfig(model_path=path, optim=OptimConfig(lr=5e-2, weight_decay=0.0), total_steps=5))


def _rollout(path, engine=None, **cfg):
    kw = dict(module=engine.model, gather=engine.gathered) if engine is not None else {}
    settings = RolloutSettings(max_new_tokens=6, eos_ids=(EOS,), pad_id=PAD)
    return HFRollout(RolloutConfig(**cfg), model_path=path, settings=settings, **kw)


def test_generate_layout_and_log_probs_match_the_actor(gloo_world_one, llama_dir):  # noqa: F811
    actor = _actor(llama_dir)
    rollout = _rollout(llama_dir, actor, temperature=0.8, top_k=20, top_p=0.9)
    torch.manual_seed(0)
    out = rollout.generate(_prompts(), n=2)
    b = out.batch
    assert len(out) == 6 and list(out.non_tensor_batch["tag"]) == ["a", "a", "b", "b", "c", "c"]
    assert b["responses"].shape == (6, 6) and b["input_ids"].shape == (6, 10)
    assert torch.equal(b["input_ids"][:, 4:], b["responses"])
    assert torch.equal(b["attention_mask"][:, 4:], b["response_mask"])
    # Positions continue from each prompt's last position.
    assert torch.equal(b["position_ids"][:, 4:], b["position_ids"][:, 3:4] + torch.arange(1, 7))
    # Trainer and rollout log-probs agree on every generated token (same weights, same temperature).
    actor_lp = actor.infer(out, micro_batch_size=6, temperature=0.8).batch["log_probs"]
    diff = ((actor_lp - b["rollout_log_probs"]) * b["response_mask"]).abs().max()
    assert diff < 1e-5, diff


def test_shared_prefill_samples_as_repeated_prompts_do(gloo_world_one, llama_dir):  # noqa: F811
    """n > 1 prefills each prompt once and repeats its KV cache: the same draws give the same tokens and
    log-probs as n copies of the prompt prefilled one by one (n=1 prefills every row)."""
    rollout = _rollout(llama_dir, temperature=1.0)
    torch.manual_seed(3)
    shared = rollout.generate(_prompts(), n=3).batch
    torch.manual_seed(3)
    repeated = rollout.generate(_prompts().repeat(3, interleave=True), n=1).batch
    assert torch.equal(shared["responses"], repeated["responses"])
    mask = shared["response_mask"].bool()
    torch.testing.assert_close(
        shared["rollout_log_probs"][mask], repeated["rollout_log_probs"][mask], rtol=0, atol=1e-5
    )


def test_greedy_is_deterministic_and_sampling_varies(gloo_world_one, llama_dir):  # noqa: F811
    rollout = _rollout(llama_dir, temperature=1.0)
    g1 = rollout.generate(_prompts(), n=1, temperature=0).batch["responses"]
    g2 = rollout.generate(_prompts(), n=1, temperature=0).batch["responses"]
    assert torch.equal(g1, g2)
    torch.manual_seed(1)
    s = rollout.generate(_prompts(), n=4).batch["responses"]
    assert len({tuple(r.tolist()) for r in s}) > 1


def test_weight_update_follows_the_actor(gloo_world_one, llama_dir, tmp_path):  # noqa: F811
    """A rollout with its own copy: after the actor trains and syncs, log-probs follow the new weights."""
    actor = _actor(llama_dir)
    rollout = _rollout(llama_dir)
    batch = rollout.generate(_prompts(), n=1, temperature=0)
    before = actor.infer(batch, micro_batch_size=3).batch["log_probs"]

    def nll(out, mb):
        loss = -out["log_probs"].mean()
        return loss, {}

    for _ in range(3):
        actor.train_step(batch, nll, micro_batch_size=3)
    moved = rollout.update_weights(actor.weights())
    assert moved == sum(p.numel() * 4 for p in rollout.module.parameters())
    after = actor.infer(batch, micro_batch_size=3).batch["log_probs"]
    again = rollout.generate(_prompts(), n=1, temperature=0)
    assert not torch.allclose(before, after)
    # The rollout's own log-probs for its new greedy tokens equal the updated actor's.
    actor_lp = actor.infer(again, micro_batch_size=3).batch["log_probs"]
    diff = ((actor_lp - again.batch["rollout_log_probs"]) * again.batch["response_mask"]).abs().max()
    assert diff < 1e-5


def test_shared_module_needs_no_sync(gloo_world_one, llama_dir):  # noqa: F811
    actor = _actor(llama_dir)
    rollout = _rollout(llama_dir, actor)
    assert rollout.update_weights(actor.weights()) == 0
    assert rollout.module is actor.model


def test_a_tensor_that_never_reached_the_engine_is_named(gloo_world_one, llama_dir):  # noqa: F811
    """verl.workers.weight_check on an engine with its own copy; a shared module has nothing to check."""
    dropped = "model.layers.0.self_attn.q_proj.weight"
    problem = contract.check_weights_verified_after_sync(_rollout(llama_dir), llama_dir, dropped)
    assert problem.startswith(f"{dropped} on rank(s) 0")
    assert _rollout(llama_dir, _actor(llama_dir)).weight_fingerprints() is None


def test_unknown_parameter_is_named(gloo_world_one, llama_dir):  # noqa: F811
    rollout = _rollout(llama_dir)
    with pytest.raises(KeyError, match="lm_head.bogus"):
        rollout.update_weights([("lm_head.bogus", torch.zeros(1))])


def test_sleep_releases_its_own_copy_and_a_full_sync_restores_it(gloo_world_one, llama_dir):  # noqa: F811
    actor = _actor(llama_dir)
    rollout = _rollout(llama_dir)
    before = rollout.generate(_prompts(), n=1, temperature=0).batch["responses"]
    size = sum(p.numel() for p in rollout.module.parameters())
    rollout.sleep()
    assert sum(p.numel() for p in rollout.module.parameters()) == 0  # nothing held while the actor trains
    with pytest.raises(RuntimeError, match="weights were released"):
        rollout.generate(_prompts(), n=1)
    with pytest.raises(KeyError, match="lack"):  # a partial sync cannot wake it
        rollout.update_weights([("model.norm.weight", torch.ones(32))])
    with pytest.raises(RuntimeError, match="weights were released"):
        rollout.generate(_prompts(), n=1)
    moved = rollout.update_weights(actor.weights())
    assert moved == 4 * size  # float32: every parameter sent once
    assert torch.equal(rollout.generate(_prompts(), n=1, temperature=0).batch["responses"], before)


def test_sleep_keeps_a_shared_module(gloo_world_one, llama_dir):  # noqa: F811
    actor = _actor(llama_dir)
    rollout = _rollout(llama_dir, actor)
    rollout.sleep()
    assert sum(p.numel() for p in actor.model.parameters()) > 0
    rollout.generate(_prompts(), n=1, temperature=0)
