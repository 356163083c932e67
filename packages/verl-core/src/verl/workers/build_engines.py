"""Build a role's engines from the run config and its plan (the only place a role becomes an EngineConfig)."""

from __future__ import annotations

from typing import Any, Optional

from verl.config.placement import to_dict
from verl.config.plan import Plan, RolePlan
from verl.config.schema import LoraConfig, VerlConfig
from verl.engine_protocol import EngineConfig, RolloutSettings, load_engine


def train_engine(cfg: VerlConfig, role: RolePlan, *, model_path: str, total_steps: int, optimize: bool) -> Any:
    """The TrainEngine of `role` (actor, ref or critic) on this worker: its backend and layout from the plan."""
    section: Any = getattr(cfg, role.name)  # (the actor's, ref's or critic's section)
    engine_cfg = EngineConfig(
        model_path=model_path,
        tokenizer_path=cfg.model.tokenizer_path,  # exports carry the run's tokenizer
        kind="value" if role.name == "critic" else "causal_lm",
        optim=section.optim if optimize else None,
        total_steps=total_steps,
        device=cfg.placement.device,
        dtype=cfg.model.dtype,
        gradient_checkpointing=cfg.model.gradient_checkpointing,
        param_offload=bool(section.get("param_offload", False)),
        optimizer_offload=bool(section.get("optimizer_offload", False)),
        use_fused_kernels=role.name == "actor" and bool(cfg.actor.use_fused_kernels),
        fused_kernel_impl=cfg.actor.fused_kernel_impl if role.name == "actor" else "torch",
        shared_prefix=bool(cfg.model.shared_prefix),
        attn_implementation=cfg.model.attn_implementation,
        lora=role_lora(section) if optimize else None,
        seed=cfg.trainer.seed,
        parallel=role.layout,
        moe_aux_loss_coeff=float(section.get("moe_aux_loss_coeff", 0.0)) if optimize else 0.0,
        freeze_vision_tower=bool(section.get("freeze_vision_tower", False)),
        override_config=to_dict(cfg.model.override_config),
    )
    return load_engine(role.backend, "train")(engine_cfg)


def role_lora(section: Any) -> Optional[LoraConfig]:
    """The role's LoRA settings when it trains adapters (rank >= 1), else None."""
    lora = section.get("lora")
    if lora is None or lora.rank < 1:
        return None
    return LoraConfig(**to_dict(lora))


def rollout_settings(cfg: VerlConfig, plan: Plan, tokenizer: Any) -> RolloutSettings:
    """What every rollout engine is built from, besides its config section (`cfg.rollout`)."""
    return RolloutSettings.for_tokenizer(
        tokenizer,
        max_new_tokens=plan.response_length,
        max_prompt_length=plan.prompt_length,
        device=cfg.placement.device,
        dtype=cfg.model.dtype,
        seed=cfg.trainer.seed,
        # the rank of the adapters it will be sent (rollout.lora_sync: adapter), 0 when it takes full weights
        lora_rank=int(cfg.actor.lora.rank) if plan.lora_sync == "adapter" else 0,
        routes=plan.routing_replay == "r3",  # (the rollout records the routes every actor pass replays)
    )


def rollout_engine(cfg: VerlConfig, plan: Plan, *, model_path: str, tokenizer: Any, actor: Optional[Any]) -> Any:
    """The RolloutEngine of the rollout role, beside the colocated actor engine (which an engine may share)."""
    cls = load_engine(plan.role("rollout").backend, "rollout")
    return cls.build(cfg.rollout, model_path=model_path, actor=actor, settings=rollout_settings(cfg, plan, tokenizer))
