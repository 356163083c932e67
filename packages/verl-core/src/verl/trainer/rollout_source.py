"""Where a trainer's generated batches come from: one `RolloutSource` per run, chosen from the plan.

- `SyncRollouts` (trainer.mode=sync): the step's batch is generated when the step asks for it.
- `OneStepOffRollouts` (one_step_off): the rollout, on a pool of its own, generates step k+1's batch while the
  actor trains on step k's (by the weights before that update).
- `ServiceRollouts` (async): the rollout service generates up to trainer.max_staleness batches ahead
  (`AsyncRollouts` schedules them; `AsyncAgentRollouts` when the rows are agent trajectories).

Agent loops (rollout.agent.loop) are not a source of their own: under sync and one_step_off an `AgentSampler`
wraps the workers' sampler (each round of model turns one generate call), under async the service's rows are
trajectories. Every source also generates on demand (validation, ReMax's greedy baselines, DAPO's extra batches),
learns each new policy version (the weight sync into a rollout on its own pool), and holds what a checkpoint needs
to resume it: the data position, the batch generated ahead, the samples in flight.
"""

from __future__ import annotations

import functools
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Dict, Optional, Protocol, Tuple

import numpy as np

from verl.config.plan import Plan
from verl.config.schema import VerlConfig
from verl.data.build import make_rl_dataloaders
from verl.engine_protocol import eos_and_pad
from verl.protocol import DataProto
from verl.trainer.agent_rollouts import AgentRollouts
from verl.trainer.async_agent_rollouts import AsyncAgentRollouts
from verl.trainer.async_rollouts import AsyncRollouts
from verl.trainer.batch_state import PendingRollout, batch_from_state, batch_state
from verl.trainer.rollout_client import RolloutClient
from verl.trainer.timer import StageTimer
from verl.workers.actor_rollout_ref import ActorRolloutRefWorker
from verl.workers.columns import PROMPTS, model_non_tensors
from verl.workers.rollout import RolloutWorker

Metrics = Dict[str, float]
# Called with a training batch's prompts and the batch once it is generated (ReMax adds its greedy baselines).
OnBatch = Callable[[DataProto, DataProto], None]


class RolloutSource(Protocol):
    def next_batch(self, step: int) -> Tuple[DataProto, Metrics]:
        """The batch step `step` (0-based) trains on: rollout.n samples per prompt, adjacent, with the prompts'
        text columns and uids; and metrics about how it was made (agent/*, async/*)."""

    def extra_batch(self, step: int) -> DataProto:
        """A batch of the data's next prompts, generated now (DAPO's dynamic sampling asks for more)."""

    def generate(self, prompts: DataProto, n: int = 1, temperature: Optional[float] = None) -> DataProto:
        """n samples per prompt by the current policy, waited for (validation, greedy baselines)."""

    def update_weights(self, version: int, timer: StageTimer) -> Metrics:
        """The actor has made `version` updates: the rollout gets those weights (a colocated one already has)."""

    def busy_metrics(self, train_s: float, step_s: float) -> Metrics:
        """How busy each pool was over a step (empty when the rollout shares the actor's devices)."""

    def state(self) -> Dict[str, Any]:
        """What a checkpoint's trainer state keeps of this source (the data position among it)."""

    def save(self, path: str) -> None:
        """The rollout workers' part of a checkpoint at `path` (their sampler state), if they keep one."""

    def restore(self, state: Dict[str, Any], path: str, step: int) -> None:
        """Continue from a checkpoint at `path` written after `step` steps, `state` what `state()` returned."""

    def close(self) -> None: ...


class WorkerSampler:
    """Samples on the workers that generate: the rollout's own pool when it has one, else the actor's workers.
    Only the prompt tensors (and images) travel to the workers; the text columns stay here and are repeated
    alongside."""

    def __init__(self, workers: Any):
        self.group, self.method = (
            (workers.rollout, RolloutWorker.generate)
            if workers.rollout is not None
            else (workers.actor_rollout, ActorRolloutRefWorker.generate)
        )
        self.gen_s = 0.0  # seconds the rollout's pool generated, of the batches collected since the last take

    def submit(self, prompts: DataProto, n: int, temperature: Optional[float] = None) -> Callable[[], DataProto]:
        """Start sampling n responses per prompt (samples of a prompt adjacent); returns what waits for them."""
        images = model_non_tensors(prompts)  # (they travel with the prompts, and come back in the rollout's batch)
        call = self.group.submit(self.method, prompts.select(PROMPTS, images), n=n, temperature=temperature)
        text = prompts.select([], [k for k in prompts.non_tensor_batch if k not in images]).repeat(n, interleave=True)

        def finish() -> DataProto:
            out = call.result()
            seconds = [out.meta_info.pop(k) for k in [k for k in out.meta_info if k.startswith("gen_s/")]]
            self.gen_s += max(seconds, default=0.0)  # the slowest replica's: how long the pool was busy
            return out.union(text)

        return finish

    def call(self, inputs: DataProto, temperature: Optional[float], max_new_tokens: int) -> DataProto:
        """One generate call of one sample per row (an agent round's model turns)."""
        out = self.group.call(self.method, inputs, n=1, temperature=temperature, max_new_tokens=max_new_tokens)
        for k in [k for k in out.meta_info if k.startswith("gen_s/")]:
            out.meta_info.pop(k)
        return out


