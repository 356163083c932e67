"""Worker groups: N copies of one worker class (Ray actors, or one in-process worker) driven as one object.

    pool = ResourcePool("hybrid", nnodes=1, devices_per_node=2)
    actor = RayWorkerGroup(pool, ActorWorker, config, role="actor")
    actor.init_model()                      # ONE_TO_ALL: every rank runs it; a list of results
    out = actor.compute_log_prob(batch)     # DP_COMPUTE: batch split by dp rank, results concatenated

Every method of the worker class marked `@register(...)` becomes a method of the group; a call runs
`dispatch.split` (each rank's arguments), calls every rank, waits, and runs `dispatch.gather`.
`@register(..., blocking=False)` methods return a PendingCall at once; `.get()` waits and gathers.
A failure on any rank is raised as WorkerError (role, ranks, method, the worker's traceback).

LocalWorkerGroup runs one worker (world size 1) in this process with the same calls, for debugging
(`breakpoint()` works) and fast tests. Arguments and results are deep-copied, as a trip through Ray
copies them, so a worker that mutates its input behaves the same in both modes.
"""

from __future__ import annotations

import copy
import os
import time
import traceback
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import ray
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from verl.controller.dispatch import (
    Dispatch,
    DispatchInfo,
    MethodSpec,
    RankCall,
    gather,
    read_dispatch_infos,
    registered_methods,
    split,
)
from verl.controller.errors import WorkerError, clean_traceback
from verl.controller.resource_pool import ResourcePool, Slot
from verl.controller.worker import DEVICE_ENV, Worker, free_port

# After one rank fails, how long to wait for the others before raising: long enough to report ranks that fail
# together, short enough not to hang on ranks stuck in a collective with the failed one.
FAILURE_GRACE_S = 3.0

# Set by the group on every rank; a group's `env` may not override them.
RESERVED_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", DEVICE_ENV)
# Passed from the driver's environment to the workers when set there.
PASSED_ENV = ("RAY_AUTH_MODE",)


class WorkerGroup(Protocol):
    """What the trainer uses of a worker group, besides the registered methods attached to it."""

    role: str
    world_size: int

    def execute_all(self, method: str, *args: Any, **kwargs: Any) -> list: ...

    def execute_rank_zero(self, method: str, *args: Any, **kwargs: Any) -> Any: ...

    def refresh_dispatch_info(self) -> list[dict]: ...

    def shutdown(self) -> None: ...


# ---------------------------------------------------------------------------------------------
# Results in flight
# ---------------------------------------------------------------------------------------------


class PendingCall:
    """A call running on the ranks of a Ray worker group; `get()` waits, raises WorkerError, gathers."""

    def __init__(
        self, role: str, method: str, refs: Sequence[ray.ObjectRef | None], finish: Callable[[list], Any]
    ) -> None:
        self.role, self.method = role, method
        self._refs = list(refs)  # one per rank; None where the rank does not run
        self._finish = finish
        self._done = False
        self._value: Any = None

    def done(self) -> bool:
        """Whether every rank has finished (without waiting)."""
        refs = [ref for ref in self._refs if ref is not None]
        return self._done or len(ray.wait(refs, num_returns=len(refs), timeout=0)[0]) == len(refs)

    def get(self, timeout_s: float | None = None) -> Any:
        """The gathered result; TimeoutError (the call keeps running) if ranks are still busy after timeout_s."""
        if not self._done:
            results = collect(self.role, self.method, self._refs, timeout_s)
            self._value, self._done = self._finish(results), True
        return self._value


class DoneCall:
    """The local group's stand-in for PendingCall: the call already ran; `get()` returns or raises."""

    def __init__(self, finish: Callable[[], Any]) -> None:
        self._finish = finish

    def done(self) -> bool:
        return True

    def get(self, timeout_s: float | None = None) -> Any:
        return self._finish()


def collect(role: str, method: str, refs: Sequence[ray.ObjectRef | None], timeout_s: float | None = None) -> list:
    """Every rank's result (None where it did not run); WorkerError naming each rank that failed."""
    rank_of = {ref: rank for rank, ref in enumerate(refs) if ref is not None}
    results: list[Any] = [None] * len(refs)
    tracebacks: dict[int, str] = {}
    causes: dict[int, BaseException | None] = {}
    pending = list(rank_of)
    deadline = None if timeout_s is None else time.monotonic() + timeout_s

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
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        ready, pending = ray.wait(pending, num_returns=1, timeout=left)
        if not ready:
            busy = sorted(rank_of[ref] for ref in pending)
            raise TimeoutError(f"role '{role}': method '{method}' still running on ranks {busy} after {timeout_s} s")
        take(ready)
    if tracebacks and pending:  # a rank failed: give the rest a short grace to finish or fail too, then report
        ready, pending = ray.wait(pending, num_returns=len(pending), timeout=FAILURE_GRACE_S)
        take(ready)
    if tracebacks:
        unfinished = sorted(rank_of[ref] for ref in pending)
        raise WorkerError(role, method, tracebacks, causes, len(refs), unfinished)
    return results


