"""CriticWorker: a value model (the actor's trunk with a scalar head) trained on GAE returns."""

from __future__ import annotations

from typing import Any, Dict

from verl.config.plan import Plan
from verl.controller import Dispatch, Worker, register
from verl.protocol import DataProto
from verl.utils.memory import PhasePeaks
from verl.workers.actor_rollout_ref import pass_sizes, run_minibatches
from verl.workers.build_engines import train_engine
from verl.workers.losses import critic_loss_fn
from verl.workers.setup import setup_worker


class CriticWorker(Worker):
    def __init__(self, config: Any, plan: Plan, model_path: str):
        """model_path: the run's model; critic.model_path (in the plan) replaces it when set."""
        super().__init__()
        self.cfg, self.plan = config, plan
        self.model_path = plan.role("critic").model_path or model_path

    @register(Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        setup_worker(self.cfg)
        self.init_distributed("gloo" if self.cfg.placement.device == "cpu" else "nccl")
        self.peaks = PhasePeaks(self.device)  # memory per phase, reported with the update's metrics
        self.engine = train_engine(
            self.cfg,
            self.plan.role("critic"),
            model_path=self.model_path,
            total_steps=self.plan.optimizer_steps("critic"),  # the critic's own mini-batches and epochs
            optimize=True,
        )
        self.set_dispatch_info(*self.engine.data_parallel_info())

    @register(Dispatch.DP_COMPUTE)
    def compute_values(self, batch: DataProto) -> DataProto:
        with self.peaks("values"):
            out = self.engine.infer(batch, **pass_sizes(self.plan.role("critic")))
        return DataProto.from_dict({"values": out.batch["values"]})

    @register(Dispatch.DP_COMPUTE)
    def update_critic(self, batch: DataProto) -> Dict[str, float]:
        """The critic's update; with the peak memory of its phases since the last one (memory/values_peak_gib,
        memory/critic_update_peak_gib)."""
        critic = self.plan.role("critic")
        with self.peaks("critic_update"):
            metrics = run_minibatches(
                self.engine,
                batch,
                mini_rows=critic.rows_per_rank,
                epochs=critic.train.epochs,
                micro_rows=critic.train.micro,
                max_tokens=critic.train.max_tokens,
                loss_fn=critic_loss_fn(self.cfg.critic),
            )
        self.engine.release_memory()  # until the next step's values (critic.param_offload)
        return {**{f"critic/{k}": v for k, v in metrics.items()}, **self.peaks.take()}

    @register(Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, path: str) -> None:
        self.engine.save_checkpoint(f"{path}/critic")

    @register(Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, path: str) -> None:
        self.engine.load_checkpoint(f"{path}/critic")

    @register(Dispatch.ONE_TO_ALL)
    def engine_state(self) -> Dict[str, Any]:
        """The engine's learning rate and full parameters (rank 0's copy is complete), for tests."""
        opt = getattr(self.engine, "optimizer", None)
        lr = float(opt.param_groups[0]["lr"]) if opt is not None else None
        return {"lr": lr, "weights": {k: v.cpu().clone() for k, v in self.engine.weights()}}