class AgentSampler:
    """rollout.agent.loop over the workers' sampler: n trajectories per prompt, each round of model turns one
    generate call; the agent/* metrics travel in the batch's meta_info["agent_metrics"]. `background`: the loops
    run on a thread of their own (one_step_off: the batch ahead's loops run while the actor trains)."""

    def __init__(self, agents: AgentRollouts, workers: WorkerSampler, background: bool):
        self.agents, self.workers = agents, workers
        self.thread = ThreadPoolExecutor(1, "agents") if background else None

    @property
    def gen_s(self) -> float:  # (the workers' sampler counts them)
        return self.workers.gen_s

    @gen_s.setter
    def gen_s(self, value: float) -> None:
        self.workers.gen_s = value

    def submit(self, prompts: DataProto, n: int, temperature: Optional[float] = None) -> Callable[[], DataProto]:
        text = prompts.select([], None).repeat(n, interleave=True)

        def run() -> DataProto:
            batch, metrics = self.agents.sample(prompts, n, temperature, self.workers.call)
            self.workers.gen_s += metrics["timing/agent_generate_s"]
            batch.meta_info["agent_metrics"] = metrics
            return batch.union(text)

        return self.thread.submit(run).result if self.thread is not None else run

    def close(self) -> None:
        if self.thread is not None:
            self.thread.shutdown(wait=True)


class _Source:
    """What the sources share: the prompts' uids, the weight sync into a rollout apart, and busy time."""

    def __init__(self, workers: Any, loader: Any, *, n: int, dp: int, total_steps: int):
        self.workers, self.loader, self.n, self.dp, self.total_steps = workers, loader, n, dp, total_steps
        self.apart = workers.rollout is not None
        self.reads = 0  # prompt batches read: part of every uid, so groups of different batches never merge
        self.step = 0
        self.gen_s = 0.0

    def with_uids(self, prompts: DataProto) -> DataProto:
        """One uid per prompt: group estimators (GRPO, RLOO) compare the samples that share it."""
        self.reads += 1
        uids = [f"{self.step}-{self.reads}-{i}" for i in range(len(prompts))]
        prompts.non_tensor_batch["uid"] = np.array(uids, dtype=object)
        return prompts

    def update_weights(self, version: int, timer: StageTimer) -> Metrics:
        if not self.apart:  # the actor's update loaded them into the colocated rollout
            return self.workers.synced_in_update(version)
        with timer("rollout_sync"):  # waits for a batch the rollout is generating, then loads
            return self.workers.sync_weights(version)

    def busy_metrics(self, train_s: float, step_s: float) -> Metrics:
        gen_s, self.gen_s = self.take_gen_s(), 0.0
        if not self.apart:
            return {}
        return {
            "perf/train_busy_fraction": min(1.0, train_s / step_s),
            "perf/rollout_busy_fraction": min(1.0, gen_s / step_s),
            "timing/rollout_gen_s": gen_s,
        }

    def take_gen_s(self) -> float:
        return self.gen_s

    def close(self) -> None:
        pass


