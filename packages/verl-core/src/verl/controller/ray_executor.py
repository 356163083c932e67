"""The Ray executor of a worker group: one Ray actor per device of a pool, calls as Ray tasks, failures of any
rank collected into one WorkerError. Imported only when a group runs on Ray (`verl.controller.worker_group`)."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Sequence
from typing import Any

import ray  # pants: no-infer-dep (the ray extra)
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy  # pants: no-infer-dep (the ray extra)

from verl.controller.dispatch import RankCall
from verl.controller.errors import WorkerError, clean_traceback
from verl.controller.resource_pool import ResourcePool, Slot
from verl.controller.worker import DEVICE_ENV, Worker, free_port
from verl.controller.worker_group import FAILURE_GRACE_S, PASSED_ENV, _check_env


def collect(role: str, method: str, refs: Sequence[ray.ObjectRef]) -> list:
    """Every rank's result; WorkerError naming each rank that failed."""
    rank_of = {ref: rank for rank, ref in enumerate(refs)}
    results: list[Any] = [None] * len(refs)
    tracebacks: dict[int, str] = {}
    causes: dict[int, BaseException | None] = {}
    pending = list(rank_of)

    def take(ready: list) -> None:
        for ref in ready:
            rank = rank_of[ref]
            try:
                results[rank] = ray.get(ref)
            except ray.exceptions.RayTaskError as err:  # the method raised: err.cause is the original exception
                tracebacks[rank], causes[rank] = clean_traceback(str(err)), err.cause
            except ray.exceptions.RayError as err:  # the actor died (crash, OOM kill) or its result was lost
                tracebacks[rank], causes[rank] = clean_traceback(f"{type(err).__name__}: {err}"), None

    while pending and not tracebacks:
        ready, pending = ray.wait(pending, num_returns=1)
        take(ready)
    if tracebacks and pending:  # a rank failed: give the rest a short grace to finish or fail too, then report
        ready, pending = ray.wait(pending, num_returns=len(pending), timeout=FAILURE_GRACE_S)
        take(ready)
    if tracebacks:
        unfinished = sorted(rank_of[ref] for ref in pending)
        raise WorkerError(role, method, tracebacks, causes, len(refs), unfinished)
    return results


@ray.remote(num_cpus=0)
def _address_and_free_port() -> tuple[str, int]:
    return ray.util.get_node_ip_address(), free_port()


def rendezvous_address(slot: Slot) -> tuple[str, int]:
    """MASTER_ADDR and MASTER_PORT for a group whose rank 0 lives in `slot`: that node's address and a port free there.

    On a cluster of one node every rank is on this machine, so the group rendezvouses on loopback and nothing it
    opens listens beyond it (controller/rendezvous.py). On the driver's own node the driver picks the port;
    elsewhere a tiny task in rank 0's bundle does.
    """
    if sum(1 for node in ray.nodes() if node["Alive"]) == 1:
        return "127.0.0.1", free_port("127.0.0.1")
    if slot.node_id == ray.get_runtime_context().get_node_id():
        return ray.util.get_node_ip_address(), free_port()
    where = PlacementGroupSchedulingStrategy(slot.placement_group, slot.bundle_index)
    return ray.get(_address_and_free_port.options(scheduling_strategy=where).remote())


def _put_shared(per_rank: list[RankCall]) -> list[RankCall]:
    """Put an argument passed to several ranks into the object store once (else Ray serializes it per rank)."""
    values = [v for args, kwargs in per_rank for v in (*args, *kwargs.values())]
    uses = Counter(id(v) for v in values)
    refs: dict[int, ray.ObjectRef] = {}

    def share(value: Any) -> Any:
        if uses[id(value)] < 2 or isinstance(value, (int, float, bool, str, type(None), ray.ObjectRef)):
            return value
        if id(value) not in refs:
            refs[id(value)] = ray.put(value)
        return refs[id(value)]

    return [(tuple(share(v) for v in args), {k: share(v) for k, v in kwargs.items()}) for args, kwargs in per_rank]


