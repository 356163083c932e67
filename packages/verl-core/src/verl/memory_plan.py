"""How much device memory each phase of a step needs on the busiest rank of each pool, before anything starts.

A pool's roles share its devices (the hybrid engine: actor, rollout, reference, critic colocated), so a phase's
peak is what every role keeps resident through it plus what the phase itself builds:

- generate: the rollout's weights and KV cache (vLLM/SGLang: `rollout.gpu_memory_utilization` of the device; the hf
  rollout: the actor's gathered weights and a cache for the prompts it generates for);
- <role> log-probs: the pass's logits over the vocabulary for one micro-batch (none with fused kernels);
- <role> update: gradients, optimizer state, the saved activations of the micro-batches in flight and the logits'
  gradient.

Residency follows the run's settings: `*.param_offload` / `*.optimizer_offload` keep a role's weights / optimizer in
host memory outside its own phases; `rollout.free_cache_engine` puts vLLM/SGLang to sleep outside generation. Each
backend's memory model (BackendSpec.memory_model) gives the bytes of its state and activations; this module adds the
rest and compares the peak with `placement.device_memory_gb`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

from verl.decoder_dims import Dims
from verl.memory_model import FP32, GIB, MicroBatch, PassSettings, StateBytes, compute_dtype, role_states, size_text

# Device memory of the accelerators a recipe may name (placement.accelerator), in GiB as torch reports it.
ACCELERATORS: Dict[str, float] = {
    "h100": 79.2,
    "h200": 139.8,
    "a100-80gb": 79.2,
    "a100-40gb": 39.4,
    "l40s": 44.4,
    "b200": 178.4,
}
WARN_SHARE = 0.9  # a peak above this share of the device memory is a warning (allocator fragmentation, buffers)


@dataclass
class Phase:
    """One phase's bytes on a pool's busiest rank, by component."""

    pool: str
    name: str
    parts: Dict[str, int] = field(default_factory=dict)
    role: Optional[str] = None  # the role whose pass it is (None: generation)
    rank: int = 0  # the global rank these bytes are on

    @property
    def peak(self) -> int:
        return sum(self.parts.values())


@dataclass(frozen=True)
class RoleModel:
    """What the phases need of one training role: its state on its largest rank, its passes' activations."""

    role: str
    state: StateBytes
    param_offload: bool
    optimizer_offload: bool
    keeps_gradients: bool  # (the backend's MemoryModel)
    update_activations: int = 0
    update_logits: int = 0  # the logits' transient tensors in the update (their gradient)
    pass_logits: int = 0  # the log-prob / value pass's logits for one micro-batch
    weights: int = 0  # the model in the compute dtype (what a colocated hf rollout generates with)
    kv_per_token: int = 0  # a KV cache entry of one token, all layers
    rank: int = 0  # the global rank that holds the most (its pipeline stage's first rank)


