"""What a vision-language model trains with, checked at its keys: which actor, rollout, mode and parallelism take
image rows, and the keys that only mean something for one (actor.freeze_vision_tower)."""

from __future__ import annotations

from typing import Any, List, Optional

from verl.config.checks import Context, error_at
from verl.config.errors import ConfigProblem
from verl.config.placement import value


def model_vision_type(cfg: Any) -> Optional[str]:
    """The model type of the configured model when it is a vision-language model (None: a text model, or not known
    here)."""
    from verl.utils.hf_files import folder_vision_model

    path = value(cfg, "model.path")
    if not isinstance(path, str):
        return None
    if path.startswith("embedded:"):
        from verl.embedded.specs import EMBEDDED_MODELS

        spec = EMBEDDED_MODELS.get(path[len("embedded:") :])
        return spec.model_type if spec is not None and spec.vision else None
    from verl.model_source import local_model_folder

    folder = local_model_folder(path)
    return None if folder is None else folder_vision_model(folder)


def model_known(cfg: Any) -> bool:
    """Whether the configured model's config can be read here (an embedded model, or a local folder)."""
    path = value(cfg, "model.path")
    if not isinstance(path, str):
        return False
    if path.startswith("embedded:"):
        from verl.embedded.specs import EMBEDDED_MODELS

        return path[len("embedded:") :] in EMBEDDED_MODELS
    from verl.model_source import local_model_folder

    return local_model_folder(path) is not None


def check_vision_model(ctx: Context) -> List[ConfigProblem]:
    """What a vision-language model trains with: the fsdp actor (data parallel) and the hf rollout (or vllm on a
    GPU, sync or one step off), one completion per sample, no critic or LoRA; each other choice refused at its
    key."""
    kind = model_vision_type(ctx.cfg)
    if kind is None:
        if value(ctx.cfg, "actor.freeze_vision_tower") and model_known(ctx.cfg):
            key = "actor.freeze_vision_tower"
            why = f"is true, and {value(ctx.cfg, 'model.path')} is a text model: it has no vision tower"
            return [error_at(key, why, f"set {key}=false")]
        return []
    cfg, vlm = ctx.cfg, f"a vision-language model ({kind})"
    on_gpu = value(cfg, "placement.device") == "cuda"
    rollout_ok = ("hf", "vllm") if on_gpu else ("hf",)
    problems = []
    if value(cfg, "rollout.backend") not in rollout_ok:
        key, got = "rollout.backend", value(cfg, "rollout.backend")
        why = (
            "the sglang rollout takes no images here"
            if on_gpu
            else "vLLM's vision-language models need torchvision, which its CPU build here lacks (vllm takes images "
            "on a GPU)"
        )
        fix = f"set {key}=hf" + (" or vllm" if on_gpu else "")
        problems.append(error_at(key, f"is {got!r}, and {vlm} generates with {' or '.join(rollout_ok)}: {why}", fix))
    if value(cfg, "trainer.mode") == "async" and value(cfg, "rollout.backend") == "vllm":
        why = (
            f"is 'async', and {vlm} generates with vllm: the rollout service steps vLLM's scheduler with token "
            "prompts only (the hf rollout's service takes images)"
        )
        problems.append(error_at("trainer.mode", why, "set trainer.mode=one_step_off, or rollout.backend=hf"))
    limits = [  # (key, what it must be, why not otherwise)
        ("actor.backend", "fsdp", "megatron-core's multimodal model is not wired to the megatron engine"),
        ("actor.parallel.tp", 1, "tensor parallel plans cover text decoders only"),
        ("actor.parallel.cp", 1, "sequence parallelism splits 1-D positions, and image rows have 3-D ones"),
        ("rollout.agent.loop", None, "agent loops send token requests without pixels"),
        ("actor.lora.rank", 0, "LoRA targets are chosen for text decoders"),
    ]
    for key, wanted, why in limits:
        got = value(cfg, key)
        if got != wanted and not (wanted == 1 and got is None):
            problems.append(
                error_at(key, f"is {got!r}, and {vlm} trains with {key}={wanted}: {why}", f"set {key}={wanted}")
            )
    if "critic" in ctx.draft.roles:
        why = f"is on, and {vlm} has no value model (values need a critic that reads images)"
        problems.append(
            error_at("critic.enable", why, "set critic.enable=false with an estimator without values (grpo)")
        )
    return problems
