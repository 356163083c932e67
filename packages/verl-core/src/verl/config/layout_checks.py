"""Checks of a config's layout: pools and the hybrid engine, the controller and CUDA, and each role's parallel
layout as its backend can run it (FSDP, megatron's TP/PP/VPP/CP/SP/EP, the rollout's TP, offload, attention)."""

from __future__ import annotations

import importlib.util
from typing import Any, Dict, List, Optional, Sequence, Tuple

from verl.config.checks import Context, error_at, warning_at
from verl.config.errors import ConfigProblem
from verl.config.placement import TRAIN_ROLES, ref_inherits_parallel, role_backend, role_parallel, value
from verl.config.placement import estimator_inputs as _estimator_inputs
from verl.config.plan import lora_rank


def _train_parallels(ctx: Context) -> List[Tuple[str, Optional[str], Dict[str, Any]]]:
    """(role, backend, parallel sizes) of the enabled training roles with their own settings (a ref that
    inherits everything repeats the actor's problems)."""
    cfg = ctx.cfg
    return [
        (r, role_backend(cfg, r), role_parallel(cfg, r))
        for r in TRAIN_ROLES
        if r in ctx.draft.roles
        and not (r == "ref" and value(cfg, "ref.backend") is None and ref_inherits_parallel(cfg))
    ]


def check_placement(ctx: Context) -> List[ConfigProblem]:
    """Pools, their devices and the roles in them (computed by verl.config.placement)."""
    return list(ctx.draft.problems)


def check_hybrid_engine(ctx: Context) -> List[ConfigProblem]:
    """The actor and its reference share one pool (the reference computes on the actor's slice of each batch).
    The rollout shares it too (the hybrid engine) or has a pool of its own (disaggregated), which needs Ray
    workers, a rollout that receives full weights, and lets generation overlap training (trainer.mode)."""
    pools = dict(ctx.draft.role_pool)
    problems = []
    if "ref" in pools and "actor" in pools and pools["ref"] != pools["actor"]:
        problems.append(
            error_at(
                "placement.pools",
                f"the reference must share the actor's pool; got actor in '{pools['actor']}', ref in '{pools['ref']}'",
                "list ref in the actor's placement.pools entry",
            )
        )
    apart = "rollout" in pools and "actor" in pools and pools["rollout"] != pools["actor"]
    mode = value(ctx.cfg, "trainer.mode")
    if apart and value(ctx.cfg, "trainer.controller") == "local":
        problems.append(
            error_at(
                "trainer.controller",
                f"the rollout has a pool of its own ('{pools['rollout']}'), whose workers run beside the actor's as "
                "Ray actors; the local controller runs every worker in this one process",
                "set trainer.controller=auto (or ray), or list rollout in the actor's pool",
            )
        )
    if apart and value(ctx.cfg, "rollout.lora_sync") == "adapter" and lora_rank(ctx.cfg, "actor") >= 1:
        problems.append(
            error_at(
                "rollout.lora_sync",
                "adapter: a rollout on a pool of its own receives full (merged) weights over the transfer group",
                "set rollout.lora_sync=merged, or list rollout in the actor's pool",
            )
        )
    if mode in OVERLAP_MODES and not apart and "rollout" in pools:
        problems.append(
            error_at(
                "trainer.mode",
                f"{mode} generates the next batch while the actor trains, which needs the rollout on devices of its "
                f"own; here it shares pool '{pools['rollout']}' with the actor",
                "give the rollout a pool of its own, e.g. placement.pools=[{name: train, roles: [actor], devices: 1}, "
                "{name: gen, roles: [rollout]}] with placement.devices_per_node=2, or set trainer.mode=sync",
            )
        )
    if mode == "async":
        problems += _async_problems(ctx)
    elif value(ctx.cfg, "rollout.on_replica_failure") == "continue":
        problems.append(
            error_at(
                "rollout.on_replica_failure",
                f"continue drops a failed replica of the rollout service, which trainer.mode={mode} does not run "
                "(a failed rollout rank stops it, named)",
                "set trainer.mode=async, or rollout.on_replica_failure=stop",
            )
        )
    if mode in OVERLAP_MODES and apart and value(ctx.cfg, "actor.tis_imp_ratio_cap") is None:
        problems.append(
            warning_at(
                "actor.tis_imp_ratio_cap",
                f"{mode} trains on samples of an older policy than the actor's, uncorrected",
                "set actor.tis_imp_ratio_cap=2.0: each token weighted by min(pi_old / pi_rollout, 2), the decoupled "
                "PPO objective (recipes/grpo_tiny_async.yaml: +45.0 points with it, +17.5 without, at staleness 2)",
            )
        )
    return problems


