"""A Hugging Face sequence-classification model as a reward (`reward.model: {_target_:
verl.reward.hf_model.HFRewardModel, path: ...}`), with its own tokenizer and chat template.

The policy's responses are decoded with the policy's tokenizer, appended to each prompt's conversation as an
assistant message and rendered with the reward model's chat template (or, without one, the messages' contents
in order), then tokenized with the reward model's tokenizer: the two models need not share a vocabulary. Scored
in batches of `batch_size`; the score is the model's single logit.
"""

from __future__ import annotations

from typing import Dict, List, Optional

import torch

from verl.engine_protocol import DTYPES


class HFRewardModel:
    def __init__(
        self,
        path: str,
        *,
        tokenizer_path: Optional[str] = None,
        batch_size: int = 16,
        max_length: int = 2048,
        device: str = "cpu",
        dtype: str = "float32",
    ):
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        if dtype not in DTYPES:
            raise ValueError(f"reward.model.dtype '{dtype}' is not one of {', '.join(DTYPES)}")
        self.tokenizer = AutoTokenizer.from_pretrained(tokenizer_path or path)
        self.tokenizer.padding_side = "right"
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.model = AutoModelForSequenceClassification.from_pretrained(path, dtype=DTYPES[dtype]).to(device).eval()
        if self.model.config.num_labels != 1:
            raise ValueError(
                f"reward.model.path: {path} has num_labels={self.model.config.num_labels}; a reward model has one "
                "output (a sequence-classification head with num_labels=1)"
            )
        self.model.config.pad_token_id = self.tokenizer.pad_token_id
        self.batch_size, self.max_length, self.device = batch_size, max_length, device

    def render(self, conversation: List[Dict[str, str]], response: str) -> str:
        """The text the reward model reads: the conversation and the response as its last assistant message."""
        messages = [*conversation, {"role": "assistant", "content": response}]
        if self.tokenizer.chat_template:
            return self.tokenizer.apply_chat_template(messages, tokenize=False)
        return "".join(m["content"] for m in messages)

    @torch.no_grad()
    def score_texts(self, conversations: List[List[Dict[str, str]]], responses: List[str]) -> torch.Tensor:
        """One score per (conversation, response): the model's logit, float32 [B]."""
        texts = [self.render(c, r) for c, r in zip(conversations, responses)]
        scores = []
        for start in range(0, len(texts), self.batch_size):
            enc = self.tokenizer(
                texts[start : start + self.batch_size],
                padding=True,
                truncation=True,
                max_length=self.max_length,
                add_special_tokens=False,
                return_tensors="pt",
            ).to(self.device)
            scores.append(self.model(**enc).logits[:, 0].float().cpu())
        return torch.cat(scores) if scores else torch.zeros(0)