class SyncRollouts(_Source):
    """trainer.mode=sync: the step's batch generated when the step asks for it, by the latest weights."""

    def __init__(self, sampler: Any, workers: Any, loader: Any, *, on_batch: Optional[OnBatch] = None, **kw: Any):
        super().__init__(workers, loader, **kw)
        self.sampler, self.on_batch = sampler, on_batch
        self.ahead: Optional[PendingRollout] = None

    def submit(self) -> PendingRollout:
        """Read the data's next prompts and start generating rollout.n samples of each."""
        prompts = self.with_uids(self.loader.next_batch())
        pending = self.sampler.submit(prompts, self.n)

        def finish() -> DataProto:
            batch = pending()
            if self.on_batch is not None:
                self.on_batch(prompts, batch)
            return batch

        return PendingRollout(finish)

    def next_batch(self, step: int) -> Tuple[DataProto, Metrics]:
        self.step = step
        batch = self.submit().result()
        return batch, batch.meta_info.pop("agent_metrics", {})

    def extra_batch(self, step: int) -> DataProto:
        self.step = step
        return self.submit().result()

    def generate(self, prompts: DataProto, n: int = 1, temperature: Optional[float] = None) -> DataProto:
        pad = (-len(prompts)) % self.dp  # whole shares for the rollout's data-parallel ranks
        padded = DataProto.concat([prompts, prompts[list(range(pad))]]) if pad else prompts
        out = self.sampler.submit(padded, n, temperature)()
        return out[list(range(len(out) - pad * n))] if pad else out

    def take_gen_s(self) -> float:
        gen_s, self.sampler.gen_s = self.sampler.gen_s, 0.0
        return gen_s

    def state(self) -> Dict[str, Any]:
        return {
            "data": self.loader.state_dict(),
            "in_flight": 0,
            "rollouts": self.reads,
            # one_step_off: the next step's batch, generated by the weights before this step's update (its prompts
            # are already past the data position); resuming trains on it, as the uninterrupted run would
            "ahead": batch_state(self.ahead.result()) if self.ahead is not None else None,
        }

    def save(self, path: str) -> None:
        if self.apart:
            self.workers.rollout.call(RolloutWorker.save_checkpoint, path)

    def restore(self, state: Dict[str, Any], path: str, step: int) -> None:
        self.loader.load_state_dict(state["data"])
        self.reads = state.get("rollouts", self.reads)
        if self.apart:  # its sampler's state, then the actor's weights
            self.workers.rollout.call(RolloutWorker.load_checkpoint, path)
            self.workers.sync_weights(step)
        if state.get("ahead") is not None:
            ahead = batch_from_state(state["ahead"])
            self.ahead = PendingRollout(lambda: ahead)

    def close(self) -> None:
        getattr(self.sampler, "close", lambda: None)()


class OneStepOffRollouts(SyncRollouts):
    """trainer.mode=one_step_off: step k's batch is the one started during step k-1 (by the weights before that
    step's update); the next step's is started as this one is handed out, to generate while this one trains (its
    prompts are read from the data now, so a checkpoint's data position includes them)."""

    def next_batch(self, step: int) -> Tuple[DataProto, Metrics]:
        self.step = step
        pending, self.ahead = self.ahead or self.submit(), None
        if step + 1 < self.total_steps:
            self.ahead = self.submit()
        batch = pending.result()
        return batch, batch.meta_info.pop("agent_metrics", {})


