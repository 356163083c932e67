"""The memory plan against torch.cuda.max_memory_allocated on one GPU: the actor's log-prob pass and its update of a
one-GPU GRPO run (FSDP, bf16), each phase's estimated peak (verl.memory_plan) within 15% of the measured one.

Skipped without CUDA (the reason is shown). The batch has the planned worst case: every row at the full prompt and
response lengths, left padding under a mask. The measured peak of a phase is the allocator's high-water mark over
the phase, reset before it; the estimate sums the actor's parts of that phase (its state, the pass's logits, the
update's activations and logits' gradient). Printed: both, per phase, for the record.
"""

from __future__ import annotations

import pytest
import torch

from tests.support.engines import cuda_world_one, policy_batch  # noqa: F401
from tests.support.run_configs import tiny_config

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

PROMPT, RESPONSE, ROWS = 256, 512, 8
SHAPE = dict(
    vocab_size=32000,
    hidden_size=1024,
    intermediate_size=2816,
    num_hidden_layers=8,
    num_attention_heads=16,
    num_key_value_heads=4,
    max_position_embeddings=2048,
    tie_word_embeddings=False,
)


def _nll(out, mb):
    mask = mb.batch["response_mask"].to(out["log_probs"].dtype)
    loss = -(out["log_probs"] * mask).sum() / mask.sum()
    return loss, {"nll": float(loss.detach())}


_nll.weight_by = "tokens"


def _actor_bytes(phase) -> int:
    return sum(v for k, v in phase.parts.items() if k.startswith("actor "))


def test_one_gpu_grpo_phases_peak_where_the_plan_says(cuda_world_one, tmp_path):  # noqa: F811
    from transformers import AutoConfig, AutoModelForCausalLM

    from verl.config.validate import validate_and_plan
    from verl.memory_plan import estimate
    from verl.workers.build_engines import train_engine

    path = str(tmp_path / "llama")
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(AutoConfig.for_model("llama", **SHAPE)).save_pretrained(path)
    cfg = tiny_config(
        "grpo_tiny",
        str(tmp_path / "out"),
        f"model.path={path}",
        "placement.device=cuda",
        "model.dtype=bfloat16",
        "model.shared_prefix=false",  # (padded rows: the planned worst case)
        f"data.max_prompt_length={PROMPT}",
        f"data.max_response_length={RESPONSE}",
        f"data.train_batch_size={ROWS}",
        "rollout.n=1",
        f"actor.ppo_mini_batch_size={ROWS}",
        f"actor.ppo_micro_batch_size_per_device={ROWS}",
        f"actor.log_prob_micro_batch_size_per_device={ROWS}",
        "actor.entropy_coeff=0",
        "actor.entropy_every=0",
        "actor.recompute_old_log_probs=always",  # (a log-prob pass of its own, to measure)
    )
    plan, problems = validate_and_plan(cfg, strict=False)
    assert plan is not None, problems
    table, notes = estimate(cfg, plan)
    assert not notes, notes
    phases = {p.name: p for p in table}
    engine = train_engine(cfg, plan.role("actor"), model_path=path, total_steps=4, optimize=True)
    batch = policy_batch(ROWS, PROMPT, RESPONSE, SHAPE["vocab_size"], old_log_prob=-2.0)
    engine.train_step(batch, _nll, micro_batch_size=ROWS)  # (a first step: the optimizer's moments exist after it)
    measured = {}
    for name, run in (
        ("actor log-probs", lambda: engine.infer(batch, micro_batch_size=ROWS)),
        ("actor update", lambda: engine.train_step(batch, _nll, micro_batch_size=ROWS)),
    ):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        run()
        torch.cuda.synchronize()
        measured[name] = torch.cuda.max_memory_allocated()
    for name, peak in measured.items():
        want = _actor_bytes(phases[name])
        print(f"{name}: estimated {want / 2**30:.3f} GiB, measured {peak / 2**30:.3f} GiB ({want / peak:.3f}x)")
        print("  parts:", {k: round(v / 2**30, 3) for k, v in phases[name].parts.items() if k.startswith("actor ")})
    for name, peak in measured.items():
        assert _actor_bytes(phases[name]) == pytest.approx(peak, rel=0.15), name
