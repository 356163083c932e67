"""Engine-layout batches of image prompts for the vision-language tests (the embedded tiny Qwen2.5-VL)."""

from __future__ import annotations

import torch
from transformers import AutoTokenizer

from verl.data.rl_dataset import RLDataset, collate_rl
from verl.data.vision import load_vision_processor
from verl.protocol import DataProto

R = 6  # response tokens per row


def image_batch(model_dir: str, cache: str, n: int = 1) -> DataProto:
    """Four prompts: three shapes prompts and one text prompt (shorter, so left-padded), each n times (a GRPO
    group's rows, which share their prompt), each row with R random response characters (never a vision token)."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    data = RLDataset(
        ["embedded:shapes-val"],
        tokenizer,
        max_prompt_length=64,
        processor=load_vision_processor(model_dir, tokenizer),
        cache_dir=cache,
    )
    text = {**data[3], "input_ids": torch.tensor(tokenizer("12+7=")["input_ids"])}
    del text["multi_modal_inputs"]
    prompts = collate_rl([row for row in (data[0], data[1], text, data[2]) for _ in range(n)], tokenizer, 64)
    rows = 4 * n
    g = torch.Generator().manual_seed(0)
    responses = torch.randint(4, 83, (rows, R), generator=g)  # (ids 4..82: characters; 83-86 the vision tokens)
    mask = torch.cat([prompts.batch["attention_mask"], torch.ones(rows, R, dtype=torch.long)], dim=1)
    return DataProto.from_dict(
        tensors={
            "input_ids": torch.cat([prompts.batch["input_ids"], responses], dim=1),
            "attention_mask": mask,
            "position_ids": (mask.cumsum(-1) - 1).clamp(min=0),
            "responses": responses,
            "response_mask": torch.ones(rows, R, dtype=torch.long),
            "advantages": torch.randn(rows, R, generator=g),
        },
        non_tensors={"multi_modal_inputs": prompts.non_tensor_batch["multi_modal_inputs"]},
    )
