"""RolloutWorker: a rollout engine on a pool of its own (disaggregated from the actor).

Two ways to generate: `generate` (a whole batch per call, as the synchronous and one_step_off modes use), or
the rollout service (`start_service`, then `service_submit` / `service_poll` / `service_abort` / `service_pause`
/ `service_resume` on each replica: request-level, asynchronous, partial rollouts across weight updates; see
`verl.workers.rollout_server`).

It holds its own copy of the policy and generates with it; after each actor update the new weights arrive over
the transfer group (`verl.workers.weight_transfer`) from the actor's rank 0, and the worker records which policy
version it holds. Every generated sample carries that version (the `weight_version` column) and each replica
reports the seconds it took (`meta_info["gen_s/<dp rank>"]`), so the trainer measures staleness and how busy
the pool was.
"""

from __future__ import annotations

import contextlib
import os
import random
import time
from typing import Any, Dict, Optional

import numpy as np
import torch

from verl.config.plan import Plan
from verl.controller import Dispatch, Worker, register
from verl.engine_protocol import eos_and_pad
from verl.protocol import DataProto
from verl.utils.memory import PhasePeaks
from verl.utils.rng import get_rng_state, safe_load, set_rng_state
from verl.workers.build_engines import rollout_engine
from verl.workers.replica_mirror import Follower, MirroredEngine, replica_groups
from verl.workers.rollout_server import Request, RolloutServer
from verl.workers.setup import setup_worker
from verl.workers.weight_check import Report, watch_sync
from verl.workers.weight_transfer import TransferStats, join_transfer_group, receive_weights


