"""DPOTrainer: preference optimisation on the single controller (algorithm.name dpo or online_dpo). One step:

dpo:         pairs from data.train_files ----------------------------------> reference log-probs -> DPO update
online_dpo:  generate rollout.n -> reward -> best and worst of each prompt -> reference log-probs -> DPO update

The update (algorithm.dpo: loss, beta, label_smoothing) runs on the actor's workers with whole (chosen, rejected)
pairs per rank and per micro-batch, and ends with the weight sync into the rollout, as PPO's does. Validation,
checkpoints and exact resume, tracking and the run summary are PPOTrainer's: only the step differs.
"""

from __future__ import annotations

import time
from typing import Any, Dict, Tuple

from verl.data.build import make_preference_loader, make_val_loader
from verl.protocol import DataProto
from verl.trainer.ppo import PPOTrainer, _mean_over_ranks, step_metrics
from verl.trainer.shaping import best_and_worst
from verl.trainer.timer import StageTimer
from verl.workers.actor_rollout_ref import ActorRolloutRefWorker
from verl.workers.columns import MODEL_INPUTS

PAIR_UPDATE = MODEL_INPUTS + ("response_mask", "ref_seq_log_probs", "is_chosen")


class DPOTrainer(PPOTrainer):
    """DPO / IPO on preference pairs, or online DPO on ranked samples; `fit()`, `validate()`, checkpoints and
    `close()` as PPOTrainer.

        trainer = DPOTrainer("recipes/dpo_tiny.yaml")   # or verl.RLTrainer: picks the class from algorithm.name
        print(trainer.fit())
    """

    def scores(self) -> bool:
        """Online DPO ranks its samples by the reward; offline DPO scores only held-out generations, if any."""
        return self.cfg.algorithm.name == "online_dpo" or bool(self.cfg.data.val_files)

    def make_loaders(self) -> Tuple[Any, Any]:
        """dpo: (chosen, rejected) pairs of data.train_files; online_dpo: prompts, as PPO's. Held-out prompts of
        data.val_files either way (validation generates and scores, as PPO's)."""
        if self.cfg.algorithm.name == "online_dpo":
            return super().make_loaders()
        seed = self.cfg.trainer.seed
        train = make_preference_loader(self.cfg.data, self.tokenizer, seed=seed)
        if not train.dataset.has_ref and not self.plan.has("ref"):
            raise ValueError(
                f"ref.enable=false needs the reference's log-probs in the data: {train.dataset.files} lack the "
                "columns ref_chosen_logps and ref_rejected_logps; add them, or set ref.enable=true"
            )
        return train, make_val_loader(self.cfg.data, self.tokenizer, seed=seed)

    def train_step(self) -> Dict[str, float]:
        timer = StageTimer()
        self.workers.take_stats()
        start = time.perf_counter()
        metrics: Dict[str, float] = {}
        if self.cfg.algorithm.name == "online_dpo":
            with timer("gen"):
                batch = self.next_rollout()
            with timer("reward"):
                metrics.update(self.score(batch))
            batch, pair_metrics = best_and_worst(batch, self.cfg.rollout.n, multiple=self.plan.train_dp)
            metrics.update(pair_metrics)
        else:
            batch = self.train_loader.next_batch()
            metrics["dpo/pairs"] = float(len(batch) // 2)
        if len(batch):  # (online: every group of this step may have tied)
            with timer("log_probs"):
                self.add_reference(batch)
            with timer("update"):
                metrics.update(self.update_pairs(batch))
        return {**metrics, **step_metrics(self, timer, start, batch)}

    def add_reference(self, batch: DataProto) -> None:
        """ref_seq_log_probs [2B]: each reply's summed log-probs under the reference, unless the data has them."""
        if "ref_seq_log_probs" in batch.batch.keys():
            return
        out = self.workers.actor_rollout.call(ActorRolloutRefWorker.compute_log_probs, batch.select(MODEL_INPUTS, []))
        mask = batch.batch["response_mask"]
        batch.batch["ref_seq_log_probs"] = (out.batch["ref_log_probs"].double() * mask).sum(-1)

    def update_pairs(self, batch: DataProto) -> Dict[str, float]:
        """The DPO update on the actor's ranks (whole pairs each), then the weight sync into the rollout."""
        call = self.workers.actor_rollout.call
        per_rank = call(ActorRolloutRefWorker.update_actor, batch.select(PAIR_UPDATE, []), loss="preference")
        return _mean_over_ranks(per_rank)
