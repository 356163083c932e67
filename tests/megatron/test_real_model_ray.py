"""Megatron on a real pretrained model's weights: SmolLM2-135M-Instruct (Llama, tied embeddings, 9 query and 3
key-value heads, so tensor parallelism of 3 rather than 2). Its log-probs of the model's own sampled answers to
chat prompts (what RL trains on) against transformers' in float32, at TP=3 (sequence parallel) and PP=2, and its
weights streamed back under Hugging Face names bit for bit.

On 30 real layers float32's rounding shows, and how it falls depends on the CPU's kernels: transformers' own float32
log-probs (eager or sdpa attention) are 2e-5 to 4e-5 from float64's on these rows. Megatron's float32 must be about
as close to float64's as transformers' is (at most twice transformers' error, and never looser than the 1e-5 the
random tiny models meet against transformers)."""

from __future__ import annotations

import hashlib
import sys

import pytest
import ray
import torch

from tests.support.megatron_workers import LOGPROB_ATOL, EngineWorker, response_log_probs
from verl.controller import ResourcePool, make_worker_group
from verl.protocol import DataProto

pytestmark = pytest.mark.slow  # the fast tier skips this file (tagged "slow" in tests/BUILD too)

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
ray.cloudpickle.register_pickle_by_value(sys.modules["tests.support.megatron_workers"])

QUESTIONS = ["What is 12 + 7?", "Name a primary colour.", "Write one word that rhymes with cat.", "Say hello."]


def sampled_batch(model_dir: str, new_tokens: int = 12) -> DataProto:
    """Chat prompts (left-padded) and the model's own answers sampled at temperature 1 (seeded), right-padded
    after an early eos: the rows a GRPO step computes log-probs of."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    chats = [[{"role": "user", "content": q}] for q in QUESTIONS]
    texts = tok.apply_chat_template(chats, add_generation_prompt=True, tokenize=False)
    prompts = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    torch.manual_seed(0)
    with torch.no_grad():
        out = model.generate(**prompts, do_sample=True, temperature=1.0, top_k=0, max_new_tokens=new_tokens)
    p = prompts["input_ids"].shape[1]
    responses = out[:, p:]
    ended = (responses == tok.eos_token_id).int().cumsum(-1)
    response_mask = ((ended - (responses == tok.eos_token_id).int()) == 0).long()  # up to and with the eos
    responses = torch.where(response_mask.bool(), responses, tok.pad_token_id)
    mask = torch.cat([prompts["attention_mask"], response_mask], 1)
    return DataProto.from_dict(
        {
            "input_ids": torch.cat([prompts["input_ids"], responses], 1),
            "attention_mask": mask,
            "position_ids": (mask.cumsum(-1) - 1).clamp(min=0),
            "responses": responses,
            "response_mask": response_mask,
        }
    )


def exact_log_probs(model_dir: str, batch: DataProto) -> torch.Tensor:
    """transformers' response log-probs in float64, each row alone without its padding: float32's rounding errors
    are measured against these."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float64, attn_implementation="eager").eval()
    b = batch.batch
    out = torch.zeros(b["responses"].shape, dtype=torch.float64)
    for i in range(len(b["input_ids"])):
        ids = b["input_ids"][i][b["attention_mask"][i].bool()]  # the real prompt, then the response up to its eos
        n = int(b["response_mask"][i].sum())
        with torch.no_grad():
            logits = model(input_ids=ids[None]).logits[0, -n - 1 : -1]
        out[i, :n] = torch.log_softmax(logits, -1).gather(-1, b["responses"][i, :n, None]).squeeze(-1)
    return out


def transformers_error(model_dir: str, batch: DataProto, exact: torch.Tensor) -> float:
    """How far transformers' own float32 log-probs (eager and sdpa attention) are from float64's."""
    from transformers import AutoModelForCausalLM

    worst = 0.0
    for impl in ("eager", "sdpa"):
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation=impl)
        with torch.no_grad():
            got = response_log_probs(model.eval(), batch).double()
        worst = max(worst, float((got - exact).abs()[batch.batch["response_mask"].bool()].max()))
    return worst


@pytest.mark.parametrize("parallel", [{"tp": 3}, {"pp": 2}], ids=["tp3-sp", "pp2"])
def test_real_weights_give_transformers_log_probs(smollm2_dir, ray_three_cpus, parallel):  # noqa: F811
    from safetensors.torch import load_file

    batch = sampled_batch(smollm2_dir)
    world = parallel.get("tp", 1) * parallel.get("pp", 1)
    pool = ResourcePool("megatron", nnodes=1, devices_per_node=world, cpus_per_device=3 / world)
    group = make_worker_group("ray", pool, EngineWorker, {}, role="megatron", env={"OMP_NUM_THREADS": "1"})
    try:
        group.call("relayout", parallel)
        group.call("load", "smollm2", smollm2_dir)
        exact = exact_log_probs(smollm2_dir, batch)
        floor = transformers_error(smollm2_dir, batch, exact)
        valid = batch.batch["response_mask"].bool()
        worst = 0.0
        for out in group.call("infer", "smollm2", batch):
            worst = max(worst, float((out["log_probs"].double() - exact).abs()[valid].max()))
        print(f"SmolLM2-135M {parallel}: float32 error vs float64: megatron {worst:.2e}, transformers {floor:.2e}")
        assert worst <= max(LOGPROB_ATOL, 2 * floor), (worst, floor)
        full = load_file(f"{smollm2_dir}/model.safetensors")
        want = {k: hashlib.sha256(v.contiguous().numpy().tobytes()).hexdigest() for k, v in full.items()}
        assert all(digests == want for digests in group.call("hf_weight_digests", "smollm2"))
        tokens = int(batch.batch["response_mask"].sum())
        print(f"SmolLM2-135M {parallel}: {tokens} tokens, weights streamed back bitwise")
    finally:
        group.shutdown()
        pool.remove()
