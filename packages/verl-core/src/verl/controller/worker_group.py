"""Worker groups: N ranks of one worker class (Ray actors, or one in-process worker) driven as one object.

    pool = ResourcePool("hybrid", nnodes=1, devices_per_node=2)
    actor = make_worker_group("ray", pool, ActorWorker, config, role="actor")   # or ray_group(pool, ...)
    actor.call(ActorWorker.init_model)                   # ONE_TO_ALL: every rank runs it; a list of results
    out = actor.call(ActorWorker.compute_log_prob, batch)  # DP_COMPUTE: split by dp rank, results concatenated

A call names the worker method itself (so go-to-definition leads from the call to the code that runs) or its
name. Ray and local mode differ only in the executor: `RayExecutor` (verl.controller.ray_executor) or
`LocalExecutor` (in this process, so `breakpoint()` works). A failure on any rank is raised as WorkerError.
"""

from __future__ import annotations

import copy
import functools
import os
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from verl.controller.dispatch import (
    Dispatch,
    DispatchInfo,
    RankCall,
    gather,
    read_dispatch_infos,
    registered_methods,
    split,
)
from verl.controller.errors import WorkerError
from verl.controller.resource_pool import ResourcePool
from verl.controller.worker import DEVICE_ENV, Worker, free_port
from verl.protocol import DataProto
from verl.registry import Registry

# After one rank fails, how long to wait for the others before raising: long enough to report ranks that fail
# together, short enough not to hang on ranks stuck in a collective with the failed one.
FAILURE_GRACE_S = 3.0

# Set by the group on every rank; a group's `env` may not override them.
RESERVED_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", DEVICE_ENV)
# Passed from the driver's environment to the workers when set there: Ray's token mode, and its distributed
# debugger (RAY_DEBUG=1: a `breakpoint()` in a worker waits for the debugger to attach; RAY_DEBUG_POST_MORTEM=1:
# a worker's exception stops there), and VERL_DEBUG (full tracebacks).
PASSED_ENV = ("RAY_AUTH_MODE", "RAY_DEBUG", "RAY_DEBUG_POST_MORTEM", "VERL_DEBUG")


class Executor(Protocol):
    """Runs one method on every rank of a group with that rank's arguments; every rank's result.

    `launch` starts a call and returns at once (Ray) or after running it (in-process); `wait` returns its
    results (raising WorkerError as `run` does). `run` is the two in one."""

    world_size: int

    def run(self, role: str, method: str, per_rank: list[RankCall]) -> list: ...

    def launch(self, role: str, method: str, per_rank: list[RankCall]) -> Any: ...

    def launch_rank(self, role: str, method: str, rank: int, call: RankCall) -> Any: ...

    def wait(self, role: str, method: str, handle: Any) -> list: ...

    def shutdown(self) -> None: ...


@dataclass
class CallStats:
    """Round trips to a group's workers and the bytes of tensors and arrays shipped each way."""

    calls: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0


