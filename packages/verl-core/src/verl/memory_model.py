"""What a training role's state holds on one rank, before anything starts: its parameters, gradients and optimizer
state in bytes, as its engine lays them out. Each train backend says how (`BackendSpec.memory_model`:
verl_fsdp.memory_model, verl_megatron.memory_model); this module holds what they share and the plan's section.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Callable, List

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


STATE_ROLES = (("actor", "causal_lm", True), ("critic", "value", True), ("ref", "causal_lm", False))
HOW = {  # (what the numbers are made of, said once per backend)
    "fsdp": "fsdp: fp32 master weights and gradients sharded over data-parallel ranks, AdamW's two fp32 moments",
    "megatron": "megatron: weights in the model dtype and fp32 gradients in DDP's padded buffers; the distributed "
    "optimizer's slice of fp32 main weights (bf16 models) and AdamW's two fp32 moments",
}


def lora_of(cfg: Any, role: str) -> Any:
    """The role's verl.config.schema.LoraConfig when it trains adapters, else None (the reference: none)."""
    from verl.workers.build_engines import role_lora

    return role_lora(cfg.critic if role == "critic" else cfg.actor) if role != "ref" else None


def state_lines(cfg: Any, plan: Any) -> List[str]:
    """The "# memory" section of `verl validate` / `--dry-run`: each training role's state on the largest rank of
    each pipeline stage, for a model whose config.json is here; what is not estimated says so."""
    import torch
    from transformers import AutoConfig

    from verl.backends import installed_backends
    from verl.engine_protocol import DTYPES
    from verl.model_source import local_model_folder

    installed = installed_backends()
    dtype = torch.float32 if plan.device == "cpu" else DTYPES[str(cfg.model.dtype)]
    lines: List[str] = []
    backends = []
    for role, kind, trains in STATE_ROLES:
        if not plan.has(role) or (role == "ref" and plan.ref_from_actor):
            continue
        rp = plan.role(role)
        path = str(rp.model_path or cfg.model.path)
        spec = installed.get(rp.backend)
        if spec is None or not spec.memory_model or spec.missing_requirements():
            lines.append(f"{role} ({rp.backend}): not estimated (the backend is not installed here)")
            continue
        lora = lora_of(cfg, role)
        folder = local_model_folder(path)
        if folder is None:
            lines.append(f"{role}: {path} is built, converted or downloaded at run time; its state is not estimated")
            continue
        sizes = rp.layout.sizes()
        estimate = spec.load("memory_model").state_bytes
        with warnings.catch_warnings():  # (megatron announces its apex/TransformerEngine fallbacks: not news here)
            warnings.simplefilter("ignore")
            hf = AutoConfig.from_pretrained(folder)
            stages = estimate(hf, sizes, kind=kind, trains=trains, dtype=dtype, **({"lora": lora} if lora else {}))
        layout = " ".join(f"{k}{v}" for k, v in sizes.items() if v and (v > 1 or k == "dp"))
        for i, state in enumerate(stages):
            where = (
                f"{rp.backend}{' LoRA' if lora else ''} {layout}"
                + (f", stage {i}" if len(stages) > 1 else "")
                + ", its largest rank"
            )
            lines.append(format_state(role, where, state, trains))
        if rp.backend not in backends:
            backends.append(rp.backend)
    return lines + [f"({HOW[b]})" for b in backends if b in HOW]