class RayExecutor:
    """One Ray actor of `worker_cls` per device of `pool`, each given torchrun-style rank variables.

    `resource_fraction` of every bundle is asked for, so groups with fractions summing to <= 1 can share a pool
    (colocation: rank r of each group on the same device). `env` is added to every worker's environment.
    `worker_cls(*args, **kwargs)` is constructed in each actor; the class travels by reference, so its module must
    be importable there (a package module, or the driver script itself).
    """

    def __init__(
        self,
        pool: ResourcePool,
        worker_cls: type[Worker],
        args: tuple,
        kwargs: dict,
        *,
        role: str,
        env: dict[str, str] | None = None,
        resource_fraction: float = 1.0,
    ) -> None:
        if not 0 < resource_fraction <= 1:
            raise ValueError(f"resource_fraction must be in (0, 1], got {resource_fraction}")
        _check_env(env)
        self.pool, self.resource_fraction = pool, resource_fraction
        self.slots: list[Slot] = pool.slots()
        self.world_size = len(self.slots)
        self.master_addr, self.master_port = rendezvous_address(self.slots[0])
        remote_cls = ray.remote(worker_cls)
        self.actors = [
            remote_cls.options(**self._actor_options(slot, env or {})).remote(*args, **kwargs) for slot in self.slots
        ]
        try:
            collect(role, "__init__", [actor.__ray_ready__.remote() for actor in self.actors])
        except WorkerError:
            self.shutdown()
            raise

    def _actor_options(self, slot: Slot, env: dict[str, str]) -> dict[str, Any]:
        env_vars = {key: os.environ[key] for key in PASSED_ENV if key in os.environ}
        env_vars.update({key: str(value) for key, value in env.items()})
        env_vars.update(
            RANK=str(slot.rank),
            WORLD_SIZE=str(self.world_size),
            LOCAL_RANK=str(slot.local_rank),
            LOCAL_WORLD_SIZE=str(slot.local_world_size),
            MASTER_ADDR=self.master_addr,
            MASTER_PORT=str(self.master_port),
            **{DEVICE_ENV: self.pool.device},
        )
        return {
            "scheduling_strategy": PlacementGroupSchedulingStrategy(slot.placement_group, slot.bundle_index),
            "num_cpus": self.resource_fraction * self.pool.cpus_per_device,
            "num_gpus": self.resource_fraction if self.pool.device == "cuda" else 0,
            "runtime_env": {"env_vars": env_vars},
        }

    def run(self, role: str, method: str, per_rank: list[RankCall]) -> list:
        return self.wait(role, method, self.launch(role, method, per_rank))

    def launch(self, role: str, method: str, per_rank: list[RankCall]) -> list[ray.ObjectRef]:
        return [
            getattr(actor, method).remote(*args, **kwargs)
            for actor, (args, kwargs) in zip(self.actors, _put_shared(per_rank))
        ]

    def launch_rank(self, role: str, method: str, rank: int, call: RankCall) -> tuple[int, ray.ObjectRef]:
        args, kwargs = call
        return rank, getattr(self.actors[rank], method).remote(*args, **kwargs)

    def wait(self, role: str, method: str, handle: list[ray.ObjectRef] | tuple[int, ray.ObjectRef]) -> list:
        if isinstance(handle, tuple):  # one rank's call (launch_rank): errors name that rank
            rank, ref = handle
            try:
                return collect(role, method, [ref])
            except WorkerError as err:
                raise WorkerError(
                    role, method, {rank: err.tracebacks[0]}, {rank: err.causes.get(0)}, self.world_size
                ) from err.causes.get(0)
        return collect(role, method, handle)

    def shutdown(self) -> None:
        for actor in self.actors:
            ray.kill(actor, no_restart=True)
        self.actors = []
