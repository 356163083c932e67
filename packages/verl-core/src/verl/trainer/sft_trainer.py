"""SFTTrainer: supervised fine-tuning as a run of its own (algorithm.name: sft). One step:

examples of data.train_files -> the actor's update on the token-mean negative log-likelihood

on the actor's workers in any layout either engine supports (FSDP over its ranks, megatron TP/PP/CP), with
validation loss on data.val_files, checkpoints and exact resume, tracking and the run summary as every trainer
has them (`verl.trainer.base.Trainer`). No rollout, reference or reward: nothing is generated.
"""

from __future__ import annotations

import math
import time
from typing import Any, Dict, Optional, Tuple

import torch

from verl.data.build import make_sft_loader
from verl.trainer.base import Trainer, mean_over_ranks, pad_to_multiple
from verl.trainer.registry import TRAINERS
from verl.trainer.timer import StageTimer
from verl.workers.actor_rollout_ref import ActorRolloutRefWorker
from verl.workers.columns import MODEL_INPUTS, model_non_tensors

SFT_UPDATE = MODEL_INPUTS + ("response_mask",)
# Near 0, a token's log-prob is ~0 when it is the argmax and < -log 2 when another token's logit is higher.
GREEDY_TEMPERATURE = 1e-5


def greedy_matches(sharp_log_probs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per row, whether greedy decoding would produce every loss token: each one's log-prob at GREEDY_TEMPERATURE
    above -log 2 (no other token's logit is higher). Never a false match; a near-tie (logits within ~1e-4) may
    count as a miss."""
    hit = (sharp_log_probs.double() > -math.log(2.0)) | (mask == 0)
    return hit.all(dim=-1) & (mask.sum(dim=-1) > 0)


@TRAINERS.register("sft")
class SFTTrainer(Trainer):
    """SFT on prompt/response (or multi-turn `messages`) parquet, with `val/loss` for validation.

    with SFTTrainer("recipes/sft_tiny.yaml") as trainer:   # or verl.RLTrainer: the class algorithm.name picks
        print(trainer.fit())
    """

    def make_loaders(self) -> Tuple[Any, Any]:
        """Examples of data.train_files (data.train_batch_size a step) and of data.val_files (data.val_batch_size
        at a time, all of them by default), each up to data.max_prompt_length + data.max_response_length tokens."""
        d, seed, images = self.cfg.data, self.cfg.trainer.seed, self.processor
        train = make_sft_loader(
            d, d.train_files, self.tokenizer, seed=seed, batch_size=d.train_batch_size, train=True, processor=images
        )
        if not d.val_files:
            return train, None
        return train, make_sft_loader(
            d, d.val_files, self.tokenizer, seed=seed, batch_size=d.val_batch_size, train=False, processor=images
        )

    def train_step(self) -> Dict[str, float]:
        timer = StageTimer()
        self.workers.take_stats()
        start = time.perf_counter()
        batch = self.train_loader.next_batch()
        with timer("update"):
            per_rank = self.workers.actor_rollout.call(
                ActorRolloutRefWorker.update_actor, batch.select(SFT_UPDATE, model_non_tensors(batch)), loss="sft"
            )
        metrics = {**mean_over_ranks(per_rank), "sft/loss_tokens": float(batch.batch["response_mask"].sum())}
        return {**metrics, **self.step_metrics(timer, start, batch)}

    def evaluate(self) -> Dict[str, float]:
        """val/loss: the token-mean negative log-likelihood of data.val_files' loss tokens under the actor;
        val/exact_match: the share of examples that greedy decoding reproduces (every loss token the argmax)."""
        if self.val_loader is None:
            return {}
        nll, tokens, rows, matched = torch.zeros((), dtype=torch.float64), 0, 0, 0
        for batch in self.val_loader:
            padded, pad = pad_to_multiple(batch, self.plan.train_dp)
            inputs = padded.select(MODEL_INPUTS, model_non_tensors(padded))
            mask = batch.batch["response_mask"].double()
            out = self.workers.actor_rollout.call(ActorRolloutRefWorker.actor_log_probs, inputs)
            nll -= (out.batch["log_probs"][: len(batch)].double() * mask).sum()
            sharp = self.workers.actor_rollout.call(
                ActorRolloutRefWorker.actor_log_probs, inputs, temperature=GREEDY_TEMPERATURE
            )
            matched += int(greedy_matches(sharp.batch["log_probs"][: len(batch)], mask).sum())
            tokens += int(mask.sum())
            rows += len(batch)
        return {
            "val/loss": float(nll / max(tokens, 1)),
            "val/exact_match": matched / max(rows, 1),
            "val/tokens": float(tokens),
            "val/n": float(rows),
        }

    def summary(self, seconds: float, tokens_per_s: float, first_step_s: Optional[float] = None) -> Dict[str, Any]:
        """The base summary, with the validation loss before and after (val_loss_before / val_loss_after)."""
        at = {v["step"]: v["val/loss"] for v in self.val_history}
        return {
            **super().summary(seconds, tokens_per_s, first_step_s),
            "val_loss_before": at.get(0),
            "val_loss_after": at.get(self.step),
        }