# ---------------------------------------------------------------------------------------------
# Shared by both groups
# ---------------------------------------------------------------------------------------------


def check_worker_cls(worker_cls: type) -> None:
    if not (isinstance(worker_cls, type) and issubclass(worker_cls, Worker)):
        raise TypeError(f"worker_cls must be a subclass of verl.controller.Worker, got {worker_cls!r}")


def attach_methods(group: Any, worker_cls: type, methods: dict[str, MethodSpec], call: Callable) -> None:
    """Give the group one method per registered worker method: group.name(*a, **k) -> call(name, a, k)."""
    for name, spec in methods.items():
        if hasattr(type(group), name) or name in vars(group):
            raise TypeError(
                f"{worker_cls.__name__}.{name} is registered, but {type(group).__name__} already has an "
                f"attribute '{name}'; rename the worker method"
            )

        method = _group_method(call, name)
        method.__name__ = name
        method.__qualname__ = f"{type(group).__name__}.{name}"
        doc = getattr(worker_cls, name).__doc__
        method.__doc__ = f"[{spec.dispatch.name}{'' if spec.blocking else ', non-blocking'}] {doc or ''}".rstrip()
        setattr(group, name, method)


def _group_method(call: Callable, name: str) -> Callable:
    def method(*args: Any, **kwargs: Any) -> Any:
        return call(name, args, kwargs)

    return method


def unknown_method(group: Any, name: str) -> AttributeError:
    """The error for group.name when name is not a registered method of the worker class."""
    if name.startswith("__") or "worker_cls" not in vars(group):
        return AttributeError(name)
    cls = group.worker_cls
    registered = ", ".join(sorted(group.methods)) or "none"
    if callable(getattr(cls, name, None)):
        hint = f"it is not registered: decorate it with @register(...), or call group.execute_all('{name}', ...)"
    else:
        hint = f"registered methods: {registered}"
    return AttributeError(f"worker group '{group.role}' has no method '{name}' ({cls.__name__}.{name}: {hint})")


def _label(role: str, method: str) -> str:
    return f"{role}.{method}"


# ---------------------------------------------------------------------------------------------
# Ray
# ---------------------------------------------------------------------------------------------


@ray.remote(num_cpus=0)
def _address_and_free_port() -> tuple[str, int]:
    return ray.util.get_node_ip_address(), free_port()


def rendezvous_address(slot: Slot) -> tuple[str, int]:
    """MASTER_ADDR and MASTER_PORT for a group whose rank 0 lives in `slot`: that node's address and a port free there.

    On the driver's own node the driver picks the port; elsewhere a tiny task in rank 0's bundle does.
    """
    if slot.node_id == ray.get_runtime_context().get_node_id():
        return ray.util.get_node_ip_address(), free_port()
    where = PlacementGroupSchedulingStrategy(slot.placement_group, slot.bundle_index)
    return ray.get(_address_and_free_port.options(scheduling_strategy=where).remote())


def _put_shared(per_rank: list[RankCall]) -> list[RankCall]:
    """Put an argument passed to several ranks into the object store once (else Ray serializes it per rank)."""
    values = [v for call in per_rank if call is not None for v in (*call[0], *call[1].values())]
    uses = Counter(id(v) for v in values)
    refs: dict[int, ray.ObjectRef] = {}

    def share(value: Any) -> Any:
        if uses[id(value)] < 2 or isinstance(value, (int, float, bool, str, type(None), ray.ObjectRef)):
            return value
        if id(value) not in refs:
            refs[id(value)] = ray.put(value)
        return refs[id(value)]

    return [
        None if call is None else (tuple(share(v) for v in call[0]), {k: share(v) for k, v in call[1].items()})
        for call in per_rank
    ]