def _micro(rows: Optional[int], max_tokens: Optional[int], seq: int, response: int) -> MicroBatch:
    """The largest micro-batch: `rows` rows of the longest sequence, or what a token budget lets in (one row at
    least: a longer row runs alone)."""
    if max_tokens is not None:
        rows = max(1, max_tokens // seq)
    return MicroBatch(rows=int(rows or 1), seq=seq, response=response)


def role_model(cfg: Any, plan: Any, role: str, spec: Any) -> RoleModel:
    """Ask the role's backend for its state and activations on its largest rank (the largest stage)."""
    from verl.memory_model import role_hf_config

    model = spec.load("memory_model")
    stages = role_states(cfg, plan, role, spec)
    stage = max(range(len(stages)), key=lambda i: stages[i].total)
    state = stages[stage]
    hf, rp, section = role_hf_config(cfg, plan, role), plan.role(role), getattr(cfg, role)
    d, e = Dims.of(hf), compute_dtype(cfg, plan).itemsize
    sizes = rp.layout.sizes()
    seq, response = plan.prompt_length + plan.response_length, plan.response_length
    vocab = d.vocab if role != "critic" else 1
    fused = bool(getattr(section, "use_fused_kernels", False)) or model.vocab_parallel_logits
    out: Dict[str, Any] = {}
    if rp.micro_batch is not None:
        mb = _micro(rp.micro_batch, rp.max_tokens, seq, response)
        # no gradient: the head's output in the dtype and its fp32 log-softmax over the kept positions
        out["pass_logits"] = 0 if fused else (e + 2 * FP32) * vocab * mb.rows * (response + 1)
    if role != "ref" and rp.train is not None:
        mb = _micro(rp.train.micro, rp.train.max_tokens, seq, response)
        settings = PassSettings(
            dtype_bytes=e,
            fused_attention=plan.device == "cuda",
            recompute=bool(cfg.model.gradient_checkpointing),
            fused_logits=fused,
            entropy=bool(getattr(section, "entropy_coeff", 0.0)) or int(getattr(section, "entropy_every", 0)) > 0,
        )
        shapes = [mb]
        if role in plan.shared_prefix and plan.batch is not None and plan.batch.n > 1:
            # packed by shared prompt where that pays (the engine decides per micro-batch): the larger of the two
            shapes.append(MicroBatch.packed(mb.rows, plan.batch.n, plan.prompt_length, response))
        per_micro = max(
            model.activation_bytes(hf, sizes, shape, settings, stage=s)
            for s in range(int(sizes.get("pp") or 1))
            for shape in shapes
        )
        # a pipeline's first stage holds up to pp micro-batches' activations (1F1B's warm-up)
        in_flight = min(int(sizes.get("pp") or 1), rp.train.micro_batches or 1)
        out["update_activations"] = per_micro * in_flight
        kept = mb.rows * response
        tp = int(sizes.get("tp") or 1)
        out["update_logits"] = (FP32 * vocab // tp) * kept if fused else (FP32 + e) * vocab * kept
    return RoleModel(
        role=role,
        state=state,
        param_offload=bool(getattr(section, "param_offload", False)),
        optimizer_offload=bool(getattr(section, "optimizer_offload", False)),
        keeps_gradients=model.keeps_gradients,
        weights=state.params * e // FP32 if model.fp32_weights else state.params,
        kv_per_token=d.kv_cache_bytes_per_token(e),
        rank=rp.layout.first_rank + rp.layout.rank(pp=stage),
        **out,
    )


def _resident(m: RoleModel, active: bool, updating: bool) -> Dict[str, int]:
    """What role `m` holds through a phase: all its state while it works (`active`), else what offload leaves."""
    s = m.state
    grads = s.grads if (updating or (m.keeps_gradients and not m.param_offload)) else 0
    return {
        f"{m.role} weights": s.params if (active or not m.param_offload) else 0,
        f"{m.role} gradients": grads,
        f"{m.role} optimizer": s.optimizer if (updating or not m.optimizer_offload) else 0,
    }


def phases(cfg: Any, plan: Any, models: Dict[str, RoleModel], device_bytes: Optional[int]) -> List[Phase]:
    """Each pool's phases on its busiest rank (each role's largest rank, summed where they share a pool)."""
    out: List[Phase] = []
    for pool in plan.pools:
        trained = [models[r] for r in pool.roles if r in models]
        steps: List[Tuple[str, Optional[str], bool]] = []
        if "rollout" in pool.roles:
            steps.append(("generate", None, False))
        for r in ("actor", "ref", "critic"):
            if r in models and r in pool.roles and plan.role(r).micro_batch:
                if not (r == "actor" and plan.old_log_probs == "update"):
                    steps.append((f"{r} log-probs" if r != "critic" else "critic values", r, False))
        for r in ("actor", "critic"):
            if r in models and r in pool.roles and plan.role(r).train is not None:
                steps.append((f"{r} update", r, True))
        for name, role, updating in steps:
            phase = Phase(pool.name, name, role=role, rank=models[role].rank if role else pool.first_rank)
            for m in trained:
                phase.parts.update(_resident(m, active=m.role == role, updating=updating and m.role == role))
            if role is not None:
                m = models[role]
                if updating:
                    phase.parts[f"{role} activations"] = m.update_activations
                    phase.parts[f"{role} logits"] = m.update_logits
                else:
                    phase.parts[f"{role} logits"] = m.pass_logits
            if "rollout" in pool.roles and (name == "generate" or not cfg.rollout.free_cache_engine):
                phase.parts.update(
                    _rollout(cfg, plan, models.get("actor"), device_bytes, generating=name == "generate")
                )
            out.append(phase)
    return out


def _rollout(
    cfg: Any, plan: Any, actor: Optional[RoleModel], device_bytes: Optional[int], generating: bool
) -> Dict[str, int]:
    backend = plan.role("rollout").backend
    if backend in ("vllm", "sglang"):  # the engine reserves its share of the device: weights, cache, buffers
        share = float(cfg.rollout.gpu_memory_utilization)
        return {f"rollout ({backend}, {share:g} of the device)": int(share * device_bytes) if device_bytes else 0}
    if actor is None or not generating:
        return {}
    rows = plan.batch.samples // max(1, plan.role("rollout").layout.dp) if plan.batch else 1
    tokens = rows * (plan.prompt_length + plan.response_length)
    return {"rollout weights (the actor's, gathered)": actor.weights, "rollout KV cache": actor.kv_per_token * tokens}


def device_memory(cfg: Any) -> Tuple[Optional[int], str]:
    """(bytes per device, where that number comes from): placement.device_memory_gb, else the accelerator's."""
    placement = cfg.placement
    gb = placement.get("device_memory_gb")
    if gb is not None:
        return int(float(gb) * GIB), "placement.device_memory_gb"
    name = placement.get("accelerator")
    if name is not None:
        return int(ACCELERATORS[str(name)] * GIB), f"placement.accelerator={name}"
    return None, ""


def format_table(table: List[Phase], device_bytes: Optional[int]) -> List[str]:
    """phase x component, GiB, with each phase's peak; the device's size when known."""
    lines = []
    for pool in dict.fromkeys(p.pool for p in table):
        rows = [p for p in table if p.pool == pool]
        parts = [k for k in dict.fromkeys(k for p in rows for k in p.parts) if any(p.parts.get(k) for p in rows)]
        lines.append(f"pool '{pool}' (its busiest rank), GiB:")
        lines.append("| phase | " + " | ".join(parts) + " | peak |")
        lines.append("|---" * (len(parts) + 2) + "|")
        for p in rows:
            cells = [f"{p.parts.get(k, 0) / GIB:.2f}" if p.parts.get(k) else "-" for k in parts]
            lines.append(f"| {p.name} | " + " | ".join(cells) + f" | {p.peak / GIB:.2f} |")
    if table:
        top = max(table, key=lambda p: p.peak)
        of = f" of {size_text(device_bytes)} per device" if device_bytes else " (no device memory given: none checked)"
        lines.append(f"peak: {top.name} on pool '{top.pool}', {size_text(top.peak)}{of}")
    return lines


def estimate(cfg: Any, plan: Any) -> Tuple[List[Phase], List[str]]:
    """The phase table of a planned run, and a note for each role that is not estimated (and why)."""
    from verl.backends import installed_backends

    installed = installed_backends()
    models: Dict[str, RoleModel] = {}
    notes: List[str] = []
    for role in ("actor", "ref", "critic"):
        if not plan.has(role) or (role == "ref" and plan.ref_from_actor):
            continue
        spec = installed.get(plan.role(role).backend)
        if spec is None or not spec.memory_model or spec.missing_requirements():
            notes.append(f"{role}: not estimated (its backend '{plan.role(role).backend}' is not installed here)")
            continue
        try:
            models[role] = role_model(cfg, plan, role, spec)
        except (ValueError, OSError, RuntimeError, KeyError, TypeError) as e:
            notes.append(f"{role}: not estimated ({e})")
    return phases(cfg, plan, models, device_memory(cfg)[0]), notes


# What may bring a phase's peak down, per phase kind: (key, new value from the current one), tried in this order.
def _candidates(cfg: Any, plan: Any, phase: Phase) -> List[Tuple[str, Any]]:
    role = phase.role
    out: List[Tuple[str, Any]] = []
    if role is None:  # generation
        if plan.role("rollout").backend in ("vllm", "sglang"):
            share = float(cfg.rollout.gpu_memory_utilization)
            out.append(("rollout.gpu_memory_utilization", round(share * 0.75, 2)))
        for r in ("actor", "ref", "critic"):
            if plan.has(r) and not (r == "ref" and plan.ref_from_actor):
                out.append((f"{r}.param_offload", True))
                if r != "ref":
                    out.append((f"{r}.optimizer_offload", True))
        return out
    section = getattr(cfg, role)
    if phase.name.endswith("update"):
        tokens = section.get("ppo_max_tokens_per_device")
        if tokens:
            out.append((f"{role}.ppo_max_tokens_per_device", max(1, int(tokens) // 2)))
        elif int(section.ppo_micro_batch_size_per_device) > 1:
            out.append((f"{role}.ppo_micro_batch_size_per_device", int(section.ppo_micro_batch_size_per_device) // 2))
        if not cfg.model.gradient_checkpointing:
            out.append(("model.gradient_checkpointing", True))
    elif int(section.get("log_prob_micro_batch_size_per_device") or 1) > 1:
        value = int(section.log_prob_micro_batch_size_per_device) // 2
        out.append((f"{role}.log_prob_micro_batch_size_per_device", value))
    layout = plan.layout(role)
    if layout.backend == "megatron" and (layout.world // layout.tp) % 2 == 0:
        out.append((f"{role}.parallel.tp", layout.tp * 2))
    for r in ("actor", "critic", "ref"):
        if plan.has(r) and not (r == "ref" and plan.ref_from_actor) and r != role:
            out.append((f"{r}.param_offload", True))
    if role != "ref":
        out.append((f"{role}.optimizer_offload", True))
    return [(k, v) for k, v in out if cfg_value(cfg, k) != v]


def cfg_value(cfg: Any, key: str) -> Any:
    from omegaconf import OmegaConf

    return OmegaConf.select(cfg, key)


def with_overrides(cfg: Any, overrides: Sequence[Tuple[str, Any]]) -> Optional[Any]:
    """`cfg` with (key, value) overrides merged onto the schema's types (None: a value does not fit its key)."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    nested: Dict[str, Any] = {}
    for key, value in overrides:
        *parents, last = key.split(".")
        node = nested
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    try:
        return OmegaConf.merge(cfg, nested)
    except OmegaConfBaseException:
        return None


def replan(cfg: Any, overrides: Sequence[Tuple[str, Any]]) -> Optional[Tuple[Any, Any, List[Phase]]]:
    """(config, plan, phase table) with `overrides` applied; None when the config does not plan with them or a
    role's memory is not estimated."""
    from verl.config.validate import validate_and_plan

    changed = with_overrides(cfg, overrides)
    plan = validate_and_plan(changed, strict=False)[0] if changed is not None else None
    if plan is None:
        return None
    table, notes = estimate(changed, plan)
    return None if notes or not table else (changed, plan, table)


def _peak_with(cfg: Any, overrides: List[Tuple[str, Any]], pool: str) -> Optional[int]:
    """The pool's largest phase with `overrides` applied (None: the config does not plan with them)."""
    planned = replan(cfg, overrides)
    return max((p.peak for p in planned[2] if p.pool == pool), default=None) if planned else None


def suggestions(cfg: Any, plan: Any, table: List[Phase], device_bytes: int) -> List[List[Tuple[str, Any]]]:
    """Override sets that bring every phase under `device_bytes`: each single change that does alone, else the
    changes for the phases over it (the largest first) taken together in order until they fit."""
    over = sorted((p for p in table if p.peak > device_bytes), key=lambda p: -p.peak)
    changes = list(dict.fromkeys(c for p in over for c in _candidates(cfg, plan, p)))
    fits, together = [], []
    for change in changes:
        peak = _peak_with(cfg, [change], over[0].pool)
        if peak is not None and peak <= device_bytes:
            fits.append([change])
    if fits:
        return fits[:3]
    for change in changes:
        together.append(change)
        peak = _peak_with(cfg, together, over[0].pool)
        if peak is not None and peak <= device_bytes:
            for extra in list(together):  # (drop what the others make unneeded)
                rest = [c for c in together if c != extra]
                peak = _peak_with(cfg, rest, over[0].pool)
                if peak is not None and peak <= device_bytes:
                    together = rest
            return [together]
    return []


def value_text(value: Any) -> str:
    """A value as a key=value override writes it: YAML's true/false, a list or mapping in JSON (no spaces)."""
    import json

    if isinstance(value, bool):
        return str(value).lower()
    return json.dumps(value, separators=(",", ":")) if isinstance(value, (list, dict)) else str(value)


def fit_problems(cfg: Any, plan: Any, table: List[Phase]) -> List[Any]:
    """An error when a phase's peak does not fit a device (naming the phase, the rank and the overrides that would
    fit), a warning when it comes within WARN_SHARE of it."""
    from verl.config.errors import ConfigProblem

    device_bytes, source = device_memory(cfg)
    if device_bytes is None or not table:
        return []
    top = max(table, key=lambda p: p.peak)
    need = f"{top.name} needs ~{size_text(top.peak)} on rank {top.rank} (pool '{top.pool}')"
    if top.peak > device_bytes:
        options = suggestions(cfg, plan, table, device_bytes)
        fix = " or ".join(
            ", ".join(f"{k} {value_text(cfg_value(cfg, k))} -> {value_text(v)}" for k, v in o) for o in options
        )
        return [
            ConfigProblem(
                source,
                f"{need}, more than the {size_text(device_bytes)} of a device",
                fix or "more devices, a smaller micro-batch or offloading: no single change found fits",
            )
        ]
    if top.peak > WARN_SHARE * device_bytes:
        share = top.peak / device_bytes
        return [
            ConfigProblem(
                source,
                f"{need}, {share:.0%} of the {size_text(device_bytes)} of a device (allocator slack is not counted)",
                "leave more room: a smaller micro-batch, activation recompute, or offloading",
                severity="warning",
            )
        ]
    return []
