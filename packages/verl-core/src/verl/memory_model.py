"""What a training role's state holds on one rank, before anything starts: its parameters, gradients and optimizer
state in bytes, worked out from the model's parameter shapes and the role's layout as the engine stores them.

The FSDP engine keeps fp32 master weights (mixed precision casts a compute copy per layer while it runs), sharded
by FSDP2 over the role's data-parallel ranks: each parameter's dim 0 cut into `dp` chunks (torch.chunk's sizes, so
rank 0 holds the largest); gradients are sharded alike in fp32; torch's AdamW keeps two fp32 moments per trained
parameter and a 4-byte step counter per trained tensor. `TrainEngine.held_bytes()` counts the same from the tensors
(tested equal).
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any, Iterable, List, Sequence, Tuple

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


def shard_rows(rows: int, parts: int, rank: int = 0) -> int:
    """Rows of dim 0 that rank `rank` of `parts` holds when FSDP2 cuts it (torch.chunk: ceil-sized pieces)."""
    size = -(-rows // parts)
    return max(0, min(size, rows - rank * size))


def fsdp_state_bytes(shapes: Iterable[Tuple[Tuple[int, ...], bool]], dp: int, rank: int = 0) -> StateBytes:
    """The FSDP engine's state on data-parallel rank `rank` of `dp`, from (shape, trained) per parameter tensor;
    no optimizer (trained=False everywhere): the reference."""
    params = grads = optimizer = 0
    for shape, trained in shapes:
        local = (shard_rows(shape[0], dp, rank) if shape else 1) * math.prod(shape[1:])
        params += local * FP32
        if trained:
            grads += local * FP32
            optimizer += 2 * local * FP32 + ADAM_STEP_BYTES
    return StateBytes(params, grads, optimizer)


def hf_parameter_shapes(hf_config: Any, kind: str = "causal_lm") -> List[Tuple[str, Tuple[int, ...]]]:
    """(name, shape) of every parameter of the Hugging Face model `hf_config` describes, built on the meta device
    (no memory): what the FSDP engine loads. A tied output head is one tensor."""
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForTokenClassification

    cls = AutoModelForCausalLM if kind == "causal_lm" else AutoModelForTokenClassification
    if kind == "value":  # (the critic: the trunk with a one-number head, as the FSDP engine builds it)
        hf_config = copy.deepcopy(hf_config)
        hf_config.num_labels = 1
    with torch.device("meta"):
        model = cls.from_config(hf_config)
    return [(name, tuple(p.shape)) for name, p in model.named_parameters()]


def size_text(n: int) -> str:
    """Bytes in the largest binary unit that keeps a whole number in front: 2.004 GiB, 21.3 KiB."""
    for unit, size in (("GiB", GIB), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.3f} {unit}" if unit == "GiB" else f"{n / size:.1f} {unit}"
    return f"{n} B"


def format_state(role: str, backend: str, dp: int, state: StateBytes, trained: bool) -> str:
    """The plan's line for one role's state on its largest rank."""
    what = (
        f"parameters {size_text(state.params)}, gradients {size_text(state.grads)}, optimizer "
        f"{size_text(state.optimizer)} (fp32 master weights, fp32 gradients, AdamW's two fp32 moments)"
        if trained
        else f"parameters {size_text(state.params)} (no gradients or optimizer: it does not train)"
    )
    return f"{role} ({backend}, rank 0 of {dp} data-parallel): {what}; {size_text(state.total)} in all"


def trained_shapes(shapes: Sequence[Tuple[str, Tuple[int, ...]]], trained: bool) -> List[Tuple[Tuple[int, ...], bool]]:
    """(shape, trained) per tensor: every parameter trains, or none does."""
    return [(shape, trained) for _, shape in shapes]


STATE_ROLES = (("actor", "causal_lm", True), ("critic", "value", True), ("ref", "causal_lm", False))


def state_lines(cfg: Any, plan: Any) -> List[str]:
    """The "# memory" section of `verl validate` / `--dry-run`: each FSDP role's state on its largest rank, for a
    model whose config.json is here; what is not estimated yet says so."""
    from transformers import AutoConfig

    from verl.model_source import local_model_folder

    lines: List[str] = []
    for role, kind, trains in STATE_ROLES:
        if not plan.has(role) or (role == "ref" and plan.ref_from_actor):
            continue
        rp = plan.role(role)
        path = str(rp.model_path or cfg.model.path)
        if rp.backend != "fsdp":
            lines.append(f"{role} ({rp.backend}): its state is not estimated yet (the FSDP engine's is)")
            continue
        section = cfg.critic if role == "critic" else cfg.actor
        if role != "ref" and int(section.lora.rank or 0) > 0:
            lines.append(f"{role} (fsdp, LoRA): its state is not estimated yet (full training's is)")
            continue
        folder = local_model_folder(path)
        if folder is None:
            lines.append(f"{role}: {path} is built, converted or downloaded at run time; its state is not estimated")
            continue
        shapes = trained_shapes(hf_parameter_shapes(AutoConfig.from_pretrained(folder), kind), trains)
        dp = int(rp.layout.dp)
        lines.append(format_state(role, "fsdp", dp, fsdp_state_bytes(shapes, dp), trains))
    return lines