def _async_problems(ctx: Context) -> List[ConfigProblem]:
    """What the rollout service does not serve yet."""
    cfg, problems = ctx.cfg, []
    if value(cfg, "algorithm.filter_groups.enable"):
        problems.append(
            error_at(
                "algorithm.filter_groups.enable",
                "dynamic sampling generates extra batches on demand; trainer.mode=async generates ahead",
                "set trainer.mode=one_step_off, or algorithm.filter_groups.enable=false",
            )
        )
    if "reward_baselines" in _estimator_inputs(cfg):
        problems.append(
            error_at(
                "algorithm.adv_estimator",
                f"{value(cfg, 'algorithm.adv_estimator')} needs a greedy baseline per prompt, which "
                "trainer.mode=async does not generate",
                "set trainer.mode=one_step_off, or another estimator (grpo, rloo)",
            )
        )
    return problems


OVERLAP_MODES = ("one_step_off", "async")  # trainer.mode values where generation runs beside training


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def check_cuda_here(ctx: Context) -> List[ConfigProblem]:
    # Only when strict: planning a GPU run from a laptop is fine.
    if not ctx.strict or value(ctx.cfg, "placement.device") != "cuda" or _cuda_available():
        return []
    return [
        error_at(
            "placement.device",
            "placement.device=cuda but CUDA is not available here (torch.cuda.is_available() is False)",
            "set placement.device=cpu, or run on a GPU node",
        )
    ]


def check_controller(ctx: Context) -> List[ConfigProblem]:
    """The local controller stays on one node; a run on Ray needs Ray installed (verl-core's `ray` extra)."""
    nnodes = value(ctx.cfg, "placement.nnodes")
    if value(ctx.cfg, "trainer.controller") == "local" and isinstance(nnodes, int) and nnodes > 1:
        return [
            error_at(
                "trainer.controller",
                f"the local controller runs workers in this process and cannot span placement.nnodes={nnodes} nodes",
                "set trainer.controller=ray, or placement.nnodes=1",
            )
        ]
    plan = ctx.draft.plan
    if plan.controller == "ray" and importlib.util.find_spec("ray") is None:
        problem = ConfigProblem(
            "trainer.controller",
            f"this run's workers are Ray actors ({plan.controller_why}), and Ray is not installed",
            "pip install 'verl-core[ray]' (or, for one device, trainer.controller=local)",
            "error" if ctx.strict else "warning",
        )
        return [problem]
    return []


def _not_one(parallel: Dict[str, Any], axes: Sequence[str]) -> List[str]:
    return [a for a in axes if (parallel.get(a) or 1) != 1]


