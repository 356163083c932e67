"""DPOTrainer and OnlineDPOTrainer: preference optimisation on the single controller. One step:

dpo:         pairs from data.train_files ----------------------------------> reference log-probs -> DPO update
online_dpo:  generate rollout.n -> reward -> best and worst of each prompt -> reference log-probs -> DPO update

The update (algorithm.dpo: loss, beta, label_smoothing) runs on the actor's workers with whole (chosen, rejected)
pairs per rank and per micro-batch, and ends with the weight sync into the rollout, as PPO's does. Validation
generates through the run's rollout source and scores, as PPO's does; checkpoints, exact resume, tracking and the
run summary are every trainer's (`verl.trainer.base.Trainer`).
"""

from __future__ import annotations

import time
from typing import Any, Dict, Tuple

from verl.data.build import make_preference_loader, make_val_loader
from verl.protocol import DataProto
from verl.trainer.base import Trainer, mean_over_ranks
from verl.trainer.registry import TRAINERS
from verl.trainer.rollout_source import make_rollout_source, prompt_loaders
from verl.trainer.shaping import best_and_worst, score_batch
from verl.trainer.timer import StageTimer
from verl.trainer.validation import held_out_metrics
from verl.workers.actor_rollout_ref import ActorRolloutRefWorker
from verl.workers.columns import MODEL_INPUTS

PAIR_UPDATE = MODEL_INPUTS + ("response_mask", "ref_seq_log_probs", "is_chosen")


@TRAINERS.register("dpo")
class DPOTrainer(Trainer):
    """DPO / IPO on the preference pairs of data.train_files.

    with DPOTrainer("recipes/dpo_tiny.yaml") as trainer:   # or verl.RLTrainer: the class algorithm.name picks
        print(trainer.fit())
    """

    def setup(self) -> None:
        self.rollout = make_rollout_source(self.cfg, self.plan, self.tokenizer, self.workers, self.train_loader)

    def scores(self) -> bool:
        """Offline DPO scores only held-out generations, if any."""
        return bool(self.cfg.data.val_files)

    def make_loaders(self) -> Tuple[Any, Any]:
        """(chosen, rejected) pairs of data.train_files; held-out prompts of data.val_files (validation generates
        and scores, as PPO's)."""
        seed = self.cfg.trainer.seed
        train = make_preference_loader(self.cfg.data, self.tokenizer, seed=seed)
        if not train.dataset.has_ref and not self.plan.has("ref"):
            raise ValueError(
                f"ref.enable=false needs the reference's log-probs in the data: {train.dataset.files} lack the "
                "columns ref_chosen_logps and ref_rejected_logps; add them, or set ref.enable=true"
            )
        return train, make_val_loader(self.cfg.data, self.tokenizer, seed=seed)

    def next_pairs(self, timer: StageTimer) -> Tuple[DataProto, Dict[str, float]]:
        """This step's (chosen, rejected) rows, adjacent, and metrics about them."""
        batch = self.train_loader.next_batch()
        return batch, {"dpo/pairs": float(len(batch) // 2)}

    def train_step(self) -> Dict[str, float]:
        timer = StageTimer()
        self.workers.take_stats()
        start = time.perf_counter()
        batch, metrics = self.next_pairs(timer)
        if len(batch):  # (online: every group of this step may have tied)
            with timer("log_probs"):
                self.add_reference(batch)
            with timer("update"):
                metrics.update(self.update_pairs(batch))
            metrics.update(self.rollout.update_weights(self.step + 1, timer))  # (checked in place, or sent apart)
        return {**metrics, **self.step_metrics(timer, start, batch)}

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
        return mean_over_ranks(per_rank)

    def evaluate(self) -> Dict[str, float]:
        r = self.cfg.rollout
        return held_out_metrics(
            self.rollout, self.reward, self.val_loader, r.val_temperature, r.val_n, r.val_sample_temperature
        )

    def checkpoint_state(self) -> Dict[str, Any]:
        return self.rollout.state()

    def restore_state(self, state: Dict[str, Any], path: str) -> None:
        self.rollout.restore(state, path, self.step)

    def write_checkpoint(self, path: str) -> None:
        super().write_checkpoint(path)
        self.rollout.save(path)

    def close(self) -> None:
        self.rollout.close()
        super().close()


@TRAINERS.register("online_dpo")
class OnlineDPOTrainer(DPOTrainer):
    """Online DPO: rollout.n samples per prompt, ranked by the reward; each prompt's best and worst make a pair."""

    def scores(self) -> bool:
        return True

    def make_loaders(self) -> Tuple[Any, Any]:
        """Prompts of data.train_files and data.val_files, as PPO's."""
        return prompt_loaders(self.cfg, self.tokenizer)

    def next_pairs(self, timer: StageTimer) -> Tuple[DataProto, Dict[str, float]]:
        with timer("gen"):
            batch, metrics = self.rollout.next_batch(self.step)
        with timer("reward"):
            overlong = self.cfg.algorithm.overlong_buffer
            metrics.update(score_batch(batch, self.reward, overlong, self.plan.response_length))
        batch, pair_metrics = best_and_worst(batch, self.cfg.rollout.n, multiple=self.plan.train_dp)
        return batch, {**metrics, **pair_metrics}