class RolloutWorker(Worker):
    def __init__(self, config: Any, plan: Plan, model_path: str, tokenizer_path: Optional[str] = None):
        super().__init__()
        self.cfg, self.plan, self.model_path = config, plan, model_path
        self.tokenizer_path = tokenizer_path or model_path
        self.engine: Any = None
        self.transfer: Any = None  # this rank's member of the transfer group, once joined
        self.senders = 1  # the actor ranks that send over it
        self.version = 0  # the policy version of the weights held: the actor's updates before them
        self.server: Optional[RolloutServer] = None  # the rollout service's replica on this rank, once started
        self.follower: Optional[Follower] = None  # instead, on a replica's other tp ranks
        self.weight_report: Optional[Report] = None  # the last checked sync's, until the driver takes it

    @register(Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        setup_worker(self.cfg)
        self.init_distributed(self.collective_backend)
        from transformers import AutoTokenizer

        self.peaks = PhasePeaks(self.device)
        # The sampler's draws come from this process's generators: seeded, so a run repeats (each replica its own
        # stream). A Ray worker process does not start from a fixed state.
        seed = int(self.cfg.trainer.seed) + self.rank
        random.seed(seed)
        np.random.seed(seed)
        torch.manual_seed(seed)
        tokenizer = self.tokenizer = AutoTokenizer.from_pretrained(self.tokenizer_path)
        self.engine = rollout_engine(self.cfg, self.plan, model_path=self.model_path, tokenizer=tokenizer, actor=None)
        # `tp` consecutive ranks form one generation engine, get the same prompts, and its first rank returns them.
        layout = self.plan.layout("rollout")
        coords = layout.coords(self.rank)
        self.set_dispatch_info(coords.dp, layout.dp, coords.tp == 0, mesh="rollout")

    @register(Dispatch.DP_COMPUTE, mesh="rollout")
    def generate(
        self, prompts: DataProto, n: int = 1, temperature: Optional[float] = None, max_new_tokens: int = 0
    ) -> DataProto:
        """n samples per prompt at `temperature` (None: rollout.temperature; 0: greedy), at most `max_new_tokens`
        each (0: the run's response length), tagged with the version of the weights that produced them."""
        start = time.perf_counter()
        with self.peaks("gen"), self._engine():
            out = self.engine.generate(prompts, n=n, temperature=temperature, max_new_tokens=max_new_tokens)
        out.batch["weight_version"] = torch.full((len(out),), self.version, dtype=torch.long)
        out.meta_info[f"gen_s/{self.dispatch_info('rollout')['dp_rank']}"] = time.perf_counter() - start
        return out

    @register(Dispatch.ONE_TO_ALL)
    def join_weight_transfer(self, host: str, port: int, world: int, member: int, senders: int = 1) -> None:
        """Join the transfer group as `member` (after the `senders` actor ranks; a group re-formed without a failed
        replica numbers the others anew)."""
        self.senders = senders
        self.transfer = join_transfer_group(host, port, member, world, self.collective_backend)

    @register(Dispatch.ONE_TO_ALL)
    def receive_weights(self, version: int, check: bool = False) -> Dict[str, float]:
        """Load the weights of policy `version` the actor's rank 0 is sending (collective with
        `ActorRolloutRefWorker.send_weights`); `check`: fingerprint them and the engine after the load
        (verl.workers.weight_check; the driver takes the report, `take_weight_report`)."""
        if self.transfer is None:
            raise RuntimeError("receive_weights before join_weight_transfer: the transfer group is not set up")
        stats = TransferStats()
        with self.peaks("weight_sync"):
            received = receive_weights(self.transfer, self.device, stats, senders=self.senders)
            with watch_sync(self.engine, received, version, check, lock=self._engine()) as watched:
                if self.follower is not None:  # loaded when the replica's leader loads its own (replica_mirror)
                    number = self.follower.stage((name, tensor.to("cpu")) for name, tensor in watched.weights)
                    self.follower.wait_loaded(number)
                elif self.server is not None:
                    # Received into host memory while the service keeps generating (one copy of the weights), then
                    # swapped in between two of its turns; requests midway continue with them.
                    staged = [(name, tensor.to("cpu")) for name, tensor in watched.weights]
                    self.server.load_weights(iter(staged), version)
                else:
                    self.engine.update_weights(watched.weights)
            self.weight_report = watched.report or self.weight_report
        if stats.version != version:
            raise RuntimeError(f"received the weights of policy version {stats.version}, expected {version}")
        self.version = version
        return {**stats.metrics(), "rollout/weight_version": float(self.version)}

    @register(Dispatch.ONE_TO_ALL)
    def take_weight_report(self) -> Optional[Report]:
        """The last checked sync's fingerprints (verl.workers.weight_check), once."""
        report, self.weight_report = self.weight_report, None
        return report

    @register(Dispatch.ONE_TO_ALL)
    def weight_version(self) -> int:
        return self.version

    def _engine(self):
        """Exclusive use of the engine: a running service's turns pause while a batch call uses it."""
        if self.follower is not None:
            return self.follower.engine_lock
        return self.server.engine_lock if self.server is not None else contextlib.nullcontext()

    # ---- the rollout service (one replica per tp group; the trainer's RolloutClient calls each leader) -------
    @register(Dispatch.ONE_TO_ALL)
    def start_service(self, chunk: int, max_batch: int) -> bool:
        """Serve requests: an engine thread taking `chunk` tokens per request per turn. A replica spans its tp
        ranks: the first serves (True), the others make its engine calls (verl.workers.replica_mirror)."""
        if self.server is not None or self.follower is not None:
            return self.server is not None
        layout = self.plan.layout("rollout")
        coords = layout.coords(self.rank)
        engine: Any = self.engine
        if layout.tp > 1:
            members = [[layout.rank(tp=t, dp=d) for t in range(layout.tp)] for d in range(layout.dp)]
            group = replica_groups(members)[coords.dp]
            leader = members[coords.dp][0]
            if coords.tp > 0:
                self.follower = Follower(self.engine, group, leader)
                return False
            engine = MirroredEngine(self.engine, group, leader)
        eos_ids, pad_id = eos_and_pad(self.tokenizer)
        self.server = RolloutServer(
            engine,
            eos_ids=eos_ids,
            pad_id=pad_id,
            max_new_tokens=self.plan.response_length,
            chunk=chunk,
            max_batch=max_batch,
            version=self.version,
        )
        return True

    @register(Dispatch.ONE_TO_ALL)
    def service_submit(self, requests: list) -> int:
        """Queue requests (dicts of `Request`'s fields: id, prompt, temperature, max_tokens); returns in flight."""
        self._service().submit([Request(**r) for r in requests])
        return self.server.in_flight()

    @register(Dispatch.ONE_TO_ALL)
    def service_poll(self, timeout_s: float = 0.0, stream: bool = False) -> Dict[str, Any]:
        """Finished requests (waiting up to timeout_s for one), with the replica's version and counters; stream:
        also the tokens live requests gained since the last streaming poll ("updates")."""
        done, updates = (
            self._service().poll(timeout_s, stream=True) if stream else (self._service().poll(timeout_s), [])
        )
        return {
            "finished": [vars(f) for f in done],
            "updates": [vars(u) for u in updates],
            "version": self.version,
            "in_flight": self.server.in_flight(),
            **self.server.take_stats(),
        }

    @register(Dispatch.ONE_TO_ALL)
    def service_abort(self, ids: list) -> int:
        return self._service().abort(ids)

    @register(Dispatch.ONE_TO_ALL)
    def service_pause(self) -> None:
        self._service().pause()

    @register(Dispatch.ONE_TO_ALL)
    def service_resume(self) -> None:
        self._service().resume()

    def _service(self) -> RolloutServer:
        if self.server is None:
            raise RuntimeError("the rollout service is not started on this rank (start_service)")
        return self.server

    @register(Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, path: str) -> None:
        """The sampler's random state and weight version of this rank (the weights are the actor's: re-sent)."""
        folder = os.path.join(path, "rollout")
        os.makedirs(folder, exist_ok=True)
        torch.save({"rng": get_rng_state(), "version": self.version}, os.path.join(folder, f"rank{self.rank}.pt"))

    @register(Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, path: str) -> None:
        state = safe_load(os.path.join(path, "rollout", f"rank{self.rank}.pt"))
        set_rng_state(state["rng"])
        self.version = int(state["version"])

    @register(Dispatch.ONE_TO_ALL)
    def rollout_state(self) -> Dict[str, torch.Tensor]:
        """The engine's own parameters on CPU (hf engine): tests compare them with the actor's after a sync."""
        module = getattr(self.engine, "module", None)
        if module is None:
            raise RuntimeError(f"{type(self.engine).__name__} exposes no module to read its weights from")
        return {k: v.detach().cpu().clone() for k, v in module.named_parameters()}
