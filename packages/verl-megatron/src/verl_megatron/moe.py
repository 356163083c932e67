"""Mixture-of-experts families as megatron-core expresses them: which layers route, how, and the experts' HF names.

Two families convert: Qwen3-MoE (`qwen3_moe`: softmax router over `num_experts`, top `num_experts_per_tok`,
renormalised when `norm_topk_prob`; dense layers where `mlp_only_layers` / `decoder_sparse_step` say) and Mixtral
(`mixtral`: every layer routes, top-k always renormalised). Both are dropless (every token reaches its k experts),
have no shared experts, and route in float32 here. What megatron cannot express as HF computes it is refused by
config key. Load balancing is off (RL post-training keeps the router the pretrained model learned); megatron's
auxiliary loss can be turned on with `aux_loss_coeff`, which is megatron's per-layer formula
(coeff * E / (k * T^2) * sum_e P_e * count_e), not HF's `router_aux_loss_coef` (all layers pooled, no 1/k).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Tuple

from verl.decoder_dims import routed_layers


@dataclass(frozen=True)
class MoeFamily:
    experts_key: str  # HF config key: number of routed experts
    ffn_key: str  # HF config key: one expert's intermediate size
    block: str  # the MoE block's module name inside a layer, in checkpoint names
    projections: Tuple[str, str, str]  # gate, up, down of `{block}.experts.{e}` in checkpoint names
    renormalise: Callable[[Any], bool]  # top-k probabilities rescaled to sum to 1
    moe_layers: Callable[[Any], List[bool]]  # per layer: routed experts (True) or a dense MLP


FAMILIES: Dict[str, MoeFamily] = {
    "qwen3_moe": MoeFamily(
        "num_experts",
        "moe_intermediate_size",
        "mlp",
        ("gate_proj", "up_proj", "down_proj"),
        renormalise=lambda c: bool(getattr(c, "norm_topk_prob", False)),
        moe_layers=routed_layers,  # (mlp_only_layers, decoder_sparse_step)
    ),
    "mixtral": MoeFamily(
        "num_local_experts",
        "intermediate_size",
        "block_sparse_moe",
        ("w1", "w3", "w2"),
        renormalise=lambda c: True,
        moe_layers=routed_layers,  # (every layer)
    ),
}


def family(hf_config: Any) -> MoeFamily:
    model_type = getattr(hf_config, "model_type", None)
    if model_type not in FAMILIES:
        raise ValueError(f"model_type '{model_type}' is not a mixture-of-experts family here ({', '.join(FAMILIES)})")
    return FAMILIES[model_type]


def is_moe(hf_config: Any) -> bool:
    return getattr(hf_config, "model_type", None) in FAMILIES


def num_experts(hf_config: Any) -> int:
    return int(getattr(hf_config, family(hf_config).experts_key))


def moe_layers(hf_config: Any) -> List[bool]:
    return family(hf_config).moe_layers(hf_config)


def moe_problems(hf_config: Any) -> List[str]:
    """What megatron's dropless MoE layer would compute differently from HF's, each naming its config key."""
    fam = family(hf_config)
    problems = []
    if num_experts(hf_config) < 1:
        problems.append(f"{fam.experts_key}={num_experts(hf_config)} (a mixture of experts needs >= 1)")
    k = getattr(hf_config, "num_experts_per_tok", 1)
    if k > num_experts(hf_config):
        problems.append(f"num_experts_per_tok={k} > {fam.experts_key}={num_experts(hf_config)}")
    if k == 1 and fam.renormalise(hf_config):
        problems.append("num_experts_per_tok=1 with a renormalised top-k (megatron routes top-1 by softmax first)")
    if getattr(hf_config, "router_jitter_noise", 0.0):
        problems.append(f"router_jitter_noise={hf_config.router_jitter_noise} (router noise; set it to 0)")
    if getattr(hf_config, "sliding_window", None) is not None and hf_config.model_type == "mixtral":
        problems.append(f"sliding_window={hf_config.sliding_window} (sliding-window attention; null for full)")
    for key in ("shared_expert_intermediate_size", "n_shared_experts", "moe_shared_expert_intermediate_size"):
        if getattr(hf_config, key, None):
            problems.append(f"{key}={getattr(hf_config, key)} (shared experts are not converted)")
    for key in ("capacity_factor", "expert_capacity", "moe_expert_capacity_factor"):
        if getattr(hf_config, key, None):
            problems.append(f"{key}={getattr(hf_config, key)} (token dropping; only dropless routing converts)")
    return problems


def moe_config_kwargs(hf_config: Any, aux_loss_coeff: float = 0.0) -> Dict[str, Any]:
    """The MoE fields of megatron's TransformerConfig (dispatcher and kernels are the engine's choice)."""
    fam = family(hf_config)
    return dict(
        num_moe_experts=num_experts(hf_config),
        moe_ffn_hidden_size=int(getattr(hf_config, fam.ffn_key)),
        moe_router_topk=int(hf_config.num_experts_per_tok),
        # Softmax over the top-k logits equals the renormalised top-k of the full softmax.
        moe_router_pre_softmax=not fam.renormalise(hf_config),
        moe_router_score_function="softmax",
        moe_router_dtype="fp32",
        moe_router_load_balancing_type="aux_loss" if aux_loss_coeff > 0 else "none",
        moe_aux_loss_coeff=float(aux_loss_coeff),
        moe_layer_freq=[int(m) for m in moe_layers(hf_config)],
        moe_token_dispatcher_type="alltoall",
        moe_permute_fusion=False,
        moe_enable_routing_replay=True,  # (routing_replay.py; routers compute their own top-k unless told)
    )


def expert_hf_names(hf_config: Any, layer: int, expert: int) -> Tuple[str, str, str]:
    """Checkpoint names of one expert's gate, up and down projections (as save_pretrained writes them)."""
    fam = family(hf_config)
    base = f"model.layers.{layer}.{fam.block}.experts.{expert}"
    return tuple(f"{base}.{p}.weight" for p in fam.projections)  # type: ignore[return-value]


def expert_shapes(hf_config: Any) -> Dict[str, Any]:
    """Checkpoint shape of every expert tensor of the model (gate/up [ffn, hidden], down [hidden, ffn])."""
    import torch

    fam = family(hf_config)
    ffn, hidden = int(getattr(hf_config, fam.ffn_key)), int(hf_config.hidden_size)
    out = {}
    for layer, routed in enumerate(moe_layers(hf_config)):
        for e in range(num_experts(hf_config) if routed else 0):
            gate, up, down = expert_hf_names(hf_config, layer, e)
            out.update(
                {gate: torch.Size([ffn, hidden]), up: torch.Size([ffn, hidden]), down: torch.Size([hidden, ffn])}
            )
    return out


def router_hf_name(hf_config: Any, layer: int) -> str:
    return f"model.layers.{layer}.{family(hf_config).block}.gate.weight"


def define_missing_te_names() -> None:
    """megatron-core 0.16's router reads the name `te_general_gemm`, which it defines only when TransformerEngine
    imports; without TE (any CPU, a GPU build without it) the name is missing, so define it as absent."""
    from megatron.core.transformer.moe import moe_utils

    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None
