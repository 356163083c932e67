"""PPOTrainer: the RL loop on the single controller. One step, in order:

generate -> reward -> old log-probs -> reference log-probs -> values -> advantages ->
critic update -> actor update -> weight sync -> metrics -> checkpoint / validate

With trainer.mode=one_step_off the rollout (on a pool of its own) generates the next step's batch while the actor
trains on this one: `next_rollout` hands out the batch started a step earlier and starts the next. With
trainer.mode=async the rollout service generates up to trainer.max_staleness batches ahead (`AsyncRollouts`).

The loop is plain sequential Python in the driver; workers do the heavy work. Every algorithm choice
(advantage estimator, policy loss, KL) is a registry name from the recipe, not a branch here.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from verl.algos import apply_kl_penalty, compute_advantages, estimator_requires, load_plugins, make_kl_controller
from verl.algos.metrics import data_metrics, rollout_mismatch_metrics
from verl.config.errors import ConfigError
from verl.config.loader import load_config
from verl.config.plan import Plan
from verl.config.run_checks import check_run
from verl.config.schema import VerlConfig
from verl.config.validate import errors, validate_and_plan
from verl.controller import init_ray, shutdown_ray
from verl.data.build import make_rl_dataloaders
from verl.protocol import DataProto
from verl.reward import make_reward_manager
from verl.reward.server_scores import ServerScores, start_reward_server
from verl.tracking import Progress, Tracker
from verl.trainer.agent_rollouts import AgentRollouts
from verl.trainer.async_agent_rollouts import AsyncAgentRollouts
from verl.trainer.async_rollouts import AsyncRollouts
from verl.trainer.balance import balance_batch
from verl.trainer.checkpoint import CheckpointManager, checkpoint_root
from verl.trainer.fingerprint import fingerprint
from verl.trainer.profile import StepProfiler
from verl.trainer.rollout_batches import PendingRollout, batch_from_state, batch_state, rollout_metrics
from verl.trainer.rollout_client import RolloutClient
from verl.trainer.shaping import add_overlong_penalty, first_groups, informative_groups, scored_groups
from verl.trainer.timer import StageTimer
from verl.trainer.warm_start import prepare_model
from verl.trainer.workers import start_workers
from verl.utils.process import seconds_since_start
from verl.utils.rng import get_rng_state, set_rng_state
from verl.workers.actor_rollout_ref import ActorRolloutRefWorker
from verl.workers.columns import CRITIC_UPDATE, MODEL_INPUTS, PROMPTS, actor_update_columns
from verl.workers.critic import CriticWorker
from verl.workers.engines import eos_and_pad
from verl.workers.rollout import RolloutWorker

logger = logging.getLogger(__name__)


def pad_to_multiple(batch: DataProto, k: int) -> tuple[DataProto, int]:
    """Repeat the first rows so len(batch) divides by k (validation sets of any size over dp ranks)."""
    pad = (-len(batch)) % k
    if pad == 0:
        return batch, 0
    return DataProto.concat([batch, batch[list(range(pad))]]), pad


def tokens_in(batch: DataProto) -> int:
    """Prompt plus response tokens actually processed (padding excluded): HybridFlow's throughput unit."""
    return int(batch.batch["attention_mask"].sum())


def resolve_config(config: Any, overrides: Sequence[str] = (), reward_given: bool = False) -> Tuple[DictConfig, Plan]:
    """A config (a loaded DictConfig, a recipe path, or a plain dict of sections) checked as `verl train` checks
    it, files included: ConfigError listing every problem at once; warnings are logged. Returns the config and
    its plan. `reward_given`: the caller passes a reward function, so the config need not name one."""
    if isinstance(config, VerlConfig):
        config = OmegaConf.structured(config)
    if isinstance(config, DictConfig) and OmegaConf.get_type(config) is not VerlConfig:
        config = OmegaConf.to_container(config)  # an untyped DictConfig: checked like a dict
    if isinstance(config, (str, os.PathLike, Mapping)) and not isinstance(config, DictConfig):
        config = load_config(config, overrides)
    elif overrides:
        raise ValueError("overrides apply to a recipe path or a dict; merge them into a loaded config yourself")
    plan, problems = validate_and_plan(config, strict=True)
    problems += check_run(config, [r for r in ("critic",) if plan is not None and plan.has(r)], True, reward_given)
    for problem in problems:
        if problem.severity != "error":
            logger.warning("%s", problem.format())
    if errors(problems):
        raise ConfigError(errors(problems))
    return config, plan


