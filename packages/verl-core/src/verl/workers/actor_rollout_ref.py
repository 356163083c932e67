"""ActorRolloutRefWorker: the actor, its rollout engine and the reference model in one process.

Colocating them is the hybrid engine: the rollout generates with the actor's weights (shared, or synced
per tensor after each update) and the reference sits beside them. Which roles a worker holds, their
backends, layouts and batch sizes come from the run's plan; methods for absent roles raise a clear error.
"""

from __future__ import annotations

import time
from typing import Any, Dict, Optional, Sequence

import torch
import torch.distributed as dist

from verl.config.plan import Plan
from verl.controller import Dispatch, Worker, register
from verl.controller.worker import free_port
from verl.engine_protocol import ROUTED_EXPERTS
from verl.protocol import DataProto
from verl.utils.memory import PhasePeaks
from verl.workers.build_engines import rollout_engine, train_engine
from verl.workers.losses import actor_loss_fn, preference_loss_fn, sft_loss
from verl.workers.setup import setup_worker
from verl.workers.weight_check import Report, due, watch_sync
from verl.workers.weight_transfer import join_transfer_group, send_weight_shards, send_weights

ROLES = ("actor", "rollout", "ref")


def run_minibatches(
    engine: Any, batch: DataProto, *, mini_rows: int, epochs: int, micro_rows: int, loss_fn, max_tokens=None, **kw
) -> Dict[str, float]:
    """ppo_epochs passes over `batch` in mini-batches of `mini_rows`, one optimizer step each; mean metrics.
    Micro-batches of `micro_rows`, or of `max_tokens` tokens when set (an fsdp engine's budget)."""
    sums: Dict[str, float] = {}
    steps = 0
    if max_tokens is not None:
        kw["max_tokens"] = max_tokens
    for _ in range(epochs):
        for mb in batch.split(mini_rows):
            for k, v in engine.train_step(mb, loss_fn, micro_batch_size=micro_rows, **kw).items():
                sums[k] = sums.get(k, 0.0) + v
            steps += 1
    return {k: v / steps for k, v in sums.items()}


def pass_sizes(role: Any) -> Dict[str, int]:
    """How a role's log-prob / value pass cuts its micro-batches (a RolePlan): rows, or a token budget too."""
    sizes = {"micro_batch_size": role.micro_batch}
    if role.max_tokens is not None:
        sizes["max_tokens"] = role.max_tokens
    return sizes


class AdaptersOff:
    """The reference policy of a LoRA actor: the actor's own engine with its adapters bypassed."""

    def __init__(self, actor: Any):
        self.actor = actor

    def infer(self, batch: DataProto, **kw: Any) -> DataProto:
        with self.actor.adapters_off():
            return self.actor.infer(batch, **kw)

    def data_parallel_info(self):
        return self.actor.data_parallel_info()

    def release_memory(self) -> None:
        pass  # the actor's parameters: the actor's to release