def check_fsdp_layout(ctx: Context) -> List[ConfigProblem]:
    """FSDP splits a role by data parallelism, plus tensor parallelism (dense layers) or Ulysses sequence
    parallelism (cp); it has no pipeline stages."""
    problems: List[ConfigProblem] = []
    experts = None
    for role, backend, parallel in _train_parallels(ctx):
        if backend != "fsdp":
            continue
        tp, cp = parallel.get("tp") or 1, parallel.get("cp") or 1
        if (parallel.get("pp") or 1) != 1:
            problems.append(
                error_at(
                    f"{role}.parallel.pp",
                    f"backend fsdp has no pipeline stages; pp={parallel['pp']} is not supported",
                    f"set {role}.backend=megatron for pp > 1, or {role}.parallel.pp=1",
                )
            )
        if tp > 1 and cp > 1:
            problems.append(
                error_at(
                    f"{role}.parallel.cp",
                    f"backend fsdp splits a role by tensor or by sequence parallelism, not both (tp={tp}, cp={cp})",
                    f"set {role}.parallel.tp=1 or {role}.parallel.cp=1, or {role}.backend=megatron",
                )
            )
        if tp > 1 and lora_rank(ctx.cfg, role) >= 1:
            problems.append(
                error_at(
                    f"{role}.parallel.tp",
                    "LoRA on the fsdp engine is data parallel; its adapters are not split over tp ranks",
                    f"set {role}.parallel.tp=1 (FSDP shards the frozen base over the ranks)",
                )
            )
        if tp > 1:
            experts = model_experts(ctx.cfg) if experts is None else experts
            if experts:
                problems.append(
                    error_at(
                        f"{role}.parallel.tp",
                        f"fsdp tensor parallel splits dense layers; this model routes over {experts} experts",
                        f"set {role}.backend=megatron (tp, ep, etp), or {role}.parallel.tp=1",
                    )
                )
        if cp > 1:
            attn = value(ctx.cfg, "model.attn_implementation")
            if isinstance(attn, str) and attn not in ("sdpa", "eager"):
                problems.append(
                    error_at(
                        f"{role}.parallel.cp",
                        f"fsdp sequence parallel attends with a 4D mask over the whole sequence; {attn} takes none",
                        "set model.attn_implementation=sdpa",
                    )
                )
    return problems


def check_attention(ctx: Context) -> List[ConfigProblem]:
    """flash-attention kernels run on CUDA only."""
    attn = value(ctx.cfg, "model.attn_implementation")
    if isinstance(attn, str) and attn.startswith("flash_attention") and ctx.draft.plan.device == "cpu":
        return [
            error_at(
                "model.attn_implementation",
                f"{attn} runs on CUDA devices only; this run's placement.device is cpu",
                "set model.attn_implementation=sdpa (packed rows take its 4D mask), or place the run on GPUs",
            )
        ]
    return []


OFFLOAD_KEYS = (
    "actor.param_offload",
    "actor.optimizer_offload",
    "ref.param_offload",
    "critic.param_offload",
    "critic.optimizer_offload",
)


def check_offload(ctx: Context) -> List[ConfigProblem]:
    """Offload frees device memory; a CPU run has none to free (it works, copying within host memory)."""
    if ctx.draft.plan.device != "cpu":
        return []
    return [
        warning_at(
            key,
            "offload moves tensors from the device to host memory; on a CPU run it only copies them within host "
            "memory each step",
            f"set {key}=false on CPU (keep it for GPU runs)",
        )
        for key in OFFLOAD_KEYS
        if key.split(".")[0] in ctx.draft.roles and value(ctx.cfg, key)
    ]


def check_rollout_layout(ctx: Context) -> List[ConfigProblem]:
    """A rollout engine splits over tp (and the derived dp) only."""
    parallel = role_parallel(ctx.cfg, "rollout")
    problems = [
        error_at(
            f"rollout.parallel.{axis}",
            f"rollouts support tensor parallelism only; {axis}={parallel[axis]} is not supported",
            f"set rollout.parallel.{axis}=1 (use rollout.parallel.tp to split the model)",
        )
        for axis in _not_one(parallel, ("pp", "cp", "ep"))
    ]
    if parallel.get("vpp") is not None:
        problems.append(
            error_at(
                "rollout.parallel.vpp",
                f"rollouts have no pipeline stages; vpp={parallel['vpp']}",
                "set rollout.parallel.vpp=null",
            )
        )
    if ctx.cfg.rollout.backend == "sglang":
        if (parallel.get("tp") or 1) != 1:
            problems.append(
                error_at(
                    "rollout.parallel.tp",
                    f"the sglang rollout generates with tp=1 only in this version; got tp={parallel['tp']}",
                    "set rollout.parallel.tp=1, or use rollout.backend=vllm for tensor-parallel generation",
                )
            )
        if ctx.cfg.placement.device != "cuda":
            problems.append(
                error_at(
                    "rollout.backend",
                    "the sglang rollout runs on CUDA GPUs only",
                    "set placement.device=cuda, or use rollout.backend=vllm (it has a CPU build) or hf",
                )
            )
    if ctx.cfg.rollout.backend == "vllm" and ctx.cfg.placement.device == "cpu" and model_experts(ctx.cfg):
        problems.append(
            error_at(
                "rollout.backend",
                "vLLM's CPU build cannot reload a mixture of experts' weights in place (its fused expert layers come "
                "back changed), so the rollout would not follow the actor",
                "use rollout.backend=hf on CPU, or placement.device=cuda",
            )
        )
    return problems


