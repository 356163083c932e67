"""How a call on a worker group is split across ranks and gathered back, declared per worker method.

A worker class marks the methods the driver may call with `@register(Dispatch.X)`. A call on a worker group,
`group.call(WorkerCls.method, ...)`, goes through two plain functions:

    per_rank = split(dispatch, label, args, kwargs, world_size, infos)   # what each rank is called with
    result   = gather(dispatch, label, results, infos)                   # what the driver gets back

Both are pure (no Ray), so the Ray group and the in-process local group share them exactly.

`infos` is each rank's `Worker.dispatch_info(mesh)`: its dp rank, the dp size, and whether the driver collects
its result. Each DP_COMPUTE method names its layout, `mesh` ("train" unless registered otherwise), since a
worker may lay its ranks out differently per method (a megatron actor trains with TP=2, its rollout generates
with TP=1). With TP=2 over 4 ranks, ranks 0,1 are dp rank 0 and get the same chunk; only rank 0's result is
collected. The others' results are still fetched (that is how their errors surface) and then dropped, so a
worker may return None on ranks that are not collected.
"""

from __future__ import annotations

import enum
import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from verl.protocol import DataProto


class Dispatch(enum.Enum):
    ONE_TO_ALL = "one_to_all"  # the same arguments to every rank; a list of every rank's result
    DP_COMPUTE = "dp_compute"  # the first argument (a DataProto) split by dp rank; collected results concatenated


@dataclass(frozen=True)
class MethodSpec:
    """How a registered worker method is dispatched."""

    dispatch: Dispatch
    mesh: str = "train"  # which of the worker's data-parallel layouts DP_COMPUTE splits by


@dataclass(frozen=True)
class DispatchInfo:
    """One rank's place in the data-parallel layout (what `Worker.dispatch_info()` returns, checked)."""

    dp_rank: int
    dp_size: int
    collect: bool


SPEC_ATTR = "__verl_dispatch__"

# One call's arguments for one rank.
RankCall = tuple[tuple, dict]


def register(dispatch: Dispatch = Dispatch.ONE_TO_ALL, *, mesh: str = "train") -> Callable:
    """Mark a worker method as callable from the driver through a worker group.

    Usable as `@register`, `@register(Dispatch.DP_COMPUTE)` or `@register(Dispatch.DP_COMPUTE, mesh="rollout")`.
    The method itself is unchanged; an override in a subclass keeps the base's registration unless decorated itself.
    """
    if inspect.isfunction(dispatch):  # bare @register
        return register()(dispatch)
    if not isinstance(dispatch, Dispatch):
        names = ", ".join(f"Dispatch.{d.name}" for d in Dispatch)
        raise TypeError(f"register(dispatch=...) takes a Dispatch ({names}), got {dispatch!r}")
    if not isinstance(mesh, str) or not mesh:
        raise TypeError(f"register(mesh=...) takes a layout name such as 'train' or 'rollout', got {mesh!r}")

    def decorate(fn: Callable) -> Callable:
        if not inspect.isfunction(fn):
            raise TypeError(f"@register decorates a plain method (def name(self, ...)), got {fn!r}")
        setattr(fn, SPEC_ATTR, MethodSpec(dispatch, mesh))
        return fn

    return decorate


def registered_methods(cls: type) -> dict[str, MethodSpec]:
    """Every registered method of a worker class, by name: the nearest decorated definition along the MRO."""
    specs = {}
    for klass in reversed(cls.__mro__):  # nearer classes come later, so their registrations win
        for name, value in vars(klass).items():
            spec = getattr(value, SPEC_ATTR, None)
            if spec is not None and not name.startswith("__"):
                specs[name] = spec
    return dict(sorted(specs.items()))


