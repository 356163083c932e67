"""PPOTrainer: the RL loop on the single controller. One step, in order:

generate -> reward -> old log-probs -> reference log-probs -> values -> advantages ->
critic update -> actor update -> weight sync -> metrics -> checkpoint / validate

The batch comes from the run's rollout source (`verl.trainer.rollout_source`: generated now, one step ahead, or by
the rollout service within a staleness bound, agent loops or single completions); the loop is the same for each.
It is plain sequential Python in the driver; workers do the heavy work. Every algorithm choice (advantage
estimator, policy loss, KL) is a registry name from the recipe, not a branch here.
"""

from __future__ import annotations

import functools
import time
from typing import Any, Dict, Tuple

from verl.algos import apply_kl_penalty, compute_advantages, estimator_requires, make_kl_controller
from verl.algos.metrics import data_metrics, rollout_mismatch_metrics
from verl.protocol import DataProto
from verl.trainer.balance import balance_batch
from verl.trainer.base import Trainer, mean_over_ranks
from verl.trainer.batch_state import rollout_metrics
from verl.trainer.registry import TRAINERS
from verl.trainer.rollout_source import make_agents, make_rollout_source, prompt_loaders
from verl.trainer.shaping import first_groups, groups_per_share, informative_groups, score_batch, scored_groups
from verl.trainer.timer import StageTimer
from verl.trainer.validation import held_out_metrics
from verl.workers.actor_rollout_ref import ActorRolloutRefWorker
from verl.workers.columns import CRITIC_UPDATE, actor_update_columns, log_prob_inputs, model_non_tensors
from verl.workers.critic import CriticWorker


