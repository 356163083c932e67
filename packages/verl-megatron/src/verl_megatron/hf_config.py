"""A Hugging Face model config read as megatron-core's: TransformerConfig fields and GPTModel arguments.

Supported architectures are listed in `ARCHITECTURES` (Llama, Qwen2, Qwen3: GQA, RoPE, RMSNorm, SwiGLU, tied or
untied embeddings, qkv bias, qk-norm; and the mixtures of experts Qwen3-MoE and Mixtral, see `verl_megatron.moe`);
anything they cannot express raises a ValueError naming the config key.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Dict

import torch.nn.functional as F

from verl_megatron.moe import moe_config_kwargs, moe_problems


@dataclass(frozen=True)
class Architecture:
    """What sets one HF decoder family apart, as megatron-core options."""

    qkv_bias: Callable[[Any], bool]  # bias on q/k/v projections (and only there)
    qk_norm: bool  # RMSNorm on each head's queries and keys (Qwen3)
    o_bias_key: str | None  # HF key that would also put a bias on o_proj/MLP (megatron: add_bias_linear)
    moe: bool = False  # mixture-of-experts MLPs (verl_megatron.moe describes the family)


ARCHITECTURES: Dict[str, Architecture] = {
    "llama": Architecture(qkv_bias=lambda c: False, qk_norm=False, o_bias_key="attention_bias"),
    "qwen2": Architecture(qkv_bias=lambda c: True, qk_norm=False, o_bias_key=None),
    "qwen3": Architecture(qkv_bias=lambda c: False, qk_norm=True, o_bias_key="attention_bias"),
    "qwen3_moe": Architecture(qkv_bias=lambda c: False, qk_norm=True, o_bias_key="attention_bias", moe=True),
    "mixtral": Architecture(qkv_bias=lambda c: False, qk_norm=False, o_bias_key=None, moe=True),
}

# HF rope_type -> how megatron's RotaryEmbedding expresses it.
LLAMA3_ROPE = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}


def architecture(hf_config: Any) -> Architecture:
    model_type = getattr(hf_config, "model_type", None)
    if model_type not in ARCHITECTURES:
        raise ValueError(
            f"model_type '{model_type}' (config.json) is not supported by the megatron backend; "
            f"supported: {', '.join(sorted(ARCHITECTURES))} (or use actor.backend=fsdp)"
        )
    return ARCHITECTURES[model_type]


def head_dim(hf_config: Any) -> int:
    return getattr(hf_config, "head_dim", None) or hf_config.hidden_size // hf_config.num_attention_heads


def rope(hf_config: Any) -> Dict[str, Any]:
    """rotary_base / rope_scaling / rope_scaling_factor for GPTModel from the HF rope settings."""
    params = dict(getattr(hf_config, "rope_parameters", None) or {})
    scaling = getattr(hf_config, "rope_scaling", None) or {}
    params = {**scaling, **params}
    theta = params.get("rope_theta", getattr(hf_config, "rope_theta", 10000.0))
    kind = params.get("rope_type", params.get("type", "default")) or "default"
    if kind == "default":
        return {"rotary_base": int(theta), "rope_scaling": False}
    if kind == "llama3":
        for key, want in LLAMA3_ROPE.items():
            if float(params.get(key, want)) != want:
                raise ValueError(
                    f"rope_parameters.{key}={params.get(key)}: megatron-core's llama3 RoPE scaling fixes it at {want}"
                )
        return {"rotary_base": int(theta), "rope_scaling": True, "rope_scaling_factor": float(params["factor"])}
    raise ValueError(f"rope_parameters.rope_type='{kind}' is not supported by the megatron backend (default, llama3)")


def check_supported(hf_config: Any) -> Architecture:
    """The architecture, after refusing settings megatron's GPT layer spec would silently get wrong."""
    arch = architecture(hf_config)
    problems = []
    if getattr(hf_config, "hidden_act", "silu") != "silu":
        problems.append(f"hidden_act='{hf_config.hidden_act}' (only silu, as SwiGLU)")
    if getattr(hf_config, "mlp_bias", False):
        problems.append("mlp_bias=true")
    if arch.o_bias_key and getattr(hf_config, arch.o_bias_key, False):
        problems.append(f"{arch.o_bias_key}=true (a bias on o_proj)")
    if getattr(hf_config, "use_sliding_window", False):
        problems.append("use_sliding_window=true")
    if not arch.moe and (getattr(hf_config, "num_experts", None) or getattr(hf_config, "num_local_experts", None)):
        problems.append("mixture-of-experts layers in a dense model type")
    if arch.moe:
        problems += moe_problems(hf_config)
    if problems:
        raise ValueError(
            f"{hf_config.model_type} config: {'; '.join(problems)} is not supported by the megatron backend"
        )
    return arch


def padded_vocab_size(vocab_size: int, tp: int, divisible_by: int = 1) -> int:
    """The vocabulary rounded up so every tensor-parallel rank holds the same number of rows."""
    multiple = divisible_by * tp
    return int(math.ceil(vocab_size / multiple) * multiple)


def transformer_config_kwargs(hf_config: Any) -> Dict[str, Any]:
    """The model-shape fields of megatron's TransformerConfig (parallel and precision fields come from the engine)."""
    arch = check_supported(hf_config)
    moe: Dict[str, Any] = {}
    if arch.moe:
        moe = moe_config_kwargs(hf_config)
    return dict(
        num_layers=hf_config.num_hidden_layers,
        hidden_size=hf_config.hidden_size,
        ffn_hidden_size=hf_config.intermediate_size,
        num_attention_heads=hf_config.num_attention_heads,
        num_query_groups=hf_config.num_key_value_heads,
        kv_channels=head_dim(hf_config),
        normalization="RMSNorm",
        layernorm_epsilon=hf_config.rms_norm_eps,
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        add_qkv_bias=arch.qkv_bias(hf_config),
        qk_layernorm=arch.qk_norm,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        init_method_std=getattr(hf_config, "initializer_range", 0.02),
        **moe,
    )


def gpt_model_kwargs(hf_config: Any, tp: int) -> Dict[str, Any]:
    """GPTModel's constructor arguments besides config, layer spec and the pipeline-stage flags."""
    return dict(
        vocab_size=padded_vocab_size(hf_config.vocab_size, tp),
        max_sequence_length=hf_config.max_position_embeddings,
        position_embedding_type="rope",
        share_embeddings_and_output_weights=bool(getattr(hf_config, "tie_word_embeddings", False)),
        parallel_output=True,
        **rope(hf_config),
    )