def check_virtual_pipeline(ctx: Context) -> List[ConfigProblem]:
    return [
        error_at(
            f"{role}.parallel.vpp",
            f"vpp={parallel['vpp']} needs pipeline parallelism, but {role}.parallel.pp={parallel.get('pp') or 1}",
            f"set {role}.parallel.pp to 2 or more, or {role}.parallel.vpp=null",
        )
        for role, _, parallel in _train_parallels(ctx)
        if parallel.get("vpp") is not None and (parallel.get("pp") or 1) <= 1
    ]


def check_sequence_parallel(ctx: Context) -> List[ConfigProblem]:
    """Sequence parallelism is megatron's, and splits sequences over tensor-parallel ranks."""
    problems = []
    rollout = ("rollout", role_backend(ctx.cfg, "rollout"), role_parallel(ctx.cfg, "rollout"))
    for role, backend, parallel in [*_train_parallels(ctx), rollout]:
        if not parallel.get("sequence_parallel"):
            continue
        key = f"{role}.parallel.sequence_parallel"
        if role == "rollout" or backend != "megatron":
            problems.append(
                error_at(key, f"sequence parallelism is a megatron setting; {role} uses {backend}", f"remove {key}")
            )
        elif (parallel.get("tp") or 1) == 1:
            problems.append(
                error_at(
                    key,
                    "sequence parallelism splits sequences over tensor-parallel ranks, but tp=1",
                    f"set {role}.parallel.tp to 2 or more, or {key}=null",
                )
            )
    return problems


def model_experts(cfg: Any) -> Optional[int]:
    """Routed experts of the configured model from its config.json (0: a dense model; None: not known here, such
    as a folder that lives only on the training machine)."""
    from verl.utils.hf_files import folder_experts

    path = value(cfg, "model.path")
    if not isinstance(path, str):
        return None
    if path.startswith("embedded:"):
        from verl.embedded.specs import EMBEDDED_MODELS

        spec = EMBEDDED_MODELS.get(path[len("embedded:") :])
        return None if spec is None else int(spec.settings.get("num_experts", 0))
    from verl.model_source import local_model_folder  # (a Hub id's cached snapshot, a GGUF file's folder)

    folder = local_model_folder(path)
    return None if folder is None else folder_experts(folder)


def _routing_replay_problems(ctx: Context, experts: Optional[int]) -> List[ConfigProblem]:
    """actor.routing_replay: a megatron mixture of experts; r3 also needs a rollout that records routes (hf, or
    vllm on a GPU; one completion per sample, synchronous)."""
    key, mode, backend = "actor.routing_replay", value(ctx.cfg, "actor.routing_replay"), value(ctx.cfg, "actor.backend")
    if backend != "megatron":
        why = f"routing replay is built on the megatron engine; the actor uses {backend}"
        return [error_at(key, why, f"set {key}=none, or actor.backend=megatron")]
    if experts == 0:
        why = "routing replay replays a mixture of experts' routes, and this model is dense"
        return [error_at(key, why, f"set {key}=none")]
    if mode != "r3":
        return []
    rollout, device = value(ctx.cfg, "rollout.backend"), value(ctx.cfg, "placement.device")
    if rollout != "hf" and not (rollout == "vllm" and device == "cuda"):
        why = (
            f"r3 replays the routes the rollout took; the hf rollout records them, and vllm on a GPU (its model "
            f"runner V2 needs Triton there), not {rollout} on {device}"
        )
        return [error_at(key, why, f"set rollout.backend=hf, or {key}=r2 (the old-log-prob pass records)")]
    if value(ctx.cfg, "rollout.agent.loop") is not None:
        why = "r3 records routes of one batched completion per sample; agent loops assemble trajectories turn by turn"
        return [error_at(key, why, f"set {key}=r2, or rollout.agent.loop=null")]
    if value(ctx.cfg, "trainer.mode") == "async":
        why = "r3 records routes in the batched rollout; the rollout service (trainer.mode=async) does not"
        return [error_at(key, why, f"set {key}=r2, or trainer.mode=sync")]
    return []


