"""Trainer: what every trainer of a run shares (PPO, DPO and SFT each extend it; none extends another).

The run's lifecycle, in order: the config resolved and planned, the data read, the workers started, a reward when
the run scores samples; then `fit()` (resume, validation before, the steps, checkpoints, validation after, the
summary) and `close()`. A subclass says what its data is (`make_loaders`), what one step does (`train_step`),
what validation measures (`evaluate`) and what more its checkpoints hold (`checkpoint_state` / `restore_state`).

    with PPOTrainer("recipes/grpo_tiny.yaml", overrides=["trainer.total_steps=10"]) as trainer:
        summary = trainer.fit()
"""

from __future__ import annotations

import os
import re
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, cast

import numpy as np

from verl.algos import load_plugins
from verl.config.placement import to_dict
from verl.config.plan import Plan
from verl.config.resolve import resolve_config
from verl.config.schema import VerlConfig
from verl.controller import init_ray, shutdown_ray
from verl.data.vision import load_vision_processor
from verl.protocol import DataProto
from verl.reward import make_reward_manager
from verl.reward.server_scores import ServerScores, start_reward_server
from verl.tracking import Progress, Tracker
from verl.trainer.checkpoint import CheckpointManager, checkpoint_root
from verl.trainer.fingerprint import fingerprint
from verl.trainer.profile import StepProfiler
from verl.trainer.run_workers import start_workers
from verl.trainer.timer import StageTimer
from verl.trainer.warm_start import prepare_model
from verl.utils.process import seconds_since_start
from verl.utils.rng import get_rng_state, set_rng_state
from verl.workers.actor_rollout_ref import ActorRolloutRefWorker
from verl.workers.critic import CriticWorker


def pad_to_multiple(batch: DataProto, k: int) -> tuple[DataProto, int]:
    """Repeat the first rows so len(batch) divides by k (validation sets of any size over dp ranks)."""
    pad = (-len(batch)) % k
    if pad == 0:
        return batch, 0
    return DataProto.concat([batch, batch[list(range(pad))]]), pad


def tokens_in(batch: DataProto) -> int:
    """Prompt plus response tokens actually processed (padding excluded): HybridFlow's throughput unit."""
    return int(batch.batch["attention_mask"].sum())


def mean_over_ranks(per_rank: List[Dict[str, float]]) -> Dict[str, float]:
    """The ranks' metrics averaged; memory peaks (memory/*) are the busiest rank's."""
    return {k: float((np.max if k.startswith("memory/") else np.mean)([r[k] for r in per_rank])) for k in per_rank[0]}


def check_trainer_class(cls: type, plan: Plan) -> None:
    """ConfigError unless `cls` trains what the plan's `trainer` names: the registered trainer class nearest in
    its bases must be that one (an OnlineDPOTrainer does not run offline DPO, a PPOTrainer no DPO)."""
    from verl.config.errors import ConfigError, ConfigProblem
    from verl.trainer.registry import TRAINERS, trainer_class

    expected = trainer_class(plan)
    registered = {TRAINERS[name] for name in TRAINERS}
    nearest = next((c for c in cls.__mro__ if c in registered), None)
    if nearest is not expected:
        message = f"{cls.__name__} does not train algorithm.name={plan.trainer} ({expected.__name__} does)"
        fix = f"use {expected.__name__} (or verl.RLTrainer, which picks the class), or subclass it"
        raise ConfigError([ConfigProblem("algorithm.name", message, fix)])


