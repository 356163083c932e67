"""The rollout engine contract, checked the same way for every engine (vllm on CPU; vllm and sglang on GPU).

Each check takes a built engine (eos id EOS, pad id PAD, R new tokens) and, where it compares log-probs, the
model folder the engine was built from: an FSDP actor on the same weights scores the same tokens.
"""

from __future__ import annotations

import torch

from verl.config.schema import LoraConfig, OptimConfig
from verl.engine_protocol import EngineConfig
from verl.protocol import DataProto

EOS, PAD, R = 2, 0, 6
# What every engine under contract is built with, besides its config and model (rollout_settings' keys).
SETTINGS = dict(max_new_tokens=R, eos_ids=(EOS,), pad_id=PAD, max_prompt_length=8, seed=3)  # RolloutSettings
# fp32 on both sides; the engines' attention and matmul kernels differ from torch's in rounding only.
LOGPROB_TOL = 1e-5


def prompts(b=3, p=4, seed=0) -> DataProto:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 40, (b, p), generator=g)
    mask = torch.ones(b, p, dtype=torch.long)
    ids[0, :2], mask[0, :2] = PAD, 0  # one left-padded prompt
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    tags = [chr(ord("a") + i) for i in range(b)]
    return DataProto.from_dict({"input_ids": ids, "attention_mask": mask, "position_ids": pos}, {"tag": tags})


def make_actor(path: str, device: str = "cpu", lora: int = 0):
    """An FSDP actor on the engine's model (needs a torch.distributed group), fp32 everywhere; `lora`: the rank of
    LoRA adapters it trains (0: full training)."""
    from verl_fsdp.engine import FSDPEngine

    optim = OptimConfig(lr=5e-2, weight_decay=0.0)
    adapters = LoraConfig(rank=lora, alpha=2.0 * lora) if lora else None
    return FSDPEngine(
        EngineConfig(model_path=path, optim=optim, total_steps=5, device=device, dtype="float32", lora=adapters)
    )


def nll(out, mb):
    loss = -(out["log_probs"] * mb.batch["response_mask"]).sum() / mb.batch["response_mask"].sum()
    return loss, {"loss": float(loss)}


def max_diff(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor) -> float:
    return float(((a.cpu() - b.cpu()) * mask.cpu()).abs().max())


def check_layout(rollout) -> None:
    out = rollout.generate(prompts(), n=2)
    b = out.batch
    assert len(out) == 6 and list(out.non_tensor_batch["tag"]) == ["a", "a", "b", "b", "c", "c"]
    assert b["responses"].shape == (6, R) and b["input_ids"].shape == (6, 4 + R)
    assert torch.equal(b["input_ids"][:, 4:], b["responses"])
    assert torch.equal(b["attention_mask"][:, 4:], b["response_mask"])
    assert torch.equal(b["position_ids"][:, 4:], b["position_ids"][:, 3:4] + torch.arange(1, R + 1))
    # Nothing counts after the mask ends: padding is PAD, log-probs 0.
    assert torch.all(b["rollout_log_probs"][b["response_mask"] == 0] == 0)
    assert torch.all(b["rollout_log_probs"][b["response_mask"] == 1] < 0)


def check_eos_ends_the_mask(rollout) -> None:
    """With the first greedy token of each prompt declared eos, every response is [eos, PAD, ...], mask [1, 0, ...]."""
    first = rollout.generate(prompts(), n=1, temperature=0).batch["responses"][:, 0]
    saved = rollout.eos_ids
    rollout.eos_ids = [EOS] + sorted(set(first.tolist()) - {EOS})
    try:
        b = rollout.generate(prompts(), n=1, temperature=0).batch
    finally:
        rollout.eos_ids = saved
    assert torch.equal(b["responses"][:, 0], first)
    assert torch.all(b["responses"][:, 1:] == PAD)
    assert torch.equal(b["response_mask"], torch.tensor([[1] + [0] * (R - 1)] * 3))


