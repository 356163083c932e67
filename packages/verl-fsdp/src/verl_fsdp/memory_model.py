"""What an FSDP role's state holds on one rank, before anything starts: parameters, gradients and optimizer state
in bytes, from the model's parameter shapes and the role's layout as the engine stores them.

The engine keeps fp32 master weights (mixed precision casts a compute copy per layer while it runs), sharded by
FSDP2 over the role's data-parallel ranks: each parameter's dim 0 cut into `dp` chunks (torch.chunk's sizes, so
rank 0 holds the largest); gradients are sharded alike in fp32; torch's AdamW keeps two fp32 moments per trained
parameter and a 4-byte step counter per trained tensor. `FSDPEngine.held_bytes()` counts the same from the tensors
(tested equal).
"""

from __future__ import annotations

import copy
import math
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

from verl.decoder_dims import Dims
from verl.memory_model import ADAM_STEP_BYTES, FP32, MemoryModel, MicroBatch, PassSettings, StateBytes


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


def hf_parameter_shapes(
    hf_config: Any, kind: str = "causal_lm", lora: Optional[Any] = None, freeze_vision_tower: bool = False
) -> List[Tuple[str, Tuple[int, ...], bool]]:
    """(name, shape, trains) of every parameter of the Hugging Face model `hf_config` describes, built on the meta
    device (no memory): what the FSDP engine loads, with `lora`'s adapters when given (then only they, and a value
    head, train), its vision tower not training when frozen. A tied output head is one tensor."""
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText, AutoModelForTokenClassification

    from verl.data.vision import is_vision_model

    causal = AutoModelForImageTextToText if is_vision_model(hf_config) else AutoModelForCausalLM  # (as build_model)
    cls = causal if kind == "causal_lm" else AutoModelForTokenClassification
    if kind == "value":  # (the critic: the trunk with a one-number head, as the FSDP engine builds it)
        hf_config = copy.deepcopy(hf_config)
        hf_config.num_labels = 1
    with torch.device("meta"):
        model = cls.from_config(hf_config)
        if lora is not None:
            from verl_fsdp.lora import apply_lora

            model = apply_lora(model, lora, kind)
        if freeze_vision_tower:  # (as the engine freezes it)
            from verl_fsdp.vision import vision_tower

            vision_tower(model).requires_grad_(False)
    return [(name, tuple(p.shape), p.requires_grad) for name, p in model.named_parameters()]


def trained_shapes(
    shapes: Sequence[Tuple[str, Tuple[int, ...], bool]], trained: bool
) -> List[Tuple[Tuple[int, ...], bool]]:
    """(shape, trained) per tensor: those that train in the model (LoRA: the adapters), or none."""
    return [(shape, trained and trains) for _, shape, trains in shapes]