class PPOTrainer:
    """PPO/GRPO training on the single controller.

        trainer = PPOTrainer("recipes/grpo_tiny.yaml", overrides=["trainer.total_steps=10"])
        summary = trainer.fit()
        trainer.close()

    `config` is a loaded config, a recipe path or a plain dict of sections; it is validated as the CLI does
    (every problem at once, as a ConfigError) unless the caller passes the `plan` it already made from it.
    """

    def __init__(
        self,
        config: Any,
        reward_fn: Optional[Callable] = None,
        *,
        overrides: Sequence[str] = (),
        plan: Optional[Plan] = None,
    ):
        if plan is None:
            config, plan = resolve_config(
                config, overrides, reward_given=reward_fn is not None
            )  # (validation imports trainer.plugins)
        else:
            load_plugins(config.trainer.plugins)  # user registrations before any name is looked up
        self.cfg = cfg = config
        self.started_ray = False
        if plan.controller == "ray":
            # A local cluster gets at least one CPU per placed device (a CPU run places worker processes).
            local = not os.environ.get("RAY_ADDRESS")
            self.started_ray = init_ray(num_cpus=max(os.cpu_count() or 1, plan.world_size) if local else None)
        self.output_dir = cfg.trainer.output_dir
        self.model_path = prepare_model(cfg)
        from transformers import AutoTokenizer

        tokenizer_path = cfg.model.tokenizer_path or self.model_path
        self.tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
        self.plan = plan  # (its total steps are known once the data is read, below)
        # validation pads its prompts to a multiple of this (an SFT run has no rollout)
        self.dp = plan.layout("rollout").dp if plan.has("rollout") else plan.train_dp
        self.agents = self._agent_rollouts(plan) if cfg.rollout.agent.loop is not None else None
        self.train_loader, self.val_loader = self.make_loaders()
        total_steps = cfg.trainer.total_steps or len(self.train_loader) * cfg.trainer.total_epochs
        self.plan = plan = plan.with_total_steps(total_steps)
        self.use_critic = plan.has("critic")
        self.kl_ctrl = make_kl_controller(cfg.algorithm.kl_ctrl) if cfg.algorithm.use_kl_in_reward else None
        self.checkpoints = CheckpointManager(checkpoint_root(cfg), keep_last=cfg.checkpoint.keep_last)
        self.fingerprint = fingerprint(cfg)  # saved with each checkpoint: what `resume: auto` compares
        self.tracker = Tracker(
            cfg.tracking,
            run_config=OmegaConf.to_container(cfg, resolve=True),
            log_dir=cfg.tracking.log_dir or os.path.join(self.output_dir, "logs"),
        )
        self.workers = start_workers(cfg, plan, model_path=self.model_path, tokenizer_path=cfg.model.tokenizer_path)
        self.reward_server = start_reward_server(cfg) if self.scores() and cfg.reward.server is not None else None
        self.reward = (
            make_reward_manager(
                cfg.reward,
                self.tokenizer,
                reward_fn=reward_fn,
                server=ServerScores(self.reward_server, cfg.reward.server) if self.reward_server else None,
                model=self.workers.reward_model,  # the reward model on its workers (None: built here when set)
            )
            if self.scores()
            else None
        )
        self.step = 0
        self.rollouts = 0  # generate() calls: part of every uid, so groups of different batches never merge
        self.ahead: Optional[PendingRollout] = None  # one_step_off: the next step's batch, generating
        self.rollout_gen_s = 0.0  # seconds the rollout's own pool generated, of the batches collected this step
        self.async_rollouts = self._async_rollouts() if plan.mode == "async" else None
        # one_step_off with agent loops: the loops of the batch ahead run on this thread while the actor trains
        self.agent_thread = ThreadPoolExecutor(1, "agents") if self.agents and plan.mode == "one_step_off" else None
        self.val_history: List[Dict[str, float]] = []
        self.profiler = StepProfiler(cfg.trainer.profile, self.output_dir, plan.controller)

    def scores(self) -> bool:
        """Whether this run scores samples (and so needs a reward): every RL run does."""
        return True

    def make_loaders(self) -> Tuple[Any, Any]:
        """(train loader, val loader or None): the prompts of data.train_files and data.val_files."""
        tools = self.agents and self.agents.runner.tool_schemas
        return make_rl_dataloaders(self.cfg.data, self.tokenizer, seed=self.cfg.trainer.seed, tools=tools)

    def _async_rollouts(self) -> AsyncRollouts:
        """trainer.mode=async: the rollout service on every rank of the rollout's pool, fed ahead of training."""
        r = self.cfg.rollout
        client = RolloutClient(
            self.workers.rollout,
            chunk=r.service_chunk_tokens,
            max_batch=r.service_max_batch,
            pool=self.plan.pool("rollout").name,
            on_failure=r.on_replica_failure,
        )
        eos_ids, pad_id = eos_and_pad(self.tokenizer)
        make = functools.partial(AsyncAgentRollouts, agents=self.agents) if self.agents else AsyncRollouts
        return make(
            client,
            read_prompts=lambda: self.with_uids(self.train_loader.next_batch()),
            data_position=self.train_loader.state_dict,
            n=r.n,
            temperature=r.temperature,
            response_length=self.plan.response_length,
            eos_ids=eos_ids,
            pad_id=pad_id,
            max_staleness=self.cfg.trainer.max_staleness,
            total_steps=self.plan.total_steps,
            on_stale=self.cfg.trainer.on_stale,
            row_multiple=self.plan.train_dp,
        )

    def _agent_rollouts(self, plan: Plan) -> AgentRollouts:
        """rollout.agent.loop: trajectories of agent loops (tools, environments) instead of single completions."""
        eos_ids, pad_id = eos_and_pad(self.tokenizer)
        return AgentRollouts(
            self.cfg.rollout.agent,
            self.tokenizer,
            response_length=plan.response_length,
            max_prompt_length=self.cfg.data.max_prompt_length,
            dp=self.dp,
            eos_ids=eos_ids,
            pad_id=pad_id,
        )

    # ---- the stages of one step ---------------------------------------------------------------------
    def next_rollout(self) -> DataProto:
        """This step's generated batch. sync: generated now. one_step_off: the one started during the last step
        (by the weights before that step's update), and the next step's is started now, to generate while this one
        trains (its prompts are read from the data now, so a checkpoint's data position includes them). async: the
        rollout service's batch for this step, once all its samples are done (the next ones keep generating)."""
        if self.async_rollouts is not None:
            batch, self.rollout_info = self.async_rollouts.take(self.step)
            self._drop_failed_replicas()
            counters = self.async_rollouts.client.take_counters()
            self.rollout_gen_s += counters.get("busy_s", 0.0) / max(1, len(self.async_rollouts.client.replicas))
            self.rollout_info["async/interrupted"] = counters.get("interrupted", 0.0)  # samples midway at a sync
            if counters.get("busy_s"):  # what the rollout pool generated while it was busy, all replicas
                self.rollout_info["perf/rollout_tokens_per_s"] = (
                    counters["tokens"] / counters["busy_s"] * len(self.async_rollouts.client.replicas)
                )
            return batch
        pending = self.ahead or self.submit_generate(self.train_loader.next_batch())
        self.ahead = None
        if self.plan.mode == "one_step_off" and self.step + 1 < self.plan.total_steps:
            self.ahead = self.submit_generate(self.train_loader.next_batch())
        return pending.result()

    def _drop_failed_replicas(self) -> None:
        """rollout.on_replica_failure=continue: the weights go to the replicas still alive."""
        alive = [r for r in self.workers.rollout_ranks if r not in self.async_rollouts.client.dead]
        if alive != self.workers.rollout_ranks:
            self.workers.join_weight_transfer(alive)

    def generate(self, prompts: DataProto) -> DataProto:
        return self.submit_generate(prompts).result()

    def with_uids(self, prompts: DataProto) -> DataProto:
        """One uid per prompt: group estimators (GRPO, RLOO) compare the samples that share it."""
        self.rollouts += 1
        uids = [f"{self.step}-{self.rollouts}-{i}" for i in range(len(prompts))]
        prompts.non_tensor_batch["uid"] = np.array(uids, dtype=object)
        return prompts

    def submit_generate(self, prompts: DataProto) -> PendingRollout:
        """Start generating rollout.n samples per prompt; the result is the whole batch (with its text columns)."""
        prompts = self.with_uids(prompts)
        pending = self.submit_sample(prompts, n=self.cfg.rollout.n)

        def finish() -> DataProto:
            batch = pending()
            if "reward_baselines" in estimator_requires(self.cfg.algorithm.adv_estimator):
                batch.batch["reward_baselines"] = self.greedy_baselines(prompts)
            return batch

        return PendingRollout(finish)

    def sample(self, prompts: DataProto, n: int, temperature: Optional[float] = None) -> DataProto:
        return self.submit_sample(prompts, n, temperature)()

    def submit_sample(self, prompts: DataProto, n: int, temperature: Optional[float] = None) -> Callable[[], DataProto]:
        """Start sampling n responses per prompt (samples of a prompt adjacent); returns what waits for them. Only
        the prompt tensors travel to the workers; the text columns (raw prompts, ground truths, uids) stay here and
        are repeated alongside. The rollout's own pool generates when it has one, else the actor's workers do."""
        inputs = prompts.select(PROMPTS, [])
        text = prompts.select([], None).repeat(n, interleave=True)
        if self.agents is not None:
            return self._submit_agents(prompts, n, temperature, text)
        if self.workers.rollout is not None:
            call = self.workers.rollout.submit(RolloutWorker.generate, inputs, n=n, temperature=temperature)
        else:
            call = self.workers.actor_rollout.submit(
                ActorRolloutRefWorker.generate, inputs, n=n, temperature=temperature
            )

        def finish() -> DataProto:
            out = call.result()
            seconds = [out.meta_info.pop(k) for k in [k for k in out.meta_info if k.startswith("gen_s/")]]
            self.rollout_gen_s += max(seconds, default=0.0)  # the slowest replica's: how long the pool was busy
            return out.union(text)

        return finish

    def _submit_agents(
        self, prompts: DataProto, n: int, temperature: Optional[float], text: DataProto
    ) -> Callable[[], DataProto]:
        """The agent loops' trajectories for n samples per prompt; each round of model turns is one generate call
        on the rollout's workers. The agent/* metrics travel in the batch's meta_info["agent_metrics"]."""
        group, method = (
            (self.workers.rollout, RolloutWorker.generate)
            if self.workers.rollout is not None
            else (self.workers.actor_rollout, ActorRolloutRefWorker.generate)
        )

        def call(inputs: DataProto, t: Optional[float], max_new_tokens: int) -> DataProto:
            out = group.call(method, inputs, n=1, temperature=t, max_new_tokens=max_new_tokens)
            for k in [k for k in out.meta_info if k.startswith("gen_s/")]:
                out.meta_info.pop(k)
            return out

        def run() -> DataProto:
            batch, metrics = self.agents.sample(prompts, n, temperature, call)
            self.rollout_gen_s += metrics["timing/agent_generate_s"]
            batch.meta_info["agent_metrics"] = metrics
            return batch.union(text)

        if self.agent_thread is not None:
            return self.agent_thread.submit(run).result
        return run

    def greedy_baselines(self, prompts: DataProto) -> torch.Tensor:
        """ReMax's baseline: the reward of each prompt's greedy response, repeated for its n samples."""
        scores, _ = self.reward(self.sample(prompts, n=1, temperature=0.0))
        return scores.sum(-1).repeat_interleave(self.cfg.rollout.n)

    @functools.cached_property
    def _balance_attention_weight(self) -> float:
        """The weight trainer.balance_cost gives a query-key pair against a token (0: tokens only)."""
        if self.cfg.trainer.balance_cost != "attention":
            return 0.0
        from transformers import AutoConfig

        from verl.utils.shared_prefix import attention_weight_of

        return attention_weight_of(AutoConfig.from_pretrained(self.model_path))

    def score(self, batch: DataProto) -> Dict[str, float]:
        scores, metrics = self.reward(batch)
        batch.batch["token_level_scores"] = scores
        overlong = self.cfg.algorithm.overlong_buffer
        if overlong.enable:
            metrics["reward/overlong_penalty_mean"] = add_overlong_penalty(batch, overlong, self.plan.response_length)
        return metrics

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
            batch = self.generate(self.train_loader.next_batch())
            self.score(batch)
            tries += 1
        # Whole groups, and a number of rows every data-parallel rank can split evenly.
        groups = min(have, want)
        dp = self.plan.train_dp
        groups -= groups % max(1, dp // math.gcd(dp, n))
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
        inputs = batch.select(MODEL_INPUTS, [])
        if any(r.name in ("actor", "ref") for r in self.plan.log_prob_passes):
            batch = batch.union(self.workers.actor_rollout.call(ActorRolloutRefWorker.compute_log_probs, inputs))
        if self.use_critic:
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
        if self.use_critic:
            metrics.update(
                _mean_over_ranks(self.workers.critic.call(CriticWorker.update_critic, batch.select(CRITIC_UPDATE, [])))
            )
        actor_batch = batch.select(actor_update_columns(self.cfg, self.plan.old_log_probs == "recompute"), [])
        call = self.workers.actor_rollout.call
        metrics.update(
            _mean_over_ranks(call(ActorRolloutRefWorker.update_actor, actor_batch, entropy=self.entropy_due()))
        )
        return metrics

    def sync_rollout(self) -> Dict[str, float]:
        """A rollout on its own pool gets the updated weights (policy version = updates so far); a colocated
        one got them at the end of the actor's update."""
        if self.async_rollouts is not None:  # a replica that died since the batch was taken leaves the group first
            self.async_rollouts.client.check_alive()
            self._drop_failed_replicas()
        return self.workers.sync_weights(self.step + 1)

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
        self.rollout_info: Dict[str, float] = {}
        with timer("gen"):  # with one_step_off / async: the wait for a batch generated beside the last step(s)
            batch = self.next_rollout()
        self.rollout_info.update(batch.meta_info.pop("agent_metrics", {}))
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
        if self.workers.rollout is not None:  # its own pool: waits for a batch it is generating, then loads
            with timer("rollout_sync"):
                metrics.update(self.sync_rollout())
        step_s = time.perf_counter() - start
        metrics.update(metrics_of_rollout)
        metrics.update(self.rollout_info)
        if self.workers.rollout is not None:  # how busy each pool was over the step
            train_s = sum(timer.metrics().get(f"timing/{k}_s", 0.0) for k in ("log_probs", "adv", "update"))
            metrics["perf/train_busy_fraction"] = min(1.0, train_s / step_s)
            metrics["perf/rollout_busy_fraction"] = min(1.0, self.rollout_gen_s / step_s)
            metrics["timing/rollout_gen_s"] = self.rollout_gen_s
        self.rollout_gen_s = 0.0
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
        metrics.update(timer.metrics())
        metrics.update(self.workers.take_stats())
        metrics.update({"timing/step_s": step_s, "perf/tokens_per_s": tokens_in(batch) / step_s})
        return metrics

    def validate(self) -> Dict[str, float]:
        """One response per held-out prompt at rollout.val_temperature (0: greedy); val/accuracy is the fraction
        of samples scored > 0."""
        if self.val_loader is None:
            return {}
        scores: List[torch.Tensor] = []
        for prompts in self.val_loader:
            if self.async_rollouts is not None:  # through the service, beside the batches it generates ahead
                out = self.async_rollouts.generate_now(prompts, self.cfg.rollout.val_temperature)
                self._drop_failed_replicas()
            else:
                prompts, pad = pad_to_multiple(prompts, self.dp)
                out = self.sample(prompts, n=1, temperature=self.cfg.rollout.val_temperature)
                if pad:
                    out = out[list(range(len(out) - pad))]
            seq_scores, _ = self.reward(out)
            scores.append(seq_scores.sum(-1))
        s = torch.cat(scores)
        metrics = {
            "val/accuracy": float((s > 0).float().mean()),
            "val/score/mean": float(s.mean()),
            "val/n": float(len(s)),
        }
        self.val_history.append({"step": self.step, **metrics})
        return metrics

    def save_checkpoint(self) -> str:
        def write(path: str) -> None:
            self.workers.actor_rollout.call(ActorRolloutRefWorker.save_checkpoint, path)
            if self.workers.critic is not None:
                self.workers.critic.call(CriticWorker.save_checkpoint, path)
            if self.workers.rollout is not None and self.async_rollouts is None:  # (async: no sampler state to keep)
                self.workers.rollout.call(RolloutWorker.save_checkpoint, path)

        # async: the data position before the oldest batch in flight (a resumed run generates those anew)
        async_ = self.async_rollouts
        state = {
            "step": self.step,
            "data": async_.data_position() if async_ is not None else self.train_loader.state_dict(),
            "in_flight": async_.in_flight_samples() if async_ is not None else 0,
            "kl_coef": self.kl_ctrl.value if self.kl_ctrl is not None else None,
            "rng": get_rng_state(),
            "val_history": self.val_history,
            "rollouts": self.rollouts,
            # one_step_off: the next step's batch, generated by the weights before this step's update (its prompts
            # are already past the data position); resuming trains on it, as the uninterrupted run would
            "ahead": batch_state(self.ahead.result()) if self.ahead is not None else None,
        }
        return self.checkpoints.save(self.step, write, state, run=self.fingerprint)

    def maybe_resume(self) -> None:
        for name in self.checkpoints.remove_incomplete():
            print(f"verl: removed {os.path.join(self.checkpoints.root, name)}: an incomplete checkpoint", flush=True)
        mode = self.cfg.trainer.resume
        path = None if mode == "disable" else (self.checkpoints.latest() if mode == "auto" else mode)
        if path is None:
            return
        state = self.checkpoints.load_state(path)
        self.workers.actor_rollout.call(ActorRolloutRefWorker.load_checkpoint, path)
        if self.workers.critic is not None:
            self.workers.critic.call(CriticWorker.load_checkpoint, path)
        self.step = state["step"]
        self.train_loader.load_state_dict(state["data"])
        if self.kl_ctrl is not None and state["kl_coef"] is not None:
            self.kl_ctrl.value = state["kl_coef"]
        set_rng_state(state["rng"])
        self.val_history = state["val_history"]
        self.rollouts = state.get("rollouts", self.rollouts)
        if self.workers.rollout is not None:  # its sampler's state (not kept by async), then the actor's weights
            if self.async_rollouts is None:
                self.workers.rollout.call(RolloutWorker.load_checkpoint, path)
            self.workers.sync_weights(self.step)
        if state.get("ahead") is not None:
            ahead = batch_from_state(state["ahead"])
            self.ahead = PendingRollout(lambda: ahead)
        if self.async_rollouts is not None:
            self.async_rollouts.start_at(self.step)
            print(
                f"verl: {state.get('in_flight', 0)} samples were generating when that checkpoint was written; "
                "their prompts are generated anew",
                flush=True,
            )
        self.tracker.resume_at(self.step)  # each step appears once in the logs, however often the run was killed
        logger.info("resumed from %s at step %d", path, self.step)
        print(f"verl: resumed from {path} (step {self.step})", flush=True)
        if self.step >= self.plan.total_steps:
            print(
                f"verl: that run is finished (trainer.total_steps={self.plan.total_steps}): nothing to train. Raise "
                "trainer.total_steps to train it further, or give a new run its own trainer.output_dir",
                flush=True,
            )

    def fit(self) -> Dict[str, Any]:
        """Train to trainer.total_steps; returns a summary (validation before/after, throughput)."""
        t = self.cfg.trainer
        self.maybe_resume()
        run_start, tokens, step_seconds, first_step_s = time.perf_counter(), 0.0, 0.0, None
        if t.val_before_train and self.step == 0:
            self.tracker.log(self.validate(), step=0)
        total = self.plan.total_steps
        progress = Progress(total)
        try:
            while self.step < total:
                with self.profiler.step(self.step + 1):
                    metrics = self.train_step()
                self.step += 1
                if first_step_s is None:  # start-up included: imports, Ray, workers, model loading
                    first_step_s = seconds_since_start()
                tokens += metrics["perf/tokens_per_s"] * metrics["timing/step_s"]
                step_seconds += metrics["timing/step_s"]
                last = self.step == total
                if (t.val_every and self.step % t.val_every == 0) or last:  # the last: the summary's "after"
                    val_start = time.perf_counter()
                    metrics.update(self.validate())
                    metrics["timing/val_s"] = time.perf_counter() - val_start
                if self.step % t.log_every == 0 or last:
                    self.tracker.log(metrics, step=self.step)
                progress.update(self.step, metrics)
                every, final = self.cfg.checkpoint.save_every, self.cfg.checkpoint.save_last
                if (every and self.step % every == 0) or (last and final):
                    self.save_checkpoint()
            if self.cfg.checkpoint.save_hf:
                self.workers.actor_rollout.call(ActorRolloutRefWorker.export_hf, os.path.join(self.output_dir, "hf"))
        finally:
            progress.close()
            self.tracker.close()
        return self.summary(time.perf_counter() - run_start, tokens / max(step_seconds, 1e-9), first_step_s)

    def train(self) -> Dict[str, Any]:
        """`fit()`, under the name some of verl's documentation uses."""
        return self.fit()

    def summary(self, seconds: float, tokens_per_s: float, first_step_s: Optional[float] = None) -> Dict[str, Any]:
        at = {v["step"]: v["val/accuracy"] for v in self.val_history if "val/accuracy" in v}
        return {
            "steps": self.step,
            "seconds": seconds,
            "tokens_per_s": tokens_per_s,
            "first_step_s": first_step_s,  # process start to the end of its first step; None: no step trained
            "val_accuracy_before": at.get(0),  # None when trainer.val_before_train is off
            "val_accuracy_after": at.get(self.step),
        }

    def close(self) -> None:
        if self.reward_server is not None:
            self.reward_server.close()
        if self.async_rollouts is not None:
            self.async_rollouts.close()
        if self.agent_thread is not None:
            self.agent_thread.shutdown(wait=True)
        self.workers.shutdown()
        if self.started_ray:
            shutdown_ray()


def step_metrics(trainer: "PPOTrainer", timer: StageTimer, start: float, batch: DataProto) -> Dict[str, float]:
    """What every step reports besides its own: the stages' times, the worker calls' counts, step time and
    tokens/s (prompt + response tokens processed; 0 for an empty batch)."""
    step_s = time.perf_counter() - start
    tokens = tokens_in(batch) if len(batch) else 0
    return {
        **timer.metrics(),
        **trainer.workers.take_stats(),
        "timing/step_s": step_s,
        "perf/tokens_per_s": tokens / step_s,
    }


def _mean_over_ranks(per_rank: List[Dict[str, float]]) -> Dict[str, float]:
    """The ranks' metrics averaged; memory peaks (memory/*) are the busiest rank's."""
    return {k: float((np.max if k.startswith("memory/") else np.mean)([r[k] for r in per_rank])) for k in per_rank[0]}


def format_summary(name: str, s: Dict[str, Any]) -> str:
    """The one line a run ends with."""
    before, after = s["val_accuracy_before"], s["val_accuracy_after"]
    acc = "no validation set"
    if s.get("val_loss_after") is not None:  # SFT: the held-out loss
        loss_before, loss_after = s.get("val_loss_before"), s["val_loss_after"]
        acc = f"validation loss {loss_after:.4f} at the end"
        if loss_before is not None:
            acc = f"validation loss {loss_before:.4f} -> {loss_after:.4f} ({loss_after - loss_before:+.4f})"
    elif before is not None and after is not None:
        acc = f"held-out greedy accuracy {100 * before:.1f}% -> {100 * after:.1f}% ({100 * (after - before):+.1f} pts)"
    elif after is not None:
        acc = f"held-out greedy accuracy {100 * after:.1f}% at the end"
    first = s.get("first_step_s")
    first = f" (the first done {first:.1f} s after start)" if first is not None else ""
    steps = f"{s['steps']} steps in {s['seconds']:.0f} s{first}"
    return f"verl {name}: {acc}; {steps}; {s['tokens_per_s']:.0f} tokens/s"
