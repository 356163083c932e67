"""`verl export --backend fsdp`: the engine rebuilt around its checkpoint, then its own `export_hf`.

A checkpoint written by `FSDPEngine.save_checkpoint` (at any world size) carries `verl_fsdp.json`: the base model
folder, the kind and the LoRA settings. A LoRA checkpoint holds only the adapters (and a value head), so the base
model must still be there; a full checkpoint's weights replace the base's on load. The export writes the merged
Hugging Face folder and, for LoRA, the peft adapter folder in `<out>/lora_adapter`.
"""

from __future__ import annotations

import os
from typing import Dict, Optional

from verl.config.schema import LoraConfig
from verl.engine_protocol import EngineConfig
from verl.engine_skeleton import meta_file, read_meta
from verl.utils.world_of_one import world_of_one


def export_checkpoint(checkpoint: str, out: str, *, model_path: Optional[str] = None) -> Dict[str, str]:
    """An HF folder at `out` from the FSDP checkpoint at `checkpoint`, in this process (host memory for the model in
    float32); `model_path` replaces the base model folder the checkpoint names (e.g. after a move).
    Returns {tensor name: file} of the written weights."""
    from verl_fsdp.engine import FSDPEngine

    meta = read_meta(checkpoint, "fsdp")
    base = model_path or meta["model_path"]
    if not os.path.isfile(os.path.join(base, "config.json")):
        what = "the adapters' base model" if meta.get("lora") else "the model the run started from"
        where = f"--model {base}" if model_path else f"{base} (the model named in {meta_file(checkpoint, 'fsdp')})"
        raise FileNotFoundError(f"{where} holds no config.json: the export needs {what}; pass its folder with --model")
    cfg = EngineConfig(
        model_path=base,
        tokenizer_path=meta.get("tokenizer_path") if model_path is None else None,
        kind=meta["kind"],
        device="cpu",
        dtype="float32",
        lora=LoraConfig(**meta["lora"]) if meta.get("lora") else None,
        override_config=meta.get("override_config") or {},
    )
    with world_of_one():
        engine = FSDPEngine(cfg)
        engine.load_checkpoint(checkpoint)
        engine.export_hf(out)
    from safetensors import safe_open  # pants: no-infer-dep (transformers' own dependency)

    weight_map: Dict[str, str] = {}
    for name in sorted(os.listdir(out)):
        if name.endswith(".safetensors"):
            with safe_open(os.path.join(out, name), "pt") as shard:
                weight_map.update({key: name for key in shard.keys()})
    return weight_map
