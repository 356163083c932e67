"""LoRA on a Hugging Face model with peft: adapters on, the base frozen, and the weights in Hugging Face names.

`apply_lora` wraps the model (before FSDP shards it); `merged_weights` yields base + scale * B @ A under the
base model's own parameter names (what a rollout with its own copy loads); `adapter_state` gives the adapters
alone as a peft folder holds them (what a rollout that loads adapters takes).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Iterator, Tuple, cast

import torch

ADAPTER = "default"  # peft's name for the one adapter a run trains
VALUE_HEADS = ("score", "classifier")  # a token-classification model's head (peft's TOKEN_CLS modules_to_save)


def apply_lora(model: torch.nn.Module, lora: Any, kind: str) -> torch.nn.Module:
    """`model` with LoRA adapters (verl.config.schema.LoraConfig) on its linear layers; only they (and a value
    model's head, trained in full) require gradients."""
    try:
        from peft import LoraConfig, TaskType, get_peft_model  # pants: no-infer-dep (the `lora` extra)
    except ImportError as e:
        raise ImportError("LoRA (actor.lora / critic.lora) needs peft: pip install 'verl-fsdp[lora]'") from e

    targets = lora.target_modules
    config = LoraConfig(
        r=int(lora.rank),
        lora_alpha=float(lora.alpha),
        lora_dropout=float(lora.dropout),
        target_modules=targets if isinstance(targets, str) else list(targets),
        init_lora_weights=True if lora.init == "default" else lora.init,
        # a value model's head is new: it trains in full (peft keeps a trainable copy of it), without adapters
        task_type=TaskType.TOKEN_CLS if kind == "value" else TaskType.CAUSAL_LM,
        exclude_modules=list(VALUE_HEADS) if kind == "value" else None,
    )
    return get_peft_model(model, config)


def is_lora(model: torch.nn.Module) -> bool:
    return hasattr(model, "peft_config")


def _hf_name(name: str) -> str:
    """A peft parameter's name in the base model: no `base_model.model.` prefix, no `.base_layer`."""
    name = name.removeprefix("base_model.model.")
    return name.replace(".base_layer.", ".").replace(f".modules_to_save.{ADAPTER}.", ".")


def merged_weights(
    model: torch.nn.Module, full: Callable[[torch.Tensor], torch.Tensor]
) -> Iterator[Tuple[str, torch.Tensor]]:
    """The base model's parameters with the adapters merged in (W + alpha/r * B @ A), one tensor at a time, in
    the base model's names; `full` assembles a sharded tensor (FSDP's DTensor)."""
    from peft.tuners.lora import LoraLayer  # pants: no-infer-dep

    for module_name, module in model.named_modules():
        if isinstance(module, LoraLayer):
            base = module.get_base_layer()
            weight = full(base.weight.detach())
            a = full(module.lora_A[ADAPTER].weight.detach())
            b = full(module.lora_B[ADAPTER].weight.detach())
            delta = (b.float() @ a.float()) * module.scaling[ADAPTER]
            if getattr(module, "fan_in_fan_out", False):
                delta = delta.T
            yield _hf_name(f"{module_name}.weight"), (weight.float() + delta).to(weight.dtype)
            if getattr(base, "bias", None) is not None:
                yield _hf_name(f"{module_name}.bias"), full(base.bias.detach())
    for name, param in model.named_parameters():
        if _is_adapter(name) or ".base_layer." in name or ".original_module." in name:
            continue  # adapters are merged above; a head's frozen original is replaced by its trained copy
        yield _hf_name(name), full(param.detach())


def adapter_state(
    model: torch.nn.Module, full: Callable[[torch.Tensor], torch.Tensor]
) -> Tuple[Dict[str, Any], Iterator[Tuple[str, torch.Tensor]]]:
    """The adapters as a peft folder holds them: its adapter_config.json as a dict, and the tensors one at a time
    under peft's saved names (`base_model.model.<module>.lora_A.weight`); what an adapter-loading rollout takes."""
    from peft import get_peft_model_state_dict  # pants: no-infer-dep

    config = cast(Any, model).peft_config[ADAPTER].to_dict()
    config = {k: sorted(v) if isinstance(v, set) else v for k, v in config.items()}  # JSON has no sets
    state = get_peft_model_state_dict(model, adapter_name=ADAPTER)
    return config, ((name, full(t.detach())) for name, t in state.items())


def _is_adapter(name: str) -> bool:
    return ".lora_" in name
