"""What a training role's state holds on one rank, before anything starts: its parameters, gradients and optimizer
state in bytes, as its engine lays them out. Each train backend says how (`BackendSpec.memory_model`:
verl_fsdp.memory_model, verl_megatron.memory_model); this module holds what they share and the plan's section.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Callable, Dict, List

GIB = 2**30
FP32 = 4
ADAM_STEP_BYTES = 4  # torch's AdamW keeps `step` as a float32 scalar tensor per parameter tensor


@dataclass(frozen=True)
class StateBytes:
    """Bytes one rank holds for a role between steps (gradients: at the optimizer step)."""

    params: int
    grads: int
    optimizer: int

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optimizer

    def __add__(self, other: "StateBytes") -> "StateBytes":
        return StateBytes(self.params + other.params, self.grads + other.grads, self.optimizer + other.optimizer)

    def as_dict(self) -> dict:
        return {"params": self.params, "grads": self.grads, "optimizer": self.optimizer}


@dataclass(frozen=True)
class MicroBatch:
    """The largest micro-batch a pass runs on one rank, as the model sees it: `rows` rows of `seq` positions (padded
    rows; a packed pass: its packs), `response` positions per row whose log-probs are taken, under an attention mask
    or not (padding-free streams)."""

    rows: int
    seq: int
    response: int
    masked: bool = True

    @property
    def tokens(self) -> int:
        return self.rows * self.seq

    @classmethod
    def packed(cls, rows: int, n: int, prompt: int, response: int) -> "MicroBatch":
        """`rows` samples packed by shared prompt (model.shared_prefix; a prompt's n samples sit in a row): a pack
        per prompt, its prompt once and its responses after it, under a 4D mask."""
        k = min(n, rows)
        return cls(rows=-(-rows // n), seq=prompt + k * response, response=k * response)


@dataclass(frozen=True)
class PassSettings:
    """How a training pass computes, as far as the bytes it saves for backward go."""

    dtype_bytes: int = 2  # the compute dtype's element size (bf16 on GPUs, fp32 on CPU)
    recompute: bool = False  # activation checkpointing (model.gradient_checkpointing / megatron's full recompute)
    fused_logits: bool = False  # log-probs and entropy by the fused kernels: no [tokens, vocab] tensor is kept
    entropy: bool = True  # the entropy is computed with the loss (its log-softmax and probabilities are kept)
    fused_attention: bool = False  # GPU kernels (TransformerEngine's, flash): no [s, s] softmax kept


@dataclass(frozen=True)
class MemoryModel:
    """What a train backend registers (BackendSpec.memory_model): its engine's bytes, before launch.

    state_bytes(hf_config, parallel: dict, *, kind, trains, dtype, lora=None) -> [StateBytes] per pipeline stage
    (its largest rank); activation_bytes(hf_config, parallel, MicroBatch, PassSettings, *, stage=0) -> bytes kept
    for backward from one micro-batch."""

    state_bytes: Callable[..., List["StateBytes"]]
    activation_bytes: Callable[..., int]
    # how the engine holds things outside those: its weights in fp32 whatever it computes in (FSDP's master
    # weights: a gathered copy for generation is the compute dtype's); its gradients kept between steps (megatron's
    # grad buffer, given back only with the weights offloaded); log-probs through a vocab-parallel path that keeps
    # no [tokens, vocab] logits (megatron's), so only their gradient's slice counts
    fp32_weights: bool = False
    keeps_gradients: bool = False
    vocab_parallel_logits: bool = False


def size_text(n: int) -> str:
    """Bytes in the largest binary unit that keeps a whole number in front: 2.004 GiB, 21.3 KiB."""
    for unit, size in (("GiB", GIB), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.3f} {unit}" if unit == "GiB" else f"{n / size:.1f} {unit}"
    return f"{n} B"


def format_state(role: str, where: str, state: StateBytes, trained: bool) -> str:
    """The plan's line for one role's state on its largest rank (`where`: the backend and the rank)."""
    what = (
        f"parameters {size_text(state.params)}, gradients {size_text(state.grads)}, optimizer "
        f"{size_text(state.optimizer)}"
        if trained
        else f"parameters {size_text(state.params)} (no gradients or optimizer: it does not train)"
    )
    return f"{role} ({where}): {what}; {size_text(state.total)} in all"


TRAINED_ROLES = ("actor", "critic", "ref")  # the roles with a train engine (the reference's trains nothing)
HOW = {  # (what the numbers are made of, said once per backend)
    "fsdp": "fsdp: fp32 master weights and gradients sharded over data-parallel ranks, AdamW's two fp32 moments",
    "megatron": "megatron: weights in the model dtype and fp32 gradients in DDP's padded buffers; the distributed "
    "optimizer's slice of fp32 main weights (bf16 models) and AdamW's two fp32 moments",
}


def lora_of(cfg: Any, role: str) -> Any:
    """The role's verl.config.schema.LoraConfig when it trains adapters, else None (the reference: none)."""
    from verl.workers.build_engines import role_lora

    return role_lora(cfg.critic if role == "critic" else cfg.actor) if role != "ref" else None


def compute_dtype(cfg: Any, plan: Any) -> Any:
    """The torch dtype the engines compute in: model.dtype on GPUs, float32 on CPU (EngineConfig.compute_dtype)."""
    import torch

    from verl.engine_protocol import DTYPES

    return torch.float32 if plan.device == "cpu" else DTYPES[str(cfg.model.dtype)]


def role_hf_config(cfg: Any, plan: Any, role: str) -> Any:
    """The Hugging Face config of the role's model; ValueError when its config.json is not here."""
    from transformers import AutoConfig

    from verl.model_source import local_model_folder

    path = str(plan.role(role).model_path or cfg.model.path)
    folder = local_model_folder(path)
    if folder is None:
        raise ValueError(f"{path} is built, converted or downloaded at run time")
    return AutoConfig.from_pretrained(folder)


_STATES: Dict[Any, List[StateBytes]] = {}


def role_states(cfg: Any, plan: Any, role: str, spec: Any) -> List[StateBytes]:
    """The role's state on the largest rank of each pipeline stage, from its backend's memory model; kept per model,
    layout and settings (validate's lines and table, and a search's re-plans, ask again)."""
    kind, trains = ("value", True) if role == "critic" else ("causal_lm", role != "ref")
    hf, rp, lora, dtype = role_hf_config(cfg, plan, role), plan.role(role), lora_of(cfg, role), compute_dtype(cfg, plan)
    frozen = role == "actor" and bool(cfg.actor.get("freeze_vision_tower", False))  # (fsdp: the only engine with it)
    sizes = rp.layout.sizes()
    key = (
        str(hf._name_or_path),
        tuple(sorted(sizes.items())),
        kind,
        trains,
        str(dtype),
        repr(lora),
        frozen,
        rp.backend,
    )
    if key not in _STATES:
        options = {**({"lora": lora} if lora else {}), **({"freeze_vision_tower": True} if frozen else {})}
        with warnings.catch_warnings():  # (megatron announces its apex/TransformerEngine fallbacks: not news here)
            warnings.simplefilter("ignore")
            _STATES[key] = spec.load("memory_model").state_bytes(
                hf, sizes, kind=kind, trains=trains, dtype=dtype, **options
            )
    return _STATES[key]


def state_lines(cfg: Any, plan: Any) -> List[str]:
    """The "# memory" section of `verl validate` / `--dry-run`: each training role's state on the largest rank of
    each pipeline stage, for a model whose config.json is here; what is not estimated says so."""
    from verl.backends import installed_backends

    installed = installed_backends()
    lines: List[str] = []
    backends = []
    for role in TRAINED_ROLES:
        if not plan.has(role) or (role == "ref" and plan.ref_from_actor):
            continue
        rp = plan.role(role)
        spec = installed.get(rp.backend)
        if spec is None or not spec.memory_model or spec.missing_requirements():
            lines.append(f"{role} ({rp.backend}): not estimated (the backend is not installed here)")
            continue
        try:
            stages = role_states(cfg, plan, role, spec)
        except ValueError as e:  # (no config.json here)
            lines.append(f"{role}: its state is not estimated: {e}")
            continue
        layout = " ".join(f"{k}{v}" for k, v in rp.layout.sizes().items() if v and (v > 1 or k == "dp"))
        for i, state in enumerate(stages):
            where = (
                f"{rp.backend}{' LoRA' if lora_of(cfg, role) else ''} {layout}"
                + (f", stage {i}" if len(stages) > 1 else "")
                + ", its largest rank"
            )
            lines.append(format_state(role, where, state, role != "ref"))
        if rp.backend not in backends:
            backends.append(rp.backend)
    return lines + [f"({HOW[b]})" for b in backends if b in HOW]
