"""CriticWorker: a value model (the actor's trunk with a scalar head) trained on GAE returns."""

from __future__ import annotations

from typing import Any, Dict

from verl.controller import Dispatch, Worker, register
from verl.protocol import DataProto
from verl.workers.actor_rollout_ref import run_minibatches
from verl.workers.engines import train_engine
from verl.workers.losses import critic_loss_fn
from verl.workers.setup import quiet_libraries, set_threads


class CriticWorker(Worker):
    def __init__(self, config: Any, model_path: str, total_steps: int):
        super().__init__()
        self.cfg, self.model_path, self.total_steps = config, model_path, total_steps

    @register(Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        quiet_libraries()
        set_threads(None)
        self.init_distributed("gloo" if self.cfg.placement.device == "cpu" else "nccl")
        self.engine = train_engine(
            self.cfg, "critic", model_path=self.model_path, total_steps=self.total_steps, optimize=True
        )
        self.set_dispatch_info(*self.engine.data_parallel_info())

    @register(Dispatch.DP_COMPUTE)
    def compute_values(self, batch: DataProto) -> DataProto:
        out = self.engine.infer(batch, micro_batch_size=self.cfg.critic.ppo_micro_batch_size_per_device)
        return DataProto.from_dict({"values": out.batch["values"]})

    @register(Dispatch.DP_COMPUTE)
    def update_critic(self, batch: DataProto) -> Dict[str, float]:
        c, a = self.cfg.critic, self.cfg.actor
        dp = self.dispatch_info()["dp_size"]
        mini = c.ppo_mini_batch_size or a.ppo_mini_batch_size
        return run_minibatches(
            self.engine,
            batch,
            mini_rows=max(1, mini * self.cfg.rollout.n // dp),
            epochs=c.ppo_epochs or a.ppo_epochs,
            micro_rows=c.ppo_micro_batch_size_per_device,
            loss_fn=critic_loss_fn(c),
        )

    @register(Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, path: str) -> None:
        self.engine.save_checkpoint(f"{path}/critic")

    @register(Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, path: str) -> None:
        self.engine.load_checkpoint(f"{path}/critic")