class ServiceRollouts(_Source):
    """trainer.mode=async: the rollout service on every rank of the rollout's pool, fed ahead of training within
    trainer.max_staleness (`AsyncRollouts`); validation goes through the service too, beside the batches ahead."""

    def __init__(self, cfg: VerlConfig, plan: Plan, tokenizer: Any, workers: Any, loader: Any, agents: Any, **kw: Any):
        super().__init__(workers, loader, **kw)
        r = cfg.rollout
        self.tokens_per_s: Optional[float] = None  # the rollout pool's rate while busy, as last measured
        self.client = RolloutClient(
            workers.rollout,
            chunk=r.service_chunk_tokens,
            max_batch=r.service_max_batch,
            pool=plan.pool("rollout").name,
            on_failure=r.on_replica_failure,
        )
        eos_ids, pad_id = eos_and_pad(tokenizer)
        make = functools.partial(AsyncAgentRollouts, agents=agents) if agents is not None else AsyncRollouts
        self.scheduler = make(
            self.client,
            read_prompts=lambda: self.with_uids(loader.next_batch()),
            data_position=loader.state_dict,
            n=r.n,
            temperature=r.temperature,
            response_length=plan.response_length,
            eos_ids=eos_ids,
            pad_id=pad_id,
            max_staleness=plan.max_staleness,
            total_steps=plan.total_steps,
            on_stale=cfg.trainer.on_stale,
            row_multiple=plan.train_dp,
        )

    def _drop_failed_replicas(self) -> None:
        """rollout.on_replica_failure=continue: the weights go to the replicas still alive (every rank of one: a
        replica spans its tp ranks, named by the first)."""
        tp = self.workers.rollout_tp
        alive = [r for r in self.workers.rollout_ranks if r - r % tp not in self.client.dead]
        if alive != self.workers.rollout_ranks:
            self.workers.join_weight_transfer(alive)

    def next_batch(self, step: int) -> Tuple[DataProto, Metrics]:
        self.step = step
        batch, info = self.scheduler.take(step)
        self._drop_failed_replicas()
        counters = self.client.take_counters()
        self.gen_s += counters.get("busy_s", 0.0) / max(1, len(self.client.replicas))
        info["async/interrupted"] = counters.get("interrupted", 0.0)  # samples midway at a sync
        if counters.get("busy_s"):  # what the rollout pool generated while it was busy, all replicas
            self.tokens_per_s = counters["tokens"] / counters["busy_s"] * len(self.client.replicas)
        if self.tokens_per_s is not None:  # (a pool that finished this batch before the last take: its last rate)
            info["perf/rollout_tokens_per_s"] = self.tokens_per_s
        info.update(batch.meta_info.pop("agent_metrics", {}))
        return batch, info

    def extra_batch(self, step: int) -> DataProto:
        raise NotImplementedError("trainer.mode=async generates ahead, not on demand (validate refuses this run)")

    def generate(self, prompts: DataProto, n: int = 1, temperature: Optional[float] = None) -> DataProto:
        if n != 1:
            raise NotImplementedError("trainer.mode=async generates one sample per prompt on demand (validation)")
        out = self.scheduler.generate_now(prompts, temperature)
        self._drop_failed_replicas()
        return out

    def update_weights(self, version: int, timer: StageTimer) -> Metrics:
        self.client.check_alive()  # a replica that died since the batch was taken leaves the group first
        self._drop_failed_replicas()
        return super().update_weights(version, timer)

    def state(self) -> Dict[str, Any]:
        # the data position before the oldest batch in flight (a resumed run generates those anew)
        return {
            "data": self.scheduler.data_position(),
            "in_flight": self.scheduler.in_flight_samples(),
            "rollouts": self.reads,
            "ahead": None,
        }

    def save(self, path: str) -> None:
        """(No sampler state to keep: what was in flight is generated anew.)"""

    def restore(self, state: Dict[str, Any], path: str, step: int) -> None:
        self.loader.load_state_dict(state["data"])
        self.reads = state.get("rollouts", self.reads)
        self.workers.sync_weights(step)
        self.scheduler.start_at(step)
        print(
            f"verl: {state.get('in_flight', 0)} samples were generating when that checkpoint was written; "
            "their prompts are generated anew",
            flush=True,
        )

    def close(self) -> None:
        self.scheduler.close()


def prompt_loaders(
    cfg: VerlConfig, tokenizer: Any, agents: Optional[AgentRollouts] = None, processor: Any = None
) -> Tuple[Any, Any]:
    """(train loader, val loader or None): the prompts of data.train_files and data.val_files, rendered with the
    agent loop's tool schemas when `agents` is given, their images read by a vision-language model's `processor`."""
    tools = agents.runner.tool_schemas if agents is not None else None
    return make_rl_dataloaders(cfg.data, tokenizer, seed=cfg.trainer.seed, tools=tools, processor=processor)


def make_agents(cfg: VerlConfig, plan: Plan, tokenizer: Any) -> Optional[AgentRollouts]:
    """rollout.agent.loop: trajectories of agent loops (tools, environments) instead of single completions."""
    if plan.agent_loop is None:
        return None
    eos_ids, pad_id = eos_and_pad(tokenizer)
    return AgentRollouts(
        cfg.rollout.agent,
        tokenizer,
        response_length=plan.response_length,
        max_prompt_length=plan.prompt_length,
        max_turns=plan.agent_max_turns,
        dp=plan.layout("rollout").dp,
        eos_ids=eos_ids,
        pad_id=pad_id,
    )


SOURCES = {"sync": SyncRollouts, "one_step_off": OneStepOffRollouts}


def make_rollout_source(
    cfg: VerlConfig,
    plan: Plan,
    tokenizer: Any,
    workers: Any,
    loader: Any,
    *,
    agents: Optional[AgentRollouts] = None,
    on_batch: Optional[OnBatch] = None,
) -> RolloutSource:
    """The source plan.mode names, generating on the run's workers (agent loops when `agents` is given)."""
    # (a run without a rollout role, offline DPO without validation, builds one that is never asked to generate)
    dp = plan.layout("rollout").dp if plan.has("rollout") else plan.train_dp
    kw = dict(n=cfg.rollout.n, dp=dp, total_steps=plan.total_steps)
    if plan.mode == "async":
        return ServiceRollouts(cfg, plan, tokenizer, workers, loader, agents, **kw)
    sampler: Any = WorkerSampler(workers)
    if agents is not None:
        sampler = AgentSampler(agents, sampler, background=plan.mode == "one_step_off")
    return SOURCES[plan.mode](sampler, workers, loader, on_batch=on_batch, **kw)