def check_expert_parallel(ctx: Context) -> List[ConfigProblem]:
    """Expert parallelism (ep, etp) splits a mixture of experts' layers: megatron only, experts % ep == 0, and
    the expert groups tiling the ranks of a pipeline stage (tp*cp*dp % (etp*ep) == 0, as megatron requires)."""
    experts = model_experts(ctx.cfg)
    problems: List[ConfigProblem] = []
    for role, backend, parallel in _train_parallels(ctx):
        ep, etp = parallel.get("ep") or 1, parallel.get("etp")
        if ep == 1 and etp is None:
            continue
        key = f"{role}.parallel.{'ep' if ep > 1 else 'etp'}"
        if experts == 0:
            problems.append(
                error_at(
                    key,
                    f"ep={ep}, etp={etp}: expert parallelism splits mixture-of-experts layers, and dense models "
                    "(this one: no num_experts / num_local_experts in its config.json) have none",
                    f"set {role}.parallel.ep=1" + (f" and {role}.parallel.etp=null" if etp is not None else ""),
                )
            )
        elif backend != "megatron":
            problems.append(
                error_at(key, f"ep={ep}, etp={etp}: expert parallelism is megatron's", f"set {role}.backend=megatron")
            )
        elif experts and experts % ep:
            problems.append(
                error_at(
                    key, f"ep={ep} does not divide the model's {experts} experts", f"choose an ep dividing {experts}"
                )
            )
    aux = value(ctx.cfg, "actor.moe_aux_loss_coeff")
    if isinstance(aux, (int, float)) and aux > 0:
        backend = value(ctx.cfg, "actor.backend")
        if backend != "megatron":
            problems.append(
                error_at(
                    "actor.moe_aux_loss_coeff",
                    f"megatron's load-balancing loss; the actor uses {backend}",
                    "set actor.moe_aux_loss_coeff=0, or actor.backend=megatron",
                )
            )
        elif experts == 0:
            problems.append(
                error_at(
                    "actor.moe_aux_loss_coeff",
                    "a load-balancing loss balances a mixture of experts' router, and this model is dense",
                    "set actor.moe_aux_loss_coeff=0",
                )
            )
    if value(ctx.cfg, "actor.routing_replay") in ("r2", "r3"):
        problems += _routing_replay_problems(ctx, experts)
    for layout in ctx.draft.plan.layouts if ctx.draft.plan is not None else ():
        if experts and layout.backend == "megatron" and layout.tp > 1 and not layout.sequence_parallel:
            problems.append(
                error_at(
                    f"{layout.role}.parallel.sequence_parallel",
                    f"a mixture of experts with tp={layout.tp} trains with sequence parallelism only (megatron's MoE "
                    "layer refuses to train without it)",
                    f"remove {layout.role}.parallel.sequence_parallel=false (it is on by default with tp > 1)",
                )
            )
        etp = getattr(layout, "etp", None) or layout.tp
        if layout.ep > 1 or etp != layout.tp:
            ranks = layout.tp * layout.cp * layout.dp
            if ranks % (etp * layout.ep):
                problems.append(
                    error_at(
                        f"{layout.role}.parallel.ep",
                        f"etp*ep = {etp}*{layout.ep} does not divide the {ranks} ranks of a pipeline stage "
                        f"(tp*cp*dp = {layout.tp}*{layout.cp}*{layout.dp}): megatron tiles each stage with expert groups",
                        f"choose ep and etp with etp*ep dividing {ranks}",
                    )
                )
    return problems
