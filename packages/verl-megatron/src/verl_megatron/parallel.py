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
    etp: int = 1  # expert tensor parallelism (MoE layers' experts; megatron's default: tp)
    ep_rank: int = 0
    etp_rank: int = 0

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
    """The layout's sizes: a plan's Layout as it is, or a ParallelConfig laid over `world_size` ranks by the core's
    placement arithmetic (dp derived), the one place that arithmetic lives."""
    from verl.config.placement import Layout as PlanLayout
    from verl.config.placement import derive_layout

    layout = parallel
    if not isinstance(parallel, PlanLayout):
        axes = ("tp", "pp", "cp", "ep", "etp", "dp", "vpp", "sequence_parallel")
        wanted = {a: getattr(parallel, a, None) for a in axes}
        layout, problems = derive_layout("model", "megatron", wanted, ("engine", 0, world_size), "parallel")
        if layout is None:
            raise ValueError("; ".join(f"{p.key}: {p.message} ({p.fix})" for p in problems))
    if layout.world != world_size:
        raise ValueError(f"the layout spans {layout.world} ranks, but this role has {world_size}")
    vpp = layout.vpp
    if vpp is not None and (layout.pp < 2 or vpp < 1):
        raise ValueError(f"parallel.vpp={vpp} needs parallel.pp >= 2 and vpp >= 1 (pp={layout.pp})")
    etp = getattr(layout, "etp", None) or layout.tp
    return dict(
        tp=layout.tp, pp=layout.pp, vpp=None if vpp == 1 else vpp, cp=layout.cp, ep=layout.ep, etp=etp, dp=layout.dp
    )


def sequence_parallel(parallel: Any, tp: int) -> bool:
    """parallel.sequence_parallel resolved as the placement plan does (None: on when tp > 1); true needs tp > 1."""
    from verl.config.placement import resolve_sequence_parallel

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
        have = dict(
            tp=current.tp, pp=current.pp, vpp=current.vpp, cp=current.cp, ep=current.ep, etp=current.etp, dp=current.dp
        )
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
        expert_tensor_parallel_size=sizes["etp"],
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
        etp=mpu.get_expert_tensor_parallel_world_size(),
        ep_rank=mpu.get_expert_model_parallel_rank(),
        etp_rank=mpu.get_expert_tensor_parallel_rank(),
    )


def destroy_model_parallel() -> None:
    from megatron.core import parallel_state as mpu

    mpu.destroy_model_parallel()
