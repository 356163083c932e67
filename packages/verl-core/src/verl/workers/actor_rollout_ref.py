"""ActorRolloutRefWorker: the actor, its rollout engine and the reference model in one process.

Colocating them is the hybrid engine: the rollout generates with the actor's weights (shared, or synced
per tensor after each update) and the reference sits beside them. Which roles a worker holds comes from
the recipe's placement; methods for absent roles raise a clear error.
"""

from __future__ import annotations

import time
from typing import Any, Dict, Sequence

import torch

from verl.controller import Dispatch, Worker, register
from verl.protocol import DataProto
from verl.workers.engines import rollout_engine, train_engine
from verl.workers.losses import actor_loss_fn
from verl.workers.setup import quiet_libraries, set_threads


def run_minibatches(
    engine: Any, batch: DataProto, *, mini_rows: int, epochs: int, micro_rows: int, loss_fn, **kw
) -> Dict[str, float]:
    """ppo_epochs passes over `batch` in mini-batches of `mini_rows`, one optimizer step each; mean metrics."""
    sums: Dict[str, float] = {}
    steps = 0
    for _ in range(epochs):
        for mb in batch.split(mini_rows):
            for k, v in engine.train_step(mb, loss_fn, micro_batch_size=micro_rows, **kw).items():
                sums[k] = sums.get(k, 0.0) + v
            steps += 1
    return {k: v / steps for k, v in sums.items()}


class ActorRolloutRefWorker(Worker):
    def __init__(self, config: Any, roles: Sequence[str], model_path: str, total_steps: int):
        super().__init__()
        self.cfg, self.roles, self.model_path, self.total_steps = config, list(roles), model_path, total_steps
        self.actor = self.rollout = self.ref = None

    def _need(self, role: str) -> Any:
        engine = getattr(self, role)
        if engine is None:
            raise RuntimeError(f"this worker holds roles {self.roles}, not '{role}' (see placement.pools)")
        return engine

    @register(Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        quiet_libraries()
        set_threads(None)
        self.init_distributed("gloo" if self.cfg.placement.device == "cpu" else "nccl")
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        if "actor" in self.roles:
            self.actor = train_engine(
                self.cfg, "actor", model_path=self.model_path, total_steps=self.total_steps, optimize=True
            )
        if "rollout" in self.roles:
            self.rollout = rollout_engine(
                self.cfg, model_path=self.model_path, tokenizer=self.tokenizer, actor=self.actor
            )
        if "ref" in self.roles:
            self.ref = train_engine(self.cfg, "ref", model_path=self.model_path, total_steps=1, optimize=False)
        engine = self.actor or self.ref
        if engine is not None:  # batches are split by the train engine's data-parallel layout
            self.set_dispatch_info(*engine.data_parallel_info())
        if self.rollout is not None:
            # Generation has its own layout (the placement plan's rollout order, tp fastest): `tp` consecutive ranks
            # form one generation group (vLLM's and SGLang's own grouping), get the same prompts, and its first rank
            # returns the results. E.g. a TP=2 megatron actor on 2 ranks feeds two TP=1 rollouts, each generating
            # half of the prompts; an FSDP actor on 2 ranks feeds one vLLM engine with TP=2.
            tp = self._rollout_tp()
            if self.world_size % tp:
                raise ValueError(f"rollout.parallel.tp={tp} does not divide this pool's {self.world_size} ranks")
            self.set_dispatch_info(self.rank // tp, self.world_size // tp, self.rank % tp == 0, mesh="rollout")

    def _rollout_tp(self) -> int:
        return int(self.cfg.rollout.parallel.tp or 1)

    @register(Dispatch.DP_COMPUTE, mesh="rollout")
    def generate(self, prompts: DataProto) -> DataProto:
        greedy = bool(prompts.meta_info.get("greedy", False))
        n = int(prompts.meta_info.get("n", 1))
        return self._need("rollout").generate(prompts, n=n, greedy=greedy)

    @register(Dispatch.DP_COMPUTE)
    def compute_log_prob(self, batch: DataProto) -> DataProto:
        """old_log_probs under the current actor (entropy is measured in the update, where it is used)."""
        out = self._need("actor").infer(
            batch,
            micro_batch_size=self.cfg.actor.log_prob_micro_batch_size_per_device,
            temperature=self.cfg.rollout.temperature or 1.0,
        )
        return DataProto.from_dict({"old_log_probs": out.batch["log_probs"]})

    @register(Dispatch.DP_COMPUTE)
    def compute_ref_log_prob(self, batch: DataProto) -> DataProto:
        out = self._need("ref").infer(
            batch,
            micro_batch_size=self.cfg.ref.log_prob_micro_batch_size_per_device,
            temperature=self.cfg.rollout.temperature or 1.0,
        )
        return DataProto.from_dict({"ref_log_probs": out.batch["log_probs"]})

    @register(Dispatch.DP_COMPUTE)
    def update_actor(self, batch: DataProto) -> Dict[str, float]:
        if self.rollout is not None:  # the hybrid engine: no generation memory held while the actor trains
            self.rollout.sleep()
        a = self.cfg.actor
        dp = self.dispatch_info()["dp_size"]
        metrics = run_minibatches(
            self._need("actor"),
            batch,
            mini_rows=max(1, a.ppo_mini_batch_size * self.cfg.rollout.n // dp),
            epochs=a.ppo_epochs,
            micro_rows=a.ppo_micro_batch_size_per_device,
            loss_fn=actor_loss_fn(a),
            temperature=self.cfg.rollout.temperature or 1.0,
            entropy=True,
            entropy_grad=bool(a.entropy_coeff),  # fused kernels skip the entropy gradient when it is only logged
        )
        return metrics

    @register(Dispatch.ONE_TO_ALL)
    def sync_weights(self) -> Dict[str, float]:
        """Push the actor's new weights into the rollout engine, in the rollout's layout.

        bytes: what the rollout loaded; comm_bytes: what reached this rank from other ranks to assemble it
        (tensor-parallel gathers, pipeline broadcasts); seconds: the whole sync on this rank."""
        start = time.perf_counter()
        actor, rollout = self._need("actor"), self._need("rollout")
        # Full tensors, one at a time: every rollout engine slices its own tensor-parallel shard while loading.
        moved = rollout.update_weights(actor.weights())
        return {
            "bytes": float(moved),
            "comm_bytes": float(actor.sync_received_bytes()),
            "seconds": time.perf_counter() - start,
        }

    @register(Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, path: str) -> None:
        if self.actor is not None:
            self.actor.save_checkpoint(f"{path}/actor")

    @register(Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, path: str) -> None:
        if self.actor is not None:
            self.actor.load_checkpoint(f"{path}/actor")
            if self.rollout is not None:  # a rollout with its own copy must generate with the restored weights
                self.sync_weights()

    @register(Dispatch.ONE_TO_ALL)
    def export_hf(self, path: str) -> None:
        self._need("actor").export_hf(path)

    @register(Dispatch.ONE_TO_ALL)
    def actor_state(self) -> Dict[str, torch.Tensor]:
        """The actor's full parameters on CPU (rank 0's copy is complete): parity and resume tests compare these."""
        return {k: v.cpu().clone() for k, v in self._need("actor").weights()}