def read_dispatch_infos(role: str, infos: Sequence[Mapping[str, Any]]) -> list[DispatchInfo]:
    """Check every rank's dispatch_info() and that together they cover each dp rank exactly once."""
    world = len(infos)
    checked = []
    for rank, info in enumerate(infos):
        missing = [key for key in ("dp_rank", "dp_size", "collect") if key not in info]
        if missing:
            raise ValueError(
                f"role '{role}': rank {rank}'s dispatch_info() lacks {', '.join(missing)} (got {dict(info)}); "
                "return {'dp_rank': int, 'dp_size': int, 'collect': bool}"
            )
        checked.append(DispatchInfo(int(info["dp_rank"]), int(info["dp_size"]), bool(info["collect"])))
    sizes = sorted({info.dp_size for info in checked})
    if len(sizes) != 1:
        by_rank = ", ".join(f"rank {r}: {info.dp_size}" for r, info in enumerate(checked))
        raise ValueError(f"role '{role}': ranks disagree on dp_size ({by_rank}); every rank must report the same")
    dp_size = sizes[0]
    if not 1 <= dp_size <= world:
        raise ValueError(f"role '{role}': dp_size={dp_size} must be between 1 and the world size {world}")
    for rank, checked_info in enumerate(checked):
        if not 0 <= checked_info.dp_rank < dp_size:
            raise ValueError(
                f"role '{role}': rank {rank} reports dp_rank={checked_info.dp_rank} outside 0..{dp_size - 1}"
            )
    for dp_rank in range(dp_size):
        ranks = [r for r, info in enumerate(checked) if info.dp_rank == dp_rank]
        collect = [r for r in ranks if checked[r].collect]
        if not ranks:
            raise ValueError(f"role '{role}': no rank has dp_rank={dp_rank}; its chunk of every batch would be lost")
        if len(collect) != 1:
            raise ValueError(
                f"role '{role}': dp_rank {dp_rank} (ranks {ranks}) must have exactly one rank with collect=True, "
                f"found {len(collect)} ({collect}); e.g. collect only on tp rank 0 of the last pp stage"
            )
    return checked


def split(
    dispatch: Dispatch,
    label: str,
    args: tuple,
    kwargs: dict,
    world_size: int,
    infos: Sequence[DispatchInfo] | None = None,
) -> list[RankCall]:
    """Each rank's (args, kwargs) for one call, as `Dispatch` says; `label` names the call in errors ("role.method")."""
    if dispatch is Dispatch.ONE_TO_ALL:
        return [(args, kwargs)] * world_size
    if not args or not isinstance(args[0], DataProto):
        got = type(args[0]).__name__ if args else "no positional argument"
        raise TypeError(f"{label} is DP_COMPUTE: its first positional argument must be a DataProto, got {got}")
    data, rest = args[0], args[1:]
    dp_size = infos[0].dp_size
    if len(data) % dp_size:
        raise ValueError(
            f"{label} is DP_COMPUTE over dp_size={dp_size}: the batch has {len(data)} rows, which do not split "
            f"evenly ({len(data)} % {dp_size} = {len(data) % dp_size}); use a batch size divisible by {dp_size} "
            "or pad the batch"
        )
    chunks = data.chunk(dp_size)
    return [((chunks[info.dp_rank], *rest), kwargs) for info in infos]


def gather(dispatch: Dispatch, label: str, results: Sequence[Any], infos: Sequence[DispatchInfo] | None = None) -> Any:
    """The driver's result from every rank's result (`results[rank]`), as `Dispatch` says; DP_COMPUTE results
    are ordered by dp rank and stay a list unless they are all DataProtos."""
    if dispatch is Dispatch.ONE_TO_ALL:
        return list(results)
    collected = sorted((info.dp_rank, rank) for rank, info in enumerate(infos) if info.collect)
    outputs = [results[rank] for _, rank in collected]
    if outputs and all(isinstance(out, DataProto) for out in outputs):
        try:
            return DataProto.concat(outputs)
        except ValueError as err:
            raise ValueError(f"{label}: the dp ranks' DataProtos cannot be concatenated: {err}") from err
    return outputs
