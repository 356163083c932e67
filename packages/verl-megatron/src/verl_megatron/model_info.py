"""What a megatron role's model is, for `verl validate` / `verl train --dry-run`: built, not estimated.

Each pipeline stage's model chunks are built by megatron-core itself on the meta device (no memory, no
weights) for tensor-parallel rank 0 of that stage, inside a fake process group of the layout's size, so a
16-GPU layout is checked on a laptop: the config converts, the layer spec builds, heads and vocabulary split
over TP, layers over PP x VPP. The whole model's count comes from the HF model on the meta device.
"""

from __future__ import annotations

import os
import types
import warnings
from typing import Any, Dict, List


def _parallel(parallel: Dict[str, Any]) -> types.SimpleNamespace:
    sizes = {"tp": 1, "pp": 1, "vpp": None, "cp": 1, "ep": 1, "dp": None}
    sizes.update({k: v for k, v in parallel.items() if v is not None})
    return types.SimpleNamespace(**sizes)


def count_parameters(hf_config: Any, parallel: Dict[str, Any], *, kind: str = "causal_lm") -> Dict[str, Any]:
    """{"total": HF parameter count, "per_stage": [parameters on tp rank 0 of each pipeline stage]}."""
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state as mpu
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from verl_megatron import cpu_compat
    from verl_megatron.model import build_chunks, transformer_config
    from verl_megatron.parallel import current_layout
    from verl_megatron.weights import hf_shapes

    if dist.is_initialized():
        raise RuntimeError("count_parameters builds in a fake process group; call it outside a distributed job")
    p = _parallel(parallel)
    cpu_compat.apply()
    world = p.tp * p.pp * p.cp
    per_stage: List[int] = []
    for stage in range(p.pp):
        # Megatron's rank order is tp, cp, (ep,) dp, pp: stage s starts at rank s * tp * cp.
        dist.init_process_group("fake", rank=stage * p.tp * p.cp, world_size=world, store=FakeStore())
        try:
            mpu.initialize_model_parallel(
                tensor_model_parallel_size=p.tp,
                pipeline_model_parallel_size=p.pp,
                virtual_pipeline_model_parallel_size=p.vpp if p.vpp and p.vpp > 1 else None,
                context_parallel_size=p.cp,
                create_gloo_process_groups=False,
            )
            layout = current_layout()
            config = transformer_config(
                hf_config, layout, dtype=torch.bfloat16, device="cpu", overrides={"perform_initialization": False}
            )
            with torch.device("meta"):
                chunks = build_chunks(hf_config, config, layout, kind=kind)
            per_stage.append(sum(t.numel() for c in chunks for t in c.parameters()))
        finally:
            mpu.destroy_model_parallel()
            dist.destroy_process_group()
    total = sum(shape.numel() for shape in hf_shapes(hf_config, kind).values())
    return {"total": total, "per_stage": per_stage}


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
    stages = ", ".join(f"stage {i}: {n:,}" for i, n in enumerate(counts["per_stage"]))
    return [
        f"{hf.model_type}: {hf.num_hidden_layers} layers, hidden {hf.hidden_size}, {hf.num_attention_heads} heads / "
        f"{hf.num_key_value_heads} kv heads, vocab {hf.vocab_size}, "
        f"{'tied' if getattr(hf, 'tie_word_embeddings', False) else 'untied'} embeddings",
        f"parameters: {counts['total']:,} ({counts['total'] / 1e9:.2f} B)",
        f"megatron-core model built on the meta device, {layout}; parameters per rank: {stages}",
    ]