class RayWorkerGroup:
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
        *args: Any,
        role: str,
        env: dict[str, str] | None = None,
        resource_fraction: float = 1.0,
        **kwargs: Any,
    ) -> None:
        check_worker_cls(worker_cls)
        if not 0 < resource_fraction <= 1:
            raise ValueError(f"resource_fraction must be in (0, 1], got {resource_fraction}")
        clash = sorted(set(env or {}) & set(RESERVED_ENV))
        if clash:
            raise ValueError(f"env may not set {', '.join(clash)}: the worker group sets them for each rank")
        self.role, self.pool, self.worker_cls = role, pool, worker_cls
        self.resource_fraction = resource_fraction
        self.methods = registered_methods(worker_cls)
        self.slots: list[Slot] = pool.slots()
        self.world_size = len(self.slots)
        self.master_addr, self.master_port = rendezvous_address(self.slots[0])
        remote_cls = ray.remote(worker_cls)
        self._actors = [
            remote_cls.options(**self._actor_options(slot, env or {})).remote(*args, **kwargs) for slot in self.slots
        ]
        try:
            collect(role, "__init__", [actor.__ray_ready__.remote() for actor in self._actors])
        except WorkerError:
            self.shutdown()
            raise
        self._infos: dict[str, list[DispatchInfo]] = {}
        attach_methods(self, worker_cls, self.methods, self._call)

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

    @property
    def actors(self) -> list[ray.actor.ActorHandle]:
        """The Ray actor handles, in rank order (for what the group does not cover)."""
        return list(self._actors)

    def __getattr__(self, name: str) -> Any:
        raise unknown_method(self, name)

    def _call(self, name: str, args: tuple, kwargs: dict) -> Any:
        spec = self.methods[name]
        label = _label(self.role, name)
        infos = self._dispatch_infos(spec.mesh) if spec.dispatch is Dispatch.DP_COMPUTE else None
        per_rank = _put_shared(split(spec.dispatch, label, args, kwargs, self.world_size, infos))
        refs = [
            None if call is None else getattr(actor, name).remote(*call[0], **call[1])
            for actor, call in zip(self._actors, per_rank)
        ]
        pending = PendingCall(self.role, name, refs, lambda results: gather(spec.dispatch, label, results, infos))
        return pending.get() if spec.blocking else pending

    def _run(self, method: str, per_rank: list[RankCall]) -> list:
        if getattr(self.worker_cls, method, None) is None:
            raise AttributeError(f"{self.worker_cls.__name__} has no method '{method}'")
        refs = [
            None if call is None else getattr(actor, method).remote(*call[0], **call[1])
            for actor, call in zip(self._actors, _put_shared(per_rank))
        ]
        return collect(self.role, method, refs)

    def execute_all(self, method: str, *args: Any, **kwargs: Any) -> list:
        """Call any worker method (registered or not) on every rank with the same arguments; every rank's result."""
        return self._run(method, split(Dispatch.ONE_TO_ALL, method, args, kwargs, self.world_size))

    def execute_rank_zero(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """Call any worker method on rank 0 only; its result."""
        return self._run(method, split(Dispatch.RANK_ZERO, method, args, kwargs, self.world_size))[0]

    def _dispatch_infos(self, mesh: str = "train") -> list[DispatchInfo]:
        if mesh not in self._infos:
            self._infos[mesh] = read_dispatch_infos(self.role, self.execute_all("dispatch_info", mesh))
        return self._infos[mesh]

    def refresh_dispatch_info(self) -> list[dict]:
        """Forget every mesh's cached layout (the group reads each mesh once, at its first DP_COMPUTE call, and
        again after this); returns the ranks' "train" layout, re-read now."""
        self._infos = {}
        return [vars(info).copy() for info in self._dispatch_infos("train")]

    def shutdown(self) -> None:
        """Kill the actors (the pool's reservation stays: other groups may share it; see ResourcePool.remove)."""
        for actor in self._actors:
            ray.kill(actor, no_restart=True)
        self._actors = []

    def __enter__(self) -> RayWorkerGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()


# ---------------------------------------------------------------------------------------------
# In-process
# ---------------------------------------------------------------------------------------------


def _local_traceback(err: BaseException) -> str:
    """The worker-side part of a traceback caught by the local group (its own frame dropped)."""
    tb = err.__traceback__.tb_next if err.__traceback__ is not None else None
    return "".join(traceback.format_exception(type(err), err, tb or err.__traceback__)).rstrip()


class LocalWorkerGroup:
    """One `worker_cls` in this process (world size 1), with the same calls and errors as RayWorkerGroup.

    The process environment gets RANK=0, WORLD_SIZE=1, LOCAL_RANK=0, MASTER_ADDR/PORT (kept when already
    set: colocated local groups share this process and its one process group) and `env`. `pool` (optional) only
    gives the device type, and `resource_fraction` is accepted for the same signature as RayWorkerGroup.
    """

    world_size = 1

    def __init__(
        self,
        pool: ResourcePool | None,
        worker_cls: type[Worker],
        *args: Any,
        role: str,
        env: dict[str, str] | None = None,
        resource_fraction: float = 1.0,
        **kwargs: Any,
    ) -> None:
        check_worker_cls(worker_cls)
        if pool is not None and pool.world_size != 1:
            raise ValueError(
                f"local mode runs one in-process worker, but pool '{pool.name}' has {pool.world_size} devices "
                f"(node sizes {list(pool.node_sizes)}); use a 1-device pool or mode='ray'"
            )
        clash = sorted(set(env or {}) & set(RESERVED_ENV))
        if clash:
            raise ValueError(f"env may not set {', '.join(clash)}: the worker group sets them")
        self.role, self.pool, self.worker_cls = role, pool, worker_cls
        self.methods = registered_methods(worker_cls)
        os.environ.update({key: str(value) for key, value in (env or {}).items()})
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1")
        os.environ.update({DEVICE_ENV: pool.device if pool is not None else "cpu"})
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(free_port()))
        try:
            self.worker = worker_cls(*copy.deepcopy(args), **copy.deepcopy(kwargs))
        except Exception as err:
            raise WorkerError(role, "__init__", {0: _local_traceback(err)}, {0: err}, 1) from err
        self._infos: dict[str, list[DispatchInfo]] = {}
        attach_methods(self, worker_cls, self.methods, self._call)

    def __getattr__(self, name: str) -> Any:
        raise unknown_method(self, name)

    def _run_one(self, method: str, call: RankCall) -> Any:
        """Call the worker method by value (deep copies in and out, like a Ray round trip)."""
        if call is None:
            return None
        args, kwargs = copy.deepcopy(call)
        try:
            result = getattr(self.worker, method)(*args, **kwargs)
        except Exception as err:
            raise WorkerError(self.role, method, {0: _local_traceback(err)}, {0: err}, 1) from err
        return copy.deepcopy(result)

    def _call(self, name: str, args: tuple, kwargs: dict) -> Any:
        spec = self.methods[name]
        label = _label(self.role, name)
        infos = self._dispatch_infos(spec.mesh) if spec.dispatch is Dispatch.DP_COMPUTE else None
        (call,) = split(spec.dispatch, label, args, kwargs, 1, infos)
        try:
            results, error = [self._run_one(name, call)], None
        except WorkerError as err:  # raised by get(), as a Ray call's error would be
            results, error = None, err

        def finish() -> Any:
            if error is not None:
                raise error
            return gather(spec.dispatch, label, results, infos)

        pending = DoneCall(finish)
        return pending.get() if spec.blocking else pending

    def execute_all(self, method: str, *args: Any, **kwargs: Any) -> list:
        if getattr(self.worker_cls, method, None) is None:
            raise AttributeError(f"{self.worker_cls.__name__} has no method '{method}'")
        return [self._run_one(method, (args, kwargs))]

    def execute_rank_zero(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return self.execute_all(method, *args, **kwargs)[0]

    def _dispatch_infos(self, mesh: str = "train") -> list[DispatchInfo]:
        if mesh not in self._infos:
            self._infos[mesh] = read_dispatch_infos(self.role, self.execute_all("dispatch_info", mesh))
        return self._infos[mesh]

    def refresh_dispatch_info(self) -> list[dict]:
        self._infos = {}
        return [vars(info).copy() for info in self._dispatch_infos("train")]

    def shutdown(self) -> None:
        self.worker = None

    def __enter__(self) -> LocalWorkerGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()


GROUPS: dict[str, type] = {"ray": RayWorkerGroup, "local": LocalWorkerGroup}


def make_worker_group(
    mode: str, pool: ResourcePool | None, worker_cls: type[Worker], *args: Any, role: str, **kwargs: Any
) -> WorkerGroup:
    """A RayWorkerGroup (mode='ray') or LocalWorkerGroup (mode='local'), as trainer.controller says."""
    if mode not in GROUPS:
        raise ValueError(f"unknown controller mode {mode!r}; choose one of {', '.join(GROUPS)} (trainer.controller)")
    return GROUPS[mode](pool, worker_cls, *args, role=role, **kwargs)