class Trainer:
    """The lifecycle every trainer shares. `config` is a loaded config, a recipe path or a plain dict of sections;
    it is validated as the CLI does (every problem at once, as a ConfigError) unless the caller passes the `plan`
    it already made from it. A trainer is a context manager: leaving the block closes it (workers, Ray, servers)."""

    def __init__(
        self,
        config: Any,
        reward_fn: Optional[Callable] = None,
        *,
        overrides: Sequence[str] = (),
        plan: Optional[Plan] = None,
    ):
        if plan is None:
            config, plan = resolve_config(config, overrides, reward_given=reward_fn is not None)  # (imports plugins)
        else:
            load_plugins(config.trainer.plugins)  # user registrations before any name is looked up
        check_trainer_class(type(self), plan)
        self.cfg = cast(VerlConfig, config)  # (the schema's DictConfig, read as its dataclass)
        cfg = self.cfg
        self.started_ray = False
        if plan.controller == "ray":
            # A local cluster gets at least one CPU per placed device (a CPU run places worker processes).
            local = not os.environ.get("RAY_ADDRESS")
            self.started_ray = init_ray(num_cpus=max(os.cpu_count() or 1, plan.world_size) if local else None)
        self.output_dir = cfg.trainer.output_dir
        self.model_path = prepare_model(cfg)
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(cfg.model.tokenizer_path or self.model_path)
        # a vision-language model's image processor reads image prompts (None for a text model)
        self.processor = load_vision_processor(self.model_path, self.tokenizer)
        self.plan = plan  # (its total steps are known once the data is read, below)
        self.train_loader, self.val_loader = self.make_loaders()
        total_steps = cfg.trainer.total_steps or len(self.train_loader) * cfg.trainer.total_epochs
        self.plan = plan = plan.with_total_steps(total_steps)
        self.checkpoints = CheckpointManager(checkpoint_root(cfg), keep_last=cfg.checkpoint.keep_last)
        self.fingerprint = fingerprint(cfg)  # saved with each checkpoint: what `resume: auto` compares
        self.tracker = Tracker(
            cfg.tracking,
            run_config=to_dict(cfg),
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
        self.val_history: List[Dict[str, float]] = []
        self.profiler = StepProfiler(cfg.trainer.profile, self.output_dir, plan.controller)
        self.setup()

    # ---- what a subclass says -----------------------------------------------------------------------
    def setup(self) -> None:
        """What the trainer builds once the workers run (its rollout source, a KL controller); nothing here."""

    def scores(self) -> bool:
        """Whether this run scores samples (and so needs a reward)."""
        return False

    def make_loaders(self) -> Tuple[Any, Any]:
        """(train loader, val loader or None)."""
        raise NotImplementedError

    def train_step(self) -> Dict[str, float]:
        """One step: its metrics, with timing/step_s and perf/tokens_per_s (`step_metrics`)."""
        raise NotImplementedError

    def evaluate(self) -> Dict[str, float]:
        """The held-out metrics of the policy now (empty: nothing to evaluate)."""
        return {}

    def checkpoint_state(self) -> Dict[str, Any]:
        """What the trainer state of a checkpoint holds besides the step, RNG and validation history."""
        return {"data": self.train_loader.state_dict()}

    def restore_state(self, state: Dict[str, Any], path: str) -> None:
        """The other half of `checkpoint_state` (the checkpoint at `path`), after the step, RNG and the workers'
        checkpoints are restored."""
        self.train_loader.load_state_dict(state["data"])

    def write_checkpoint(self, path: str) -> None:
        """The workers' parts of a checkpoint at `path` (the actor's, the critic's)."""
        self.workers.actor_rollout.call(ActorRolloutRefWorker.save_checkpoint, path)
        if self.workers.critic is not None:
            self.workers.critic.call(CriticWorker.save_checkpoint, path)

    def read_checkpoint(self, path: str) -> None:
        self.workers.actor_rollout.call(ActorRolloutRefWorker.load_checkpoint, path)
        if self.workers.critic is not None:
            self.workers.critic.call(CriticWorker.load_checkpoint, path)

    # ---- shared -------------------------------------------------------------------------------------
    def step_metrics(self, timer: StageTimer, start: float, batch: DataProto) -> Dict[str, float]:
        """What every step reports besides its own: the stages' times, the worker calls' counts, step time and
        tokens/s (prompt + response tokens processed; 0 for an empty batch)."""
        step_s = time.perf_counter() - start
        tokens = tokens_in(batch) if len(batch) else 0
        return {
            **timer.metrics(),
            **self.workers.take_stats(),
            "timing/step_s": step_s,
            "perf/tokens_per_s": tokens / step_s,
        }

    def validate(self) -> Dict[str, float]:
        """`evaluate()`, kept in the validation history (what the summary's before / after read)."""
        metrics = self.evaluate()
        if metrics:
            self.val_history.append({"step": self.step, **metrics})
        return metrics

    def save_checkpoint(self) -> str:
        state = {
            "step": self.step,
            "rng": get_rng_state(),
            "val_history": self.val_history,
            **self.checkpoint_state(),
        }
        return self.checkpoints.save(self.step, self.write_checkpoint, state, run=self.fingerprint)

    def maybe_resume(self) -> None:
        for name in self.checkpoints.remove_incomplete():
            print(f"verl: removed {os.path.join(self.checkpoints.root, name)}: an incomplete checkpoint", flush=True)
        resume = self.cfg.trainer.resume
        path = None if resume == "disable" else (self.checkpoints.latest() if resume == "auto" else resume)
        if path is None:
            if resume == "auto":  # this run starts over: what an attempt killed before its first checkpoint logged goes
                self.tracker.resume_at(-1)
            return
        state = self.checkpoints.load_state(path)
        self.read_checkpoint(path)
        self.step = state["step"]
        set_rng_state(state["rng"])
        self.val_history = state["val_history"]
        self.restore_state(state, path)
        self.tracker.resume_at(self.step)  # each step appears once in the logs, however often the run was killed
        print(f"verl: resumed from {path} (step {self.step})", flush=True)
        if self.step >= self.plan.total_steps:
            print(
                f"verl: that run is finished (trainer.total_steps={self.plan.total_steps}): nothing to train. Raise "
                "trainer.total_steps to train it further, or give a new run its own trainer.output_dir",
                flush=True,
            )

    def fit(self) -> Dict[str, Any]:
        """Train to trainer.total_steps (or the validation where trainer.stop_when holds); returns a summary
        (validation before/after, throughput)."""
        t = self.cfg.trainer
        self.maybe_resume()
        run_start, tokens, step_seconds, first_step_s = time.perf_counter(), 0.0, 0.0, None
        if t.val_before_train and self.step == 0:
            self.tracker.log(self.validate(), step=0)
        total = self.plan.total_steps
        progress = Progress(total)
        # (a resumed run that had stopped, or a model that meets trainer.stop_when before training, trains no step)
        stopped = bool(self.val_history) and self.stop_reached(self.val_history[-1])
        try:
            while self.step < total and not stopped:
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
                    stopped = self.stop_reached(metrics)
                    last = last or stopped
                if self.step % t.log_every == 0 or last:
                    self.tracker.log(metrics, step=self.step)
                progress.update(self.step, metrics)
                every, final = self.cfg.checkpoint.save_every, self.cfg.checkpoint.save_last
                if (every and self.step % every == 0) or (last and final):
                    self.save_checkpoint()
            if stopped and t.stop_when is not None:
                s = t.stop_when
                bound = f">= {s.at_least}" if s.at_least is not None else f"<= {s.at_most}"
                value = self.val_history[-1][s.metric]
                print(
                    f"verl: stopped at step {self.step}: {s.metric}={value:.4g} {bound} (trainer.stop_when)", flush=True
                )
            if self.cfg.checkpoint.save_hf:
                self.workers.actor_rollout.call(ActorRolloutRefWorker.export_hf, os.path.join(self.output_dir, "hf"))
        finally:
            progress.close()
            self.tracker.close()
        return self.summary(time.perf_counter() - run_start, tokens / max(step_seconds, 1e-9), first_step_s)

    def stop_reached(self, val_metrics: Dict[str, float]) -> bool:
        """Whether trainer.stop_when holds for these validation metrics."""
        s = self.cfg.trainer.stop_when
        if s is None:
            return False
        if s.metric not in val_metrics:
            known = ", ".join(sorted(k for k in val_metrics if k.startswith("val/")))
            raise ValueError(
                f"trainer.stop_when.metric: this run's validation has no {s.metric!r} (it has {known}); name one of those"
            )
        v = val_metrics[s.metric]
        return (s.at_least is not None and v >= s.at_least) or (s.at_most is not None and v <= s.at_most)

    def train(self) -> Dict[str, Any]:
        """`fit()`, under the name some of verl's documentation uses."""
        return self.fit()

    def summary(self, seconds: float, tokens_per_s: float, first_step_s: Optional[float] = None) -> Dict[str, Any]:
        at = {v["step"]: v["val/accuracy"] for v in self.val_history if "val/accuracy" in v}
        last = self.val_history[-1] if self.val_history and self.val_history[-1]["step"] == self.step else {}
        return {
            "steps": self.step,
            "seconds": seconds,
            "tokens_per_s": tokens_per_s,
            "first_step_s": first_step_s,  # process start to the end of its first step; None: no step trained
            "val_accuracy_before": at.get(0),  # None when trainer.val_before_train is off
            "val_accuracy_after": at.get(self.step),
            # the last validation's pass@k, mean@n and maj@n over every held-out prompt (rollout.val_n)
            "val_sampled_after": {k[4:]: v for k, v in last.items() if re.fullmatch(r"val/(pass|mean|maj)@\d+", k)},
        }

    def close(self) -> None:
        """Stop what the trainer started: its servers, the workers, and Ray if it started it."""
        if self.reward_server is not None:
            self.reward_server.close()
        self.workers.shutdown()
        if self.started_ray:
            shutdown_ray()

    def __enter__(self) -> "Trainer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