def check_greedy_and_sampling(rollout) -> None:
    g1 = rollout.generate(prompts(), n=1, temperature=0).batch["responses"]
    g2 = rollout.generate(prompts(), n=1, temperature=0).batch["responses"]
    assert torch.equal(g1, g2)
    # The n samples of one prompt differ from each other (not only from other prompts' samples).
    s = rollout.generate(prompts(), n=4).batch["responses"].view(3, 4, R)
    assert any(len({tuple(r.tolist()) for r in group}) > 1 for group in s)
    # Temperature 0 is greedy: n copies of the greedy response.
    saved = rollout.cfg.temperature
    rollout.cfg.temperature = 0.0
    try:
        z = rollout.generate(prompts(), n=2).batch["responses"]
    finally:
        rollout.cfg.temperature = saved
    assert torch.equal(z, g1.repeat_interleave(2, dim=0))


def check_log_probs_match_the_actor(
    rollout, model_path: str, temperature: float, device: str = "cpu", tol: float = LOGPROB_TOL
) -> float:
    """vLLM's log-probs of the tokens it sampled equal the FSDP actor's on the same tokens (fp32)."""
    actor = make_actor(model_path, device)
    rollout.cfg.temperature = temperature
    try:
        out = rollout.generate(prompts(b=8, seed=1), n=4)
    finally:
        rollout.cfg.temperature = 1.0
    b = out.batch
    actor_lp = actor.infer(out, micro_batch_size=32, temperature=temperature).batch["log_probs"]
    diff = max_diff(actor_lp, b["rollout_log_probs"], b["response_mask"])
    assert diff < tol, diff
    return diff


def check_weight_sync_follows_the_actor(
    rollout, model_path: str, device: str = "cpu", tol: float = LOGPROB_TOL
) -> None:
    """After an actor update and an in-place sync, vLLM's log-probs are the new weights' (not the old ones')."""
    actor = make_actor(model_path, device)
    batch = rollout.generate(prompts(), n=2, temperature=0)
    for _ in range(3):
        actor.train_step(batch, nll, micro_batch_size=6)
    moved = rollout.update_weights(actor.weights())
    expected = sum(p.numel() * p.element_size() for _, p in actor.weights())
    assert moved == expected > 0
    after = rollout.generate(prompts(), n=2, temperature=0)
    mask, reported = after.batch["response_mask"], after.batch["rollout_log_probs"]
    new_lp = actor.infer(after, micro_batch_size=6).batch["log_probs"]
    old_lp = make_actor(model_path, device).infer(after, micro_batch_size=6).batch["log_probs"]  # untrained weights
    assert max_diff(new_lp, reported, mask) < tol
    assert max_diff(old_lp, reported, mask) > 0.1


def check_sleep_then_sync_then_generate(
    rollout, model_path: str, device: str = "cpu", tol: float = LOGPROB_TOL
) -> None:
    """The hybrid engine's cycle: sleep while the actor trains, wake + sync, generate. The engine then generates
    with exactly the synced weights (here the untrained model's, after earlier checks trained it), whatever
    sleep freed in between (GPU engines free the KV cache and the weights; vLLM's CPU build has no sleep mode)."""
    actor = make_actor(model_path, device)
    rollout.sleep()
    rollout.update_weights(actor.weights())
    out = rollout.generate(prompts(), n=2)
    mask = out.batch["response_mask"]
    assert mask.sum() > 0
    expected = actor.infer(out, micro_batch_size=6).batch["log_probs"]
    assert max_diff(expected, out.batch["rollout_log_probs"], mask) < tol


