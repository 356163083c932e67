"""Build a role's engines from the run config (the only place a role section becomes an EngineConfig)."""

from __future__ import annotations

from typing import Any, Dict, Optional

from verl.engine import EngineConfig, load_engine


def train_engine(cfg: Any, role: str, *, model_path: str, total_steps: int, optimize: bool) -> Any:
    """The TrainEngine of `role` (actor, ref or critic) on this worker."""
    section = cfg[role]
    backend = section.backend or cfg.actor.backend  # ref.backend None: the actor's
    engine_cfg = EngineConfig(
        model_path=model_path,
        kind="value" if role == "critic" else "causal_lm",
        optim=section.optim if optimize else None,
        total_steps=total_steps,
        device=cfg.placement.device,
        dtype=cfg.model.dtype,
        gradient_checkpointing=cfg.model.gradient_checkpointing,
        param_offload=bool(section.get("param_offload", False)),
        optimizer_offload=bool(section.get("optimizer_offload", False)),
        use_fused_kernels=bool(section.get("use_fused_kernels", False)) if role != "critic" else False,
        fused_kernel_impl=section.get("fused_kernel_impl", "torch") if role != "critic" else "torch",
        seed=cfg.trainer.seed,
        parallel=section.parallel or cfg.actor.parallel,
        override_config=dict(cfg.model.override_config),
    )
    return load_engine(backend, "train")(engine_cfg)


def rollout_settings(cfg: Any, tokenizer: Any) -> Dict[str, Any]:
    """What every rollout engine is built from, besides its config section (`cfg.rollout`)."""
    eos = tokenizer.eos_token_id
    return dict(
        max_new_tokens=cfg.rollout.max_new_tokens or cfg.data.max_response_length,
        max_prompt_length=cfg.data.max_prompt_length,
        eos_token_id=eos,
        pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos,
        device=cfg.placement.device,
        dtype=cfg.model.dtype,
        seed=cfg.trainer.seed,
    )


def rollout_engine(cfg: Any, *, model_path: str, tokenizer: Any, actor: Optional[Any]) -> Any:
    """The RolloutEngine of `rollout.backend`, beside the colocated actor engine (which an engine may share)."""
    cls = load_engine(cfg.rollout.backend, "rollout")
    return cls.build(cfg.rollout, model_path=model_path, actor=actor, **rollout_settings(cfg, tokenizer))