def payload_bytes(value: Any) -> int:
    """Bytes of the tensors and numeric arrays in `value` (what dominates a call's transfer)."""
    if isinstance(value, DataProto):
        tensors = sum(t.numel() * t.element_size() for t in value.batch.values()) if value.batch is not None else 0
        return tensors + sum(payload_bytes(a) for a in value.non_tensor_batch.values())
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, np.ndarray):  # an object column (per row a dict of tensors: images' pixels): what it holds
        return sum(payload_bytes(v) for v in value) if value.dtype == object else int(value.nbytes)
    if isinstance(value, dict):
        return sum(payload_bytes(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(payload_bytes(v) for v in value)
    return 0


class PendingCall:
    """A call started on a worker group (`WorkerGroup.submit`); `result()` waits for it, once."""

    def __init__(self, finish: Callable[[], Any]) -> None:
        self._finish, self._done, self._value = finish, False, None

    def result(self) -> Any:
        if not self._done:
            self._value, self._done = self._finish(), True
        return self._value


class WorkerGroup:
    """The ranks of one worker class, called as one: `call` for registered methods, `call_all` for any;
    `submit` starts a registered call without waiting (two pools working at once)."""

    def __init__(self, executor: Executor, worker_cls: type[Worker], role: str) -> None:
        self.executor, self.worker_cls, self.role = executor, worker_cls, role
        self.methods = registered_methods(worker_cls)
        self.world_size = executor.world_size
        self.stats = CallStats()
        self._infos: dict[str, list[DispatchInfo]] = {}

    def call(self, method: Callable | str, *args: Any, **kwargs: Any) -> Any:
        """Call a registered worker method on the ranks its dispatch says, with the arguments split as it says."""
        return self.submit(method, *args, **kwargs).result()

    def submit(self, method: Callable | str, *args: Any, **kwargs: Any) -> PendingCall:
        """`call`, started now and gathered when its `result()` is asked for: the driver can start work on
        another group meanwhile (a rollout pool generating while the actor's trains). A worker runs its calls in
        the order they were submitted. In-process (local) groups run the call before returning."""
        name = self._registered(method)
        spec = self.methods[name]
        label = f"{self.role}.{name}"
        infos = self._dispatch_infos(spec.mesh) if spec.dispatch is Dispatch.DP_COMPUTE else None
        per_rank = split(spec.dispatch, label, args, kwargs, self.world_size, infos)
        self.stats.calls += 1
        self.stats.bytes_sent += payload_bytes(per_rank)
        handle = self.executor.launch(self.role, name, per_rank)

        def finish() -> Any:
            results = self.executor.wait(self.role, name, handle)
            self.stats.bytes_received += payload_bytes(results)
            return gather(spec.dispatch, label, results, infos)

        return PendingCall(finish)

    def submit_to(self, rank: int, method: Callable | str, *args: Any, **kwargs: Any) -> PendingCall:
        """A registered method on one rank only (its dispatch aside), e.g. one replica of a rollout service;
        `result()` is that rank's result. A failure raises WorkerError naming the rank."""
        name = self._registered(method)
        if not 0 <= rank < self.world_size:
            raise ValueError(f"{self.role}.{name}: rank {rank} outside 0..{self.world_size - 1}")
        self.stats.calls += 1
        self.stats.bytes_sent += payload_bytes((args, kwargs))
        handle = self.executor.launch_rank(self.role, name, rank, (args, kwargs))

        def finish() -> Any:
            (result,) = self.executor.wait(self.role, name, handle)
            self.stats.bytes_received += payload_bytes(result)
            return result

        return PendingCall(finish)

    def call_all(self, method: Callable | str, *args: Any, **kwargs: Any) -> list:
        """Call any worker method (registered or not) on every rank with the same arguments; every rank's result."""
        name = method if isinstance(method, str) else method.__name__
        if not callable(getattr(self.worker_cls, name, None)):
            raise AttributeError(f"{self.worker_cls.__name__} has no method '{name}'")
        return self._run(name, split(Dispatch.ONE_TO_ALL, name, args, kwargs, self.world_size))

    def take_stats(self) -> CallStats:
        """The round trips and bytes since the last take (then counting starts again)."""
        stats, self.stats = self.stats, CallStats()
        return stats

    def refresh_dispatch_info(self, *meshes: str) -> list[dict]:
        """Forget every mesh's cached layout (the group reads each mesh once, at its first DP_COMPUTE call, and
        again after this); reads the "train" layout and `meshes` now, and returns the ranks' "train" layout."""
        self._infos = {}
        for mesh in meshes:
            self._dispatch_infos(mesh)
        return [vars(info).copy() for info in self._dispatch_infos("train")]

    def shutdown(self) -> None:
        """Stop the workers (a pool's reservation stays: other groups may share it; see ResourcePool.remove)."""
        self.executor.shutdown()

    def __enter__(self) -> WorkerGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def _registered(self, method: Callable | str) -> str:
        name = method if isinstance(method, str) else getattr(method, "__name__", repr(method))
        if not isinstance(method, str) and not any(k.__dict__.get(name) is method for k in self.worker_cls.__mro__):
            raise AttributeError(
                f"worker group '{self.role}' runs {self.worker_cls.__name__}, which does not define "
                f"{getattr(method, '__qualname__', name)}: call one of {self.worker_cls.__name__}'s own methods"
            )
        if name in self.methods:
            return name
        cls = self.worker_cls
        if callable(getattr(cls, name, None)):
            hint = f"it is not registered: decorate it with @register(...), or use group.call_all('{name}', ...)"
        else:
            hint = f"registered methods: {', '.join(sorted(self.methods)) or 'none'}"
        raise AttributeError(f"worker group '{self.role}' cannot call '{name}' ({cls.__name__}.{name}: {hint})")

    def _run(self, name: str, per_rank: list[RankCall]) -> list:
        self.stats.calls += 1
        self.stats.bytes_sent += payload_bytes(per_rank)
        results = self.executor.run(self.role, name, per_rank)
        self.stats.bytes_received += payload_bytes(results)
        return results

    def _dispatch_infos(self, mesh: str = "train") -> list[DispatchInfo]:
        if mesh not in self._infos:
            self._infos[mesh] = read_dispatch_infos(self.role, self.call_all("dispatch_info", mesh))
        return self._infos[mesh]


def _check_env(env: dict[str, str] | None) -> None:
    clash = sorted(set(env or {}) & set(RESERVED_ENV))
    if clash:
        raise ValueError(f"env may not set {', '.join(clash)}: the worker group sets them for each rank")


def _local_traceback(err: BaseException) -> str:
    """The worker-side part of a traceback caught by the local executor (its own frame dropped)."""
    tb = err.__traceback__.tb_next if err.__traceback__ is not None else None
    return "".join(traceback.format_exception(type(err), err, tb or err.__traceback__)).rstrip()


class LocalExecutor:
    """One `worker_cls` in this process (world size 1), with the same calls and errors as RayExecutor.

    Arguments and results are deep-copied, as a trip through Ray copies them, so a worker that mutates its
    input behaves the same in both modes.

    The process environment gets RANK=0, WORLD_SIZE=1, LOCAL_RANK=0, MASTER_ADDR/PORT (kept when already
    set: colocated local groups share this process and its one process group) and `env`. `pool` (optional) only
    gives the device type.
    """

    world_size = 1

    def __init__(
        self,
        pool: ResourcePool | None,
        worker_cls: type[Worker],
        args: tuple,
        kwargs: dict,
        *,
        role: str,
        env: dict[str, str] | None = None,
    ) -> None:
        if pool is not None and pool.world_size != 1:
            raise ValueError(
                f"local mode runs one in-process worker, but pool '{pool.name}' has {pool.world_size} devices "
                f"(node sizes {list(pool.node_sizes)}); use a 1-device pool or mode='ray'"
            )
        _check_env(env)
        os.environ.update({key: str(value) for key, value in (env or {}).items()})
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1")
        os.environ[DEVICE_ENV] = pool.device if pool is not None else "cpu"
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(free_port()))
        try:
            self.worker = worker_cls(*copy.deepcopy(args), **copy.deepcopy(kwargs))
        except Exception as err:
            raise WorkerError(role, "__init__", {0: _local_traceback(err)}, {0: err}, 1) from err

    def run(self, role: str, method: str, per_rank: list[RankCall]) -> list:
        (call,) = per_rank
        args, kwargs = copy.deepcopy(call)
        try:
            result = getattr(self.worker, method)(*args, **kwargs)
        except Exception as err:
            raise WorkerError(role, method, {0: _local_traceback(err)}, {0: err}, 1) from err
        return [copy.deepcopy(result)]

    def launch(self, role: str, method: str, per_rank: list[RankCall]) -> Any:
        """Run the call now (one process: nothing runs beside the driver); its results or its error wait."""
        try:
            return self.run(role, method, per_rank), None
        except WorkerError as err:
            return None, err

    def launch_rank(self, role: str, method: str, rank: int, call: RankCall) -> Any:
        return self.launch(role, method, [call])

    def wait(self, role: str, method: str, handle: Any) -> list:
        results, err = handle
        if err is not None:
            raise err
        return results

    def shutdown(self) -> None:
        self.worker = None


def _ray_executor(*args: Any, **kwargs: Any) -> Executor:
    # Ray is imported only by runs that use it: an in-process run starts ~1 s sooner without it.
    from verl.controller.ray_executor import RayExecutor

    return RayExecutor(*args, **kwargs)


EXECUTORS = Registry("controller")  # trainer.controller, resolved: what runs a worker group's workers
EXECUTORS.register("ray")(_ray_executor)
EXECUTORS.register("local")(LocalExecutor)


def make_worker_group(
    mode: str,
    pool: ResourcePool | None,
    worker_cls: type[Worker],
    *args: Any,
    role: str,
    env: dict[str, str] | None = None,
    resource_fraction: float = 1.0,
    **kwargs: Any,
) -> WorkerGroup:
    """A group of `worker_cls(*args, **kwargs)` on `pool`: Ray actors (mode='ray') or one in-process worker
    (mode='local'), as trainer.controller says. `resource_fraction` of each device (Ray only) lets groups share it."""
    if mode not in EXECUTORS:
        raise ValueError(f"unknown controller mode {mode!r}; choose one of {', '.join(EXECUTORS)} (trainer.controller)")
    make_executor = EXECUTORS.get(mode)
    if not (isinstance(worker_cls, type) and issubclass(worker_cls, Worker)):
        raise TypeError(f"worker_cls must be a subclass of verl.controller.Worker, got {worker_cls!r}")
    options = {"resource_fraction": resource_fraction} if mode == "ray" else {}
    executor = make_executor(pool, worker_cls, args, kwargs, role=role, env=env, **options)
    return WorkerGroup(executor, worker_cls, role)


ray_group = functools.partial(make_worker_group, "ray")
local_group = functools.partial(make_worker_group, "local")