class ActorRolloutRefWorker(Worker):
    def __init__(
        self,
        config: Any,
        plan: Plan,
        model_path: str,
        tokenizer_path: Optional[str] = None,
        roles: Optional[Sequence[str]] = None,
    ):
        """roles: which of the plan's actor, rollout and ref this worker holds (default: every one planned)."""
        super().__init__()
        self.cfg, self.plan, self.model_path = config, plan, model_path
        self.tokenizer_path = tokenizer_path or model_path
        self.roles = [r for r in ROLES if plan.has(r) and (roles is None or r in roles)]
        self.actor: Any = None
        self.rollout: Any = None
        self.ref: Any = None
        self.transfer: Any = None  # this rank's member of the transfer group to a rollout pool of its own, if it sends
        self.senders = 1  # the actor ranks sending over it (join_weight_transfer)
        self.syncs = 0  # weight syncs into the colocated rollout after an update (rollout.verify_weights_every)
        self.weight_report: Optional[Report] = None  # the last checked sync's, until the driver takes it

    def _need(self, role: str) -> Any:
        engine = getattr(self, role)
        if engine is None:
            raise RuntimeError(f"this worker holds roles {self.roles}, not '{role}' (see placement.pools)")
        return engine

    @register(Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        setup_worker(self.cfg)
        self.init_distributed("gloo" if self.cfg.placement.device == "cpu" else "nccl")
        from transformers import AutoTokenizer

        self.peaks = PhasePeaks(self.device)  # memory per phase, reported with the update's metrics

        plan = self.plan
        self.tokenizer = AutoTokenizer.from_pretrained(self.tokenizer_path)
        if "actor" in self.roles:
            self.actor = train_engine(
                self.cfg,
                plan.role("actor"),
                model_path=self.model_path,
                total_steps=plan.optimizer_steps("actor"),
                optimize=True,
            )
        if "rollout" in self.roles:
            self.rollout = rollout_engine(
                self.cfg, plan, model_path=self.model_path, tokenizer=self.tokenizer, actor=self.actor
            )
        if "ref" in self.roles and plan.ref_from_actor:  # LoRA: the base model is the actor, adapters off
            self.ref = AdaptersOff(self._need("actor"))
        elif "ref" in self.roles:
            self.ref = train_engine(
                self.cfg, plan.role("ref"), model_path=self.model_path, total_steps=1, optimize=False
            )
        engine = self.actor or self.ref
        if engine is not None:  # batches are split by the train engine's data-parallel layout
            self.set_dispatch_info(*engine.data_parallel_info())
        if self.rollout is not None:
            # Generation has its own layout (the plan's rollout order, tp fastest): `tp` consecutive ranks form one
            # generation group (vLLM's and SGLang's own grouping), get the same prompts, and its first rank returns
            # the results. E.g. a TP=2 megatron actor on 2 ranks feeds two TP=1 rollouts, each generating half of
            # the prompts; an FSDP actor on 2 ranks feeds one vLLM engine with TP=2.
            layout = plan.layout("rollout")
            coords = layout.coords(self.rank)
            self.set_dispatch_info(coords.dp, layout.dp, coords.tp == 0, mesh="rollout")

    @register(Dispatch.DP_COMPUTE, mesh="rollout")
    def generate(
        self, prompts: DataProto, n: int = 1, temperature: Optional[float] = None, max_new_tokens: int = 0
    ) -> DataProto:
        """n samples per prompt at `temperature` (None: rollout.temperature; 0: greedy), at most `max_new_tokens`
        each (0: the run's response length)."""
        with self.peaks("gen"):
            return self._need("rollout").generate(prompts, n=n, temperature=temperature, max_new_tokens=max_new_tokens)

    @register(Dispatch.DP_COMPUTE)
    def compute_log_probs(self, batch: DataProto) -> DataProto:
        """old_log_probs under the current actor, and ref_log_probs when this worker holds the reference: one
        call for both (entropy is measured in the update, where it is used)."""
        plan, out = self.plan, {}
        with self.peaks("log_probs"):
            for key, role in (("old_log_probs", "actor"), ("ref_log_probs", "ref")):
                engine = getattr(self, role)
                if engine is not None and plan.role(role) in plan.log_prob_passes:
                    # routing replay: the actor's pass records the experts each token went to (r2), or routes
                    # every token to the ones the rollout took (r3)
                    mode = plan.routing_replay if role == "actor" else "none"
                    routes = {"r2": {"routes": True}, "r3": {"replay": True}}.get(mode, {})
                    infer = engine.infer(batch, temperature=plan.temperature, **pass_sizes(plan.role(role)), **routes)
                    out[key] = infer.batch["log_probs"]
                    if mode == "r2":
                        out[ROUTED_EXPERTS] = infer.batch[ROUTED_EXPERTS]
        if self.ref is not None:  # its one pass of the step is done (ref.param_offload)
            self.ref.release_memory()
        return DataProto.from_dict(out)

    @register(Dispatch.DP_COMPUTE)
    def actor_log_probs(self, batch: DataProto, temperature: float = 1.0) -> DataProto:
        """The actor's per-token log-probs of `responses` at `temperature` (SFT's validation loss at 1; near 0 they
        tell whether each token is the one greedy decoding picks)."""
        with self.peaks("log_probs"):
            out = self._need("actor").infer(batch, temperature=temperature, **pass_sizes(self.plan.role("actor")))
        return DataProto.from_dict({"log_probs": out.batch["log_probs"]})

    @register(Dispatch.DP_COMPUTE)
    def update_actor(self, batch: DataProto, entropy: bool = True, loss: str = "policy") -> Dict[str, float]:
        """The actor's update on this rank's rows, then the weight sync into the colocated rollout.

        loss: "policy" (PPO's clipped objective and its KL / entropy terms, actor.*), "preference" (the DPO
        loss of algorithm.dpo on (chosen, rejected) row pairs; the batch holds whole pairs per rank) or "sft" (the
        token-mean negative log-likelihood of the masked tokens).
        entropy: measure it (always done when actor.entropy_coeff is set: it is then part of the loss).
        Also reports the peak memory of this rank's phases since the last update (memory/<phase>_peak_gib: gen,
        log_probs, update, weight_sync; GPU: torch's allocated bytes, CPU: the process's resident set)."""
        if self.rollout is not None:  # the hybrid engine: no generation memory held while the actor trains
            self.rollout.sleep()
        a, actor = self.cfg.actor, self.plan.role("actor")
        if loss == "preference":
            loss_fn, entropy = preference_loss_fn(self.cfg.algorithm.dpo), False
        elif loss == "sft":
            loss_fn, entropy = sft_loss, False
        else:
            loss_fn = actor_loss_fn(a)
        with self.peaks("update"):
            metrics = run_minibatches(
                self._need("actor"),
                batch,
                mini_rows=actor.rows_per_rank,
                epochs=actor.train.epochs,
                micro_rows=actor.train.micro,
                max_tokens=actor.train.max_tokens,
                loss_fn=loss_fn,
                temperature=self.plan.temperature,
                entropy=entropy or (loss == "policy" and bool(a.entropy_coeff)),
                entropy_grad=loss == "policy"
                and bool(a.entropy_coeff),  # fused kernels skip the entropy gradient when only logged
            )
        metrics = {k if k.startswith("rollout/") else f"actor/{k}": v for k, v in metrics.items()}
        if self.rollout is not None:
            self.syncs += 1
            with self.peaks("weight_sync"):
                metrics.update(self._sync_weights(check=self.syncs))
            # After the sync and before generation wakes the rollout's KV cache: the actor's parameters leave the
            # device first (actor.param_offload; its optimizer state already left after the step), so the two
            # never peak together.
            self._need("actor").release_memory()
        return {**metrics, **self.peaks.take()}

    def _sync_weights(self, check: int = 0) -> Dict[str, float]:
        """Push the actor's new weights into the rollout engine, in the rollout's layout; the pool's totals.
        check: the sync's number, when it counts towards rollout.verify_weights_every (a checked one leaves its
        `weight_report` for the driver, `take_weight_report`).

        perf/weight_sync_bytes: what the rollouts loaded; perf/weight_sync_comm_bytes: what reached the ranks
        from other ranks to assemble them (tensor-parallel gathers, pipeline broadcasts), both summed over the
        pool's ranks; timing/weight_sync_s: the slowest rank's whole sync."""
        start = time.perf_counter()
        actor, rollout = self._need("actor"), self._need("rollout")
        adapter = self.plan.lora_sync == "adapter"  # the adapters alone; the rollout keeps its base weights
        config, weights = actor.lora_adapter() if adapter else (None, actor.weights())
        with watch_sync(rollout, weights, check, due(check, self.cfg.rollout.verify_weights_every)) as watched:
            # full tensors, one at a time: every rollout engine slices its own tensor-parallel shard while loading
            moved = (
                rollout.load_adapter(config, watched.weights) if adapter else rollout.update_weights(watched.weights)
            )
        self.weight_report = watched.report or self.weight_report
        totals = torch.tensor([float(moved), float(actor.sync_received_bytes())], dtype=torch.float64)
        seconds = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
        if dist.is_initialized() and dist.get_world_size() > 1:
            device = self.device if dist.get_backend() == "nccl" else torch.device("cpu")
            totals, seconds = totals.to(device), seconds.to(device)
            dist.all_reduce(totals)
            dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
        return {
            "perf/weight_sync_bytes": float(totals[0]),
            "perf/weight_sync_comm_bytes": float(totals[1]),
            "timing/weight_sync_s": float(seconds[0]),
        }

    # ---- a rollout on a pool of its own: weights go out over the transfer group ------------------------------
    @register(Dispatch.ONE_TO_ALL)
    def weight_transfer_endpoint(self) -> Dict[str, Any]:
        """Where rank 0 hosts the transfer group's rendezvous (this node's address and a free port), and how many
        actor ranks send: every one when the engine can send its own block of each tensor (`weight_shards`: FSDP's
        rows, megatron's tensor-parallel pieces), else rank 0 alone, with whole tensors the ranks assemble together."""
        senders = self.world_size if self._need("actor").weight_shards() is not None else 1
        return {"host": self.master_addr, "port": free_port(), "senders": senders}

    @register(Dispatch.ONE_TO_ALL)
    def join_weight_transfer(self, host: str, port: int, world: int, senders: int = 1) -> None:
        """The sending ranks (rank 0, or every rank when `senders` is the world size) join the transfer group as its
        first members; the other ranks only help assemble tensors."""
        self.senders = senders
        joins = self.rank < senders
        self.transfer = join_transfer_group(host, port, self.rank, world, self.collective_backend) if joins else None

    @register(Dispatch.ONE_TO_ALL)
    def send_weights(self, version: int, bucket_bytes: int) -> Dict[str, float]:
        """Stream the actor's weights to the rollout pool (collective with `RolloutWorker.receive_weights`): each
        rank its own block of every tensor, or rank 0 the whole tensors every actor rank takes part in assembling.
        perf/weight_sync_bytes: what this rank sent."""
        actor = self._need("actor")
        with self.peaks("weight_sync"):
            if self.senders > 1:
                stats = send_weight_shards(
                    self.transfer,
                    actor.weight_shards(),
                    senders=self.senders,
                    version=version,
                    device=self.device,
                    bucket_bytes=bucket_bytes,
                )
            else:
                stats = send_weights(
                    self.transfer, actor.weights(), version=version, device=self.device, bucket_bytes=bucket_bytes
                )
        return {**stats.metrics(), "perf/weight_sync_comm_bytes": float(actor.sync_received_bytes())}

    @register(Dispatch.ONE_TO_ALL)
    def take_weight_report(self) -> Optional[Report]:
        """The last checked sync's fingerprints (verl.workers.weight_check), once."""
        report, self.weight_report = self.weight_report, None
        return report

    @register(Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, path: str) -> None:
        if self.actor is not None:
            self.actor.save_checkpoint(f"{path}/actor")

    @register(Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, path: str) -> None:
        if self.actor is not None:
            self.actor.load_checkpoint(f"{path}/actor")
            if self.rollout is not None:  # a rollout with its own copy must generate with the restored weights
                self._sync_weights()

    @register(Dispatch.ONE_TO_ALL)
    def export_hf(self, path: str) -> None:
        self._need("actor").export_hf(path)

    @register(Dispatch.ONE_TO_ALL)
    def held_bytes(self, role: str = "actor") -> Dict[str, int]:
        """The role's state on this rank counted from its tensors (params, grads at the last step, optimizer):
        what the backend's memory model estimates before launch."""
        return self._need(role).held_bytes()

    @register(Dispatch.ONE_TO_ALL)
    def actor_state(self) -> Dict[str, torch.Tensor]:
        """The actor's full parameters on CPU (rank 0's copy is complete): parity and resume tests compare these."""
        return {k: v.cpu().clone() for k, v in self._need("actor").weights()}
