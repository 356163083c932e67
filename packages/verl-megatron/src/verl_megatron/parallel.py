"""This process's place in megatron-core's parallel layout (TP, PP, virtual PP, CP, EP, DP), set up once."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch.distributed as dist


@dataclass(frozen=True)
class Layout:
    tp: int
    pp: int
    vpp: Optional[int]
    cp: int
    ep: int
    dp: int
    tp_rank: int
    pp_rank: int
    cp_rank: int
    dp_rank: int

    @property
    def chunks(self) -> int:
        """Model chunks held by this rank (virtual pipeline stages)."""
        return self.vpp or 1

    @property
    def last_stage(self) -> bool:
        return self.pp_rank == self.pp - 1

    @property
    def collect(self) -> bool:
        """Whether this rank returns its data-parallel replica's results: tp rank 0 of the last stage."""
        return self.tp_rank == 0 and self.cp_rank == 0 and self.last_stage


def _sizes(parallel: Any, world_size: int) -> dict:
    def get(key: str, default: Any) -> Any:
        value = getattr(parallel, key, None) if parallel is not None else None
        return default if value is None else value

    tp, pp, cp, ep, vpp = get("tp", 1), get("pp", 1), get("cp", 1), get("ep", 1), get("vpp", None)
    for key, value in (("tp", tp), ("pp", pp), ("cp", cp), ("ep", ep)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"parallel.{key} must be an int >= 1, got {value!r}")
    model_parallel = tp * pp * cp
    if world_size % model_parallel:
        raise ValueError(
            f"parallel tp*pp*cp = {tp}*{pp}*{cp} = {model_parallel} does not divide the role's {world_size} ranks; "
            "change parallel.tp / parallel.pp / parallel.cp or the devices in the pool"
        )
    dp = world_size // model_parallel
    want_dp = get("dp", None)
    if want_dp is not None and want_dp != dp:
        raise ValueError(f"parallel.dp={want_dp}, but {world_size} ranks / (tp*pp*cp = {model_parallel}) = {dp}")
    if vpp is not None and (pp < 2 or vpp < 1):
        raise ValueError(f"parallel.vpp={vpp} needs parallel.pp >= 2 and vpp >= 1 (pp={pp})")
    if vpp == 1:
        vpp = None
    return dict(tp=tp, pp=pp, vpp=vpp, cp=cp, ep=ep, dp=dp)


def sequence_parallel(parallel: Any, tp: int) -> bool:
    """parallel.sequence_parallel resolved as the placement plan does (None: on when tp > 1); true needs tp > 1."""
    from verl.placement import resolve_sequence_parallel

    value = getattr(parallel, "sequence_parallel", None) if parallel is not None else None
    if value and tp == 1:
        raise ValueError("parallel.sequence_parallel=true splits sequences over tensor-parallel ranks; it needs tp > 1")
    return resolve_sequence_parallel(value, tp)


def init_model_parallel(parallel: Any, seed: int) -> Layout:
    """Create megatron's process groups for `parallel` (a ParallelConfig) over the default group; seed its RNGs.

    Idempotent for the same layout, so an actor and a reference model in one process share the groups; a
    different layout in the same process is refused (megatron keeps one global parallel state per process).
    """
    from megatron.core import parallel_state as mpu
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

    if not dist.is_initialized():
        raise RuntimeError("megatron needs torch.distributed initialised first (the worker's init_distributed)")
    sizes = _sizes(parallel, dist.get_world_size())
    if mpu.model_parallel_is_initialized():
        current = current_layout()
        have = dict(tp=current.tp, pp=current.pp, vpp=current.vpp, cp=current.cp, ep=current.ep, dp=current.dp)
        if have != sizes:
            raise ValueError(
                f"megatron is already initialised in this process with {have}; a second model here asks for "
                f"{sizes}. Models colocated in one worker share one layout: give ref.parallel the actor's"
            )
        return current
    mpu.initialize_model_parallel(
        tensor_model_parallel_size=sizes["tp"],
        pipeline_model_parallel_size=sizes["pp"],
        virtual_pipeline_model_parallel_size=sizes["vpp"],
        context_parallel_size=sizes["cp"],
        expert_model_parallel_size=sizes["ep"],
    )
    model_parallel_cuda_manual_seed(seed)
    return current_layout()


def current_layout() -> Layout:
    from megatron.core import parallel_state as mpu

    return Layout(
        tp=mpu.get_tensor_model_parallel_world_size(),
        pp=mpu.get_pipeline_model_parallel_world_size(),
        vpp=mpu.get_virtual_pipeline_model_parallel_world_size(),
        cp=mpu.get_context_parallel_world_size(),
        ep=mpu.get_expert_model_parallel_world_size(),
        dp=mpu.get_data_parallel_world_size(),
        tp_rank=mpu.get_tensor_model_parallel_rank(),
        pp_rank=mpu.get_pipeline_model_parallel_rank(),
        cp_rank=mpu.get_context_parallel_rank(),
        dp_rank=mpu.get_data_parallel_rank(),
    )


def destroy_model_parallel() -> None:
    from megatron.core import parallel_state as mpu

    mpu.destroy_model_parallel()
