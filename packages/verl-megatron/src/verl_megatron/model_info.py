"""What a megatron role's model is, for `verl validate` / `verl train --dry-run`: built, not estimated.

Each pipeline stage's model chunks are built by megatron-core itself on the meta device (no memory, no
weights) for tensor-parallel rank 0 of that stage, inside a fake process group of the layout's size, so a
16-GPU layout is checked on a laptop: the config converts, the layer spec builds, heads and vocabulary split
over TP, layers over PP x VPP, a mixture of experts' experts over EP x ETP. The whole model's count comes from
the HF model on the meta device; a mixture of experts also counts the parameters one token passes through.
"""

from __future__ import annotations

import os
import types
import warnings
from typing import Any, Dict, Iterator, List

from verl_megatron import moe


def _parallel(parallel: Dict[str, Any]) -> types.SimpleNamespace:
    sizes = {"tp": 1, "pp": 1, "vpp": None, "cp": 1, "ep": 1, "etp": None, "dp": None}
    sizes.update({k: v for k, v in parallel.items() if v is not None})
    return types.SimpleNamespace(**sizes)


def built_stages(
    hf_config: Any, parallel: Dict[str, Any], *, kind: str = "causal_lm", dtype: Any = None
) -> Iterator[List[Any]]:
    """Each pipeline stage's model chunks as megatron-core builds them on tensor-parallel rank 0 (expert rank 0)
    of that stage, on the meta device, inside a fake process group of the layout's size; yielded while that group
    stands (read them before the next)."""
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state as mpu
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from verl_megatron import cpu_compat
    from verl_megatron.model import build_chunks, transformer_config
    from verl_megatron.parallel import current_layout

    if dist.is_initialized():
        raise RuntimeError("megatron's model is built here in a fake process group; call it outside a distributed job")
    p = _parallel(parallel)
    etp = p.etp or p.tp
    cpu_compat.apply()
    if moe.is_moe(hf_config):
        moe.define_missing_te_names()
    # Expert groups (etp * ep ranks) tile a stage's tp * cp * dp ranks, so with experts split the fake world holds
    # the data-parallel ranks too; otherwise one replica is enough.
    dp = (p.dp or 1) if (p.ep > 1 or etp != p.tp) else 1
    world = p.tp * p.pp * p.cp * dp
    for stage in range(p.pp):
        # Megatron's rank order is tp, cp, (ep,) dp, pp: stage s starts at rank s * tp * cp * dp (expert rank 0;
        # every expert rank holds as many experts).
        dist.init_process_group("fake", rank=stage * p.tp * p.cp * dp, world_size=world, store=FakeStore())
        try:
            mpu.initialize_model_parallel(
                tensor_model_parallel_size=p.tp,
                pipeline_model_parallel_size=p.pp,
                virtual_pipeline_model_parallel_size=p.vpp if p.vpp and p.vpp > 1 else None,
                context_parallel_size=p.cp,
                expert_model_parallel_size=p.ep,
                expert_tensor_parallel_size=etp,
                create_gloo_process_groups=False,
            )
            config = transformer_config(
                hf_config,
                current_layout(),
                dtype=dtype or torch.bfloat16,
                device="cpu",
                overrides={"perform_initialization": False},
            )
            with torch.device("meta"):
                yield build_chunks(hf_config, config, current_layout(), kind=kind)
        finally:
            mpu.destroy_model_parallel()
            dist.destroy_process_group()


def count_parameters(hf_config: Any, parallel: Dict[str, Any], *, kind: str = "causal_lm") -> Dict[str, Any]:
    """{"total": HF parameter count, "active": parameters a token passes through (a mixture of experts: its top-k
    experts of each routed layer; a dense model: all), "per_stage": [parameters on tp rank 0 of each pipeline
    stage], "experts_per_stage": [the expert parameters among them]}."""
    from verl_megatron.weights import hf_shapes

    per_stage: List[int] = []
    experts_per_stage: List[int] = []
    for chunks in built_stages(hf_config, parallel, kind=kind):
        named = [(n, t) for c in chunks for n, t in c.named_parameters()]
        per_stage.append(sum(t.numel() for _, t in named))
        experts_per_stage.append(sum(t.numel() for n, t in named if ".experts." in n))
    total = sum(shape.numel() for shape in hf_shapes(hf_config, kind).values())
    active = total
    if moe.is_moe(hf_config):
        experts = sum(shape.numel() for shape in moe.expert_shapes(hf_config).values())
        e, k = moe.num_experts(hf_config), int(hf_config.num_experts_per_tok)
        active = total - experts * (e - k) // e
    return {"total": total, "active": active, "per_stage": per_stage, "experts_per_stage": experts_per_stage}


def describe(model_path: str, parallel: Dict[str, Any], *, kind: str = "causal_lm") -> List[str]:
    """Lines for the plan: architecture, parameter count, parameters per rank of each pipeline stage."""
    from transformers import AutoConfig

    if not os.path.exists(os.path.join(model_path, "config.json")):
        return [f"no config.json at {model_path}: the model is not checked here (it is on the training machine)"]
    hf = AutoConfig.from_pretrained(model_path)
    with warnings.catch_warnings():  # megatron announces its apex/TransformerEngine fallbacks: not news here
        warnings.filterwarnings("ignore", category=UserWarning, module=r"megatron\.")
        warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"megatron\.")
        counts = count_parameters(hf, parallel, kind=kind)
    p = _parallel(parallel)
    layout = f"TP={p.tp} PP={p.pp}" + (f" VPP={p.vpp}" if p.vpp else "")
    lines = [
        f"{hf.model_type}: {hf.num_hidden_layers} layers, hidden {hf.hidden_size}, {hf.num_attention_heads} heads / "
        f"{hf.num_key_value_heads} kv heads, vocab {hf.vocab_size}, "
        f"{'tied' if getattr(hf, 'tie_word_embeddings', False) else 'untied'} embeddings",
        f"parameters: {counts['total']:,} ({counts['total'] / 1e9:.2f} B)",
    ]
    if moe.is_moe(hf):
        e, routed = moe.num_experts(hf), sum(moe.moe_layers(hf))
        etp = p.etp or p.tp
        layout += f" EP={p.ep} ETP={etp}"
        lines.append(
            f"mixture of experts: {routed} of {hf.num_hidden_layers} layers route to {e} experts, top "
            f"{hf.num_experts_per_tok}; active per token: {counts['active']:,} ({counts['active'] / 1e9:.2f} B); "
            f"EP={p.ep} x ETP={etp}: {e // p.ep} experts of each routed layer per rank"
            + (f", each split over {etp} ranks" if etp > 1 else "")
        )
        stages = ", ".join(
            f"stage {i}: {n:,} ({n - x:,} dense + {x:,} experts)"
            for i, (n, x) in enumerate(zip(counts["per_stage"], counts["experts_per_stage"]))
        )
    else:
        stages = ", ".join(f"stage {i}: {n:,}" for i, n in enumerate(counts["per_stage"]))
    lines.append(f"megatron-core model built on the meta device, {layout}; parameters per rank: {stages}")
    return lines