def tp_shapes(
    shapes: Sequence[Tuple[str, Tuple[int, ...], bool]], hf_config: Any, tp: int
) -> List[Tuple[str, Tuple[int, ...], bool]]:
    """Each tensor's shape on one tensor-parallel rank, by the model's declared plan (verl_fsdp.parallelize): a
    colwise projection keeps 1/tp of its rows (and bias), a rowwise one 1/tp of its columns (its bias whole)."""
    if tp == 1:
        return list(shapes)
    from verl_fsdp.parallelize import tp_style

    plan = getattr(hf_config, "base_model_tp_plan", None) or {}
    out = []
    for name, shape, trains in shapes:
        module, _, kind = name.rpartition(".")
        module = module.split(".", 1)[1] if module.startswith("model.") else module  # under the base model
        style = tp_style(plan, module)
        dim = 0 if style == "colwise" else 1 if style == "rowwise" and kind == "weight" else None
        if dim is not None:
            shape = tuple(n // tp if i == dim else n for i, n in enumerate(shape))
        out.append((name, shape, trains))
    return out


def state_bytes(
    hf_config: Any,
    sizes: Dict[str, Any],
    *,
    kind: str = "causal_lm",
    trains: bool = True,
    dtype: Optional[Any] = None,
    lora: Optional[Any] = None,
    freeze_vision_tower: bool = False,
) -> List[StateBytes]:
    """verl.memory_model's backend entry: the state on rank 0 (the largest), one stage: tensor-parallel pieces
    (tp), then FSDP's rows over the dp x cp ranks. `dtype` does not matter: the master weights are fp32 whatever
    the compute dtype."""
    tp, cp, dp = (int(sizes.get(axis) or 1) for axis in ("tp", "cp", "dp"))
    named = hf_parameter_shapes(hf_config, kind, lora, freeze_vision_tower)
    return [fsdp_state_bytes(trained_shapes(tp_shapes(named, hf_config, tp), trains), dp * cp)]


QK_NORM = ("qwen3", "qwen3_moe")  # model types with per-head query/key RMSNorm


def activation_bytes(
    hf_config: Any, sizes: Dict[str, Any], mb: MicroBatch, settings: PassSettings, *, stage: int = 0
) -> int:
    """Bytes autograd keeps for backward at the peak of one micro-batch's training pass through the FSDP engine's
    Hugging Face decoder (sdpa attention), term by term what its modules save (tests/fsdp/test_fsdp_memory.py
    measures them): Llama, Qwen2, Qwen3, Mistral and mixtures of experts (Qwen3-MoE: transformers' grouped experts,
    each routed token through its k experts). Each data-parallel rank runs its own micro-batches; tensor parallel
    (`sizes` tp) splits what attention and the MLP keep per head and column, sequence parallel (cp) the positions
    each rank keeps, except the mask over the whole sequence and the gathered final hidden states. `stage` changes
    nothing."""
    d, e, t = Dims.of(hf_config), settings.dtype_bytes, mb.tokens
    tp, cp = int(sizes.get("tp") or 1), int(sizes.get("cp") or 1)
    whole, t = t, -(-t // cp)  # the micro-batch's positions; this rank's
    h, q, kv = d.hidden, d.q, d.kv
    # RMSNorm computes in fp32: its fp32 input (or copy), 1/rms, the normalized input and the output, in dtype
    norm = (FP32 * h + FP32 + 2 * e * h) * t
    # sdpa keeps q, k, v, its output and the log-sum-exp per head; under a mask transformers repeats k and v to
    # every query head (no native GQA), and each layer keeps the mask it was given, converted to the dtype
    attention = (e * (2 * q + 2 * (q if mb.masked else kv)) + FP32 * d.heads) * t // tp
    attention += e * mb.rows * mb.seq**2 if mb.masked else 0
    if getattr(hf_config, "model_type", "") in QK_NORM:  # per-head RMSNorm on queries and keys, in fp32 too
        attention += ((FP32 + e) * (q + kv) + FP32 * (d.heads + d.kv_heads)) * t // tp
    mlp = 4 * e * d.intermediate * t // tp  # gate, its SiLU, up, and their product (the down projection's input)
    # a routed layer: the router's fp32 softmax, top-k indices and normalised weights, the sorted indices; per
    # routed token its input, gate|up [2i], SiLU, their product and the expert's output (weighted after)
    k = d.top_k
    moe = ((FP32 * d.experts + 40 * k + FP32) + k * e * (2 * h + 4 * d.expert_intermediate)) * t
    layers = [2 * norm + attention + (moe if r else mlp) for r in d.routed]
    fixed = 8 * t + 2 * e * mb.rows * mb.seq * d.head_dim // cp  # input ids; RoPE's cos and sin, shared by layers
    kept = mb.rows * mb.response  # positions whose log-probs are taken
    head = (FP32 * h + FP32 + e * h) * t + e * h * mb.rows * (mb.response + 1)  # final norm; the head input slice
    head += e * h * whole if cp > 1 else 0  # every position's final hidden state, gathered from the cp ranks
    if not settings.fused_logits:  # log-probs over the vocabulary in fp32; the entropy's log-softmax and softmax
        head += FP32 * d.vocab * kept * (3 if settings.entropy else 1)
    head += (FP32 + 8) * kept  # log-sum-exp, labels
    if settings.recompute:
        # Each layer keeps its input (torch's checkpoint holds it); backward recomputes one layer at a time, after
        # the head's saved tensors are gone; the recomputed layer's input is the one kept.
        return fixed + max(d.layers * e * h * t + head, (d.layers - 1) * e * h * t + max(layers))
    return fixed + sum(layers) + head


MEMORY_MODEL = MemoryModel(state_bytes=state_bytes, activation_bytes=activation_bytes, fp32_weights=True)