def check_adapter_sync_follows_the_actor(
    rollout, model_path: str, device: str = "cpu", tol: float = LOGPROB_TOL, rank: int = 8
) -> None:
    """rollout.lora_sync: adapter. The engine (built with lora_rank=`rank` on the base model) serves a LoRA actor's
    adapters: after each load it generates with the trained policy, not the base; a reload replaces the adapters in
    place (a second update is followed too), sleep keeps the base weights, and only the adapters' bytes move."""
    actor = make_actor(model_path, device, lora=rank)
    base = make_actor(model_path, device)
    for update in range(2):
        batch = rollout.generate(prompts(), n=2, temperature=0)
        for _ in range(3):
            actor.train_step(batch, nll, micro_batch_size=6)
        rollout.sleep()
        config, tensors = actor.lora_adapter()
        tensors = dict(tensors)
        moved = rollout.load_adapter(config, tensors.items())
        assert moved == sum(t.numel() * t.element_size() for t in tensors.values()) > 0
        full = sum(p.numel() * p.element_size() for _, p in actor.weights())
        assert moved < full / 2, (moved, full)  # the adapters alone, not the model (a tiny model: 1/5 of it)
        out = rollout.generate(prompts(), n=2, temperature=0)
        mask, reported = out.batch["response_mask"], out.batch["rollout_log_probs"]
        assert max_diff(actor.infer(out, micro_batch_size=6).batch["log_probs"], reported, mask) < tol, update
        assert max_diff(base.infer(out, micro_batch_size=6).batch["log_probs"], reported, mask) > 0.1, update


def check_weights_verified_after_sync(rollout, model_path: str, dropped: str, device: str = "cpu") -> str:
    """verl.workers.weight_check: after a sync, each of the engine's parameters fingerprints as the tensors its loader
    was fed (every checkpoint tensor placed); a tensor that never reached the engine (`dropped`, after the actor
    trained) is named, the rest still agree. Returns the problem line; the engine ends with the trained weights."""
    from verl.workers.weight_check import Recorder, compare

    actor = make_actor(model_path, device)
    recorder = Recorder(rollout.fingerprint_key)
    rollout.update_weights(recorder.observe(actor.weights()))
    report = recorder.finish(1, rollout.weight_fingerprints)
    assert report.expected and set(report.expected) == set(report.actual)
    verdict = compare([report], 1)
    assert verdict.problems == [] and verdict.checked > 0, verdict
    for _ in range(2):
        actor.train_step(rollout.generate(prompts(), n=2, temperature=0), nll, micro_batch_size=6)
    recorder = Recorder(rollout.fingerprint_key)
    sent = list(recorder.observe(actor.weights()))  # what the sync should have delivered
    rollout.update_weights((name, t) for name, t in sent if name != dropped)  # a loader that lost one tensor
    problems = compare([recorder.finish(2, rollout.weight_fingerprints)], 1).problems
    key = rollout.fingerprint_key(dropped)[0]
    assert len(problems) == 1 and problems[0].startswith(f"{key} on rank(s) 0: holds other values"), problems
    rollout.update_weights(iter(sent))
    return problems[0]


def check_adapters_verified_after_load(rollout, model_path: str, device: str = "cpu", rank: int = 8) -> str:
    """rollout.lora_sync: adapter under verl.workers.weight_check: after a load every LoRA matrix the engine computes
    with fingerprints as the adapter tensors it was fed (B with its scaling); adapters that never reached the engine
    (the next update's load lost) are named. Returns the first problem line; the engine ends with the last adapters."""
    from verl.workers.weight_check import Recorder, compare

    actor = make_actor(model_path, device, lora=rank)
    reports = []
    for update in range(2):
        actor.train_step(rollout.generate(prompts(), n=2, temperature=0), nll, micro_batch_size=6)
        config, tensors = actor.lora_adapter()
        recorder = Recorder(rollout.fingerprint_key)
        observed = recorder.observe(tensors)
        if update == 0:
            rollout.load_adapter(config, observed)
        else:  # a load that never reached the engine: the stream is read, the engine keeps the first adapters
            list(observed)
        reports.append(recorder.finish(update, rollout.weight_fingerprints))
    first = compare(reports[:1], 1)
    assert first.problems == [] and first.checked == len(dict(actor.lora_adapter()[1])), first  # each A and B
    problems = compare(reports[1:], 1).problems
    assert problems and all("holds other values than it was sent" in p for p in problems), problems
    rollout.load_adapter(*actor.lora_adapter())
    return problems[0]