@TRAINERS.register("ppo")
class PPOTrainer(Trainer):
    """PPO/GRPO training on the single controller.

    with PPOTrainer("recipes/grpo_tiny.yaml", overrides=["trainer.total_steps=10"]) as trainer:
        summary = trainer.fit()
    """

    def setup(self) -> None:
        cfg = self.cfg
        self.kl_ctrl = make_kl_controller(cfg.algorithm.kl_ctrl) if cfg.algorithm.use_kl_in_reward else None
        remax = "reward_baselines" in estimator_requires(cfg.algorithm.adv_estimator)
        self.rollout = make_rollout_source(
            cfg,
            self.plan,
            self.tokenizer,
            self.workers,
            self.train_loader,
            agents=self.agents,
            on_batch=self.add_greedy_baselines if remax else None,
        )

    def scores(self) -> bool:
        return True

    def make_loaders(self) -> Tuple[Any, Any]:
        """(train loader, val loader or None): the prompts of data.train_files and data.val_files (rendered with
        the agent loop's tools, when rollout.agent.loop names one)."""
        self.agents = make_agents(self.cfg, self.plan, self.tokenizer)  # (None without one)
        return prompt_loaders(self.cfg, self.tokenizer, self.agents, self.processor)

    # ---- the stages of one step ---------------------------------------------------------------------
    def add_greedy_baselines(self, prompts: DataProto, batch: DataProto) -> None:
        """ReMax's baseline: the reward of each prompt's greedy response, repeated for its n samples."""
        scores, _ = self.reward(self.rollout.generate(prompts, n=1, temperature=0.0))
        batch.batch["reward_baselines"] = scores.sum(-1).repeat_interleave(self.cfg.rollout.n)

    @functools.cached_property
    def _balance_attention_weight(self) -> float:
        """The weight trainer.balance_cost gives a query-key pair against a token (0: tokens only)."""
        if self.plan.balance_cost != "attention":
            return 0.0
        from transformers import AutoConfig

        from verl.utils.shared_prefix import attention_weight_of

        return attention_weight_of(AutoConfig.from_pretrained(self.model_path))

    def score(self, batch: DataProto) -> Dict[str, float]:
        return score_batch(batch, self.reward, self.cfg.algorithm.overlong_buffer, self.plan.response_length)

    def dynamic_sampling(self, batch: DataProto) -> Tuple[DataProto, Dict[str, float]]:
        """DAPO: keep only prompt groups whose rewards differ, generating more batches until
        data.train_batch_size groups are kept (or filter_groups.max_num_gen_batches is reached)."""
        fg, n, want = self.cfg.algorithm.filter_groups, self.cfg.rollout.n, self.cfg.data.train_batch_size
        parts, dropped, tries = [], 0, 1
        while True:
            kept, d = informative_groups(batch, fg.metric)
            parts.append(kept)
            dropped += d
            have = sum(len(p) for p in parts) // n
            if have >= want or (fg.max_num_gen_batches and tries >= fg.max_num_gen_batches):
                break
            batch = self.rollout.extra_batch(self.step)
            self.score(batch)
            tries += 1
        # Whole groups, and a number of rows every data-parallel rank can split evenly.
        groups = min(have, want)
        dp = self.plan.train_dp
        groups -= groups % groups_per_share(dp, n)
        if groups == 0:
            raise RuntimeError(
                f"dynamic sampling kept no prompt group with differing rewards in {tries} rollout batches "
                "(algorithm.filter_groups): raise max_num_gen_batches, or check the reward function"
            )
        metrics = {
            "actor/filtered_groups": float(dropped),
            "actor/gen_batches": float(tries),
            "actor/kept_groups": float(groups),
        }
        return first_groups(parts, n, groups), metrics

    def compute_log_probs(self, batch: DataProto) -> DataProto:
        """Old (and reference) log-probs in one call to the actor's workers (old ones only when the plan
        recomputes them); values from the critic's."""
        inputs = batch.select(log_prob_inputs(self.cfg), model_non_tensors(batch))
        if any(r.name in ("actor", "ref") for r in self.plan.log_prob_passes):
            batch = batch.union(self.workers.actor_rollout.call(ActorRolloutRefWorker.compute_log_probs, inputs))
        if self.workers.critic is not None:
            batch = batch.union(self.workers.critic.call(CriticWorker.compute_values, inputs))
        return batch

    def compute_advantages(self, batch: DataProto) -> Dict[str, float]:
        b, metrics = batch.batch, {}
        if self.kl_ctrl is not None:
            rewards, kl_metrics = apply_kl_penalty(
                b["token_level_scores"],
                b["old_log_probs"],
                b["ref_log_probs"],
                b["response_mask"],
                kl_ctrl=self.kl_ctrl,
                kind=self.cfg.algorithm.kl_penalty,
            )  # also advances the KL controller
            metrics.update({f"actor/reward_{k}": float(v) for k, v in kl_metrics.items()})
        else:
            rewards = b["token_level_scores"]
        b["token_level_rewards"] = rewards
        b["advantages"], b["returns"] = compute_advantages(
            self.cfg.algorithm.adv_estimator,
            rewards,
            b["response_mask"],
            config=self.cfg.algorithm,
            index=batch.non_tensor_batch["uid"],
            values=b.get("values"),
            reward_baselines=b.get("reward_baselines"),
        )
        return metrics

    def update(self, batch: DataProto) -> Dict[str, float]:
        """Critic, then actor updates; the actor's ends with the weight sync into the rollout (its metrics:
        perf/weight_sync_bytes and perf/weight_sync_comm_bytes summed over ranks, timing/weight_sync_s)."""
        metrics: Dict[str, float] = {}
        if self.workers.critic is not None:
            metrics.update(
                mean_over_ranks(self.workers.critic.call(CriticWorker.update_critic, batch.select(CRITIC_UPDATE, [])))
            )
        update = actor_update_columns(self.cfg, self.plan.old_log_probs == "recompute")
        actor_batch = batch.select(update, model_non_tensors(batch))
        call = self.workers.actor_rollout.call
        metrics.update(
            mean_over_ranks(call(ActorRolloutRefWorker.update_actor, actor_batch, entropy=self.entropy_due()))
        )
        return metrics

    def entropy_due(self) -> bool:
        """Whether this step's update measures the policy's entropy as a metric: on the first, the last and every
        actor.entropy_every-th step (not free for a large vocabulary). The worker computes it on every step where
        actor.entropy_coeff puts it in the loss."""
        every, step = self.cfg.actor.entropy_every, self.step + 1  # the step being trained
        return every > 0 and (step % every == 0 or step in (1, self.plan.total_steps))

    # ---- one step, validation, checkpoints ----------------------------------------------------------
    def train_step(self) -> Dict[str, float]:
        timer = StageTimer()
        self.workers.take_stats()  # count this step's calls only (not validation's or a checkpoint's)
        start = time.perf_counter()
        with timer("gen"):  # with one_step_off / async: the wait for a batch generated beside the last step(s)
            batch, rollout_info = self.rollout.next_batch(self.step)
        with timer("reward"):
            metrics = self.score(batch)
        if self.reward.last_missing is not None and self.cfg.reward.server.on_timeout == "skip":
            batch, dropped = scored_groups(batch, self.reward.last_missing, self.cfg.rollout.n, self.plan.train_dp)
            metrics["reward/server_dropped_groups"] = float(dropped)
        if self.cfg.algorithm.filter_groups.enable:
            with timer("gen"):
                batch, sampling_metrics = self.dynamic_sampling(batch)
            metrics.update(sampling_metrics)
        if self.plan.balance_dp > 1:  # whole prompt groups onto the data-parallel ranks, even in tokens
            batch, balance_metrics = balance_batch(
                batch,
                self.plan.balance_dp,
                shared_prefix="actor" in self.plan.shared_prefix,
                attention_weight=self._balance_attention_weight,
            )
            metrics.update(balance_metrics)
        metrics_of_rollout = rollout_metrics(batch, self.step)
        with timer("log_probs"):
            batch = self.compute_log_probs(batch)
        b = batch.batch
        if "old_log_probs" in b.keys():  # else the update measures the mismatch on its own forward
            mismatch = rollout_mismatch_metrics(b["old_log_probs"], b["rollout_log_probs"], b["response_mask"])
            metrics.update({k: float(v) for k, v in mismatch.items()})
        with timer("adv"):
            metrics.update(self.compute_advantages(batch))
        with timer("update"):
            metrics.update(self.update(batch))
        metrics.update(self.rollout.update_weights(self.step + 1, timer))  # (policy version = updates so far)
        step_s = time.perf_counter() - start
        metrics.update(metrics_of_rollout)
        metrics.update(rollout_info)
        train_s = sum(timer.metrics().get(f"timing/{k}_s", 0.0) for k in ("log_probs", "adv", "update"))
        metrics.update(self.rollout.busy_metrics(train_s, step_s))
        metrics.update(
            data_metrics(
                response_mask=b["response_mask"],
                token_level_scores=b["token_level_scores"],
                token_level_rewards=b["token_level_rewards"],
                advantages=b["advantages"],
                returns=b["returns"],
                values=b.get("values"),
                max_response_length=b["responses"].shape[1],
            )
        )
        return {**metrics, **self.step_metrics(timer, start, batch)}

    def evaluate(self) -> Dict[str, float]:
        r = self.cfg.rollout
        return held_out_metrics(
            self.rollout, self.reward, self.val_loader, r.val_temperature, r.val_n, r.val_sample_temperature
        )

    def checkpoint_state(self) -> Dict[str, Any]:
        kl_coef = self.kl_ctrl.value if self.kl_ctrl is not None else None
        return {**self.rollout.state(), "kl_coef": kl_coef}

    def restore_state(self, state: Dict[str, Any], path: str) -> None:
        if self.kl_ctrl is not None and state["kl_coef"] is not None:
            self.kl_ctrl.value = state["kl_coef"]
        self.rollout.restore(state, path, self.step)

    def write_checkpoint(self, path: str) -> None:
        super().write_checkpoint(path)
        self.rollout.save(path)

    def close(self) -> None:
        self.rollout.close()
        super().close()
