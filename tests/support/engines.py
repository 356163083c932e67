"""Fixtures for engine tests: a small random Llama folder and a one-process gloo group."""

from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.distributed as dist

from verl.protocol import DataProto


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_llama_dir(path: str, *, vocab: int = 40, seed: int = 0, **overrides) -> str:
    """A random 2-layer GQA Llama saved as a Hugging Face folder (no tokenizer); `overrides` go to LlamaConfig."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    for key, value in overrides.items():
        setattr(cfg, key, value)
    torch.manual_seed(seed)
    LlamaForCausalLM(cfg).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def gloo_world_one():
    """torch.distributed with world size 1 in this process, as a worker has it."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    yield
    if dist.is_initialized():  # (a vLLM engine that joined the group destroys it when it shuts down)
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def cuda_world_one():
    """torch.distributed with world size 1 over NCCL on GPU 0 (tests/gpu), as a worker on a GPU has it."""
    if not dist.is_initialized():
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
        torch.cuda.set_device(0)
        dist.init_process_group("nccl", rank=0, world_size=1)
    yield


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory) -> str:
    return make_llama_dir(str(tmp_path_factory.mktemp("llama")))


def random_batch(b: int, p: int, r: int, vocab: int = 40, seed: int = 0, left_pad: int = 0):
    """Engine-layout rows: prompt (with `left_pad` padding tokens on row 0) + full-length responses."""
    from verl.protocol import DataProto

    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (b, p + r), generator=g)
    mask = torch.ones(b, p + r, dtype=torch.long)
    mask[0, :left_pad] = 0
    ids[0, :left_pad] = 0
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    return DataProto.from_dict(
        {
            "input_ids": ids,
            "attention_mask": mask,
            "position_ids": pos,
            "responses": ids[:, p:],
            "response_mask": torch.ones(b, r, dtype=torch.long),
        }
    )


def policy_batch(rows: int, p: int, r: int, vocab: int, old_log_prob: float):
    """A PPO update batch for parity tests: rows 0-2 left-padded by 2, equal-length responses (so token-mean
    per rank equals the global one), constant old log-probs, random advantages; the same for every call."""
    from verl.protocol import DataProto

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(4, vocab, (rows, p + r), generator=g)
    mask = torch.ones(rows, p + r, dtype=torch.long)
    mask[:3, :2] = 0
    return DataProto.from_dict(
        {
            "input_ids": ids,
            "attention_mask": mask,
            "position_ids": (mask.cumsum(-1) - 1).clamp(min=0),
            "responses": ids[:, p:],
            "response_mask": torch.ones(rows, r, dtype=torch.long),
            "old_log_probs": old_log_prob * torch.ones(rows, r),
            "advantages": torch.randn(rows, r, generator=g),
        }
    )


P, R = 5, 4  # grouped_batch's prompt and response widths


def grouped_batch(prompts: int = 3, n: int = 4, vocab: int = 40, seed: int = 0) -> DataProto:
    """Rollout-shaped rows: each prompt n times in a row (left-padded to P, lengths 3..5), responses of lengths
    1..R right-padded with 0 after their end, as the rollout returns them."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.zeros(prompts * n, P + R, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i in range(prompts):
        plen = 3 + i % 3
        prompt = torch.randint(3, vocab, (plen,), generator=g)
        for j in range(n):
            row = i * n + j
            rlen = 1 + (row * 7) % R
            ids[row, P - plen : P] = prompt
            ids[row, P : P + rlen] = torch.randint(3, vocab, (rlen,), generator=g)
            mask[row, P - plen : P + rlen] = 1
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    return DataProto.from_dict(
        {
            "input_ids": ids,
            "attention_mask": mask,
            "position_ids": pos,
            "responses": ids[:, P:],
            "response_mask": mask[:, P:],
            "old_log_probs": -2.0 * torch.ones(prompts * n, R),
            "advantages": torch.randn(prompts * n, R, generator=g),
        }
    )


def full_groups(groups: int, n: int, prompt: int, response: int, vocab: int) -> DataProto:
    """Rollout-shaped rows at full length: each of `groups` prompts n times in a row, no padding anywhere, random
    responses, advantages and constant old log-probs: what shared-prefix packing computes as one sequence a group."""
    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(4, vocab, (groups, prompt), generator=g).repeat_interleave(n, 0)
    responses = torch.randint(4, vocab, (groups * n, response), generator=g)
    ids = torch.cat([prompts, responses], 1)
    return DataProto.from_dict(
        {
            "input_ids": ids,
            "attention_mask": torch.ones_like(ids),
            "position_ids": torch.arange(prompt + response).expand(groups * n, -1).clone(),
            "responses": responses,
            "response_mask": torch.ones(groups * n, response, dtype=torch.long),
            "old_log_probs": -2.0 * torch.ones(groups * n, response),
            "advantages": torch.randn(groups * n, response, generator=g),
        }
    )
