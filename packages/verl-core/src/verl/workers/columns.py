"""The batch columns each worker call reads: the trainer ships only these (the rest stays in the driver)."""

from __future__ import annotations

from typing import Any, Tuple

from verl.config.schema import VerlConfig
from verl.engine_protocol import ROUTED_EXPERTS

# What every engine forward reads (see verl.engine_protocol for the layout).
MODEL_INPUTS = ("input_ids", "attention_mask", "position_ids", "responses")
PROMPTS = ("input_ids", "attention_mask", "position_ids")
# Non-tensor columns that are model inputs too, shipped with the tensors when a batch has them: a vision-language
# model's images, per row (verl.data.vision).
MODEL_NON_TENSORS = ("multi_modal_inputs",)


def model_non_tensors(batch: Any) -> Tuple[str, ...]:
    """The MODEL_NON_TENSORS columns `batch` (a DataProto) has."""
    return tuple(k for k in MODEL_NON_TENSORS if k in batch.non_tensor_batch)


def replayed_routes(cfg: VerlConfig) -> Tuple[str, ...]:
    """The routes column under routing replay (actor.routing_replay: r2 or r3), else nothing."""
    return (ROUTED_EXPERTS,) if cfg.actor.routing_replay in ("r2", "r3") else ()


def log_prob_inputs(cfg: VerlConfig) -> Tuple[str, ...]:
    """What the log-prob passes read: the model inputs, and under r3 the experts the rollout took (replayed)."""
    return MODEL_INPUTS + (replayed_routes(cfg) if cfg.actor.routing_replay == "r3" else ())


def actor_update_columns(cfg: VerlConfig, old_log_probs: bool = True) -> Tuple[str, ...]:
    """What the actor's loss reads: the policy-gradient inputs with the rollout's log-probs (every policy loss
    receives them: truncated importance sampling, or a plugin's own correction), plus the reference's
    log-probs for a KL loss, and the old pass's experts under routing replay. Without `old_log_probs` the update
    takes them from its own forward."""
    old = ("old_log_probs",) if old_log_probs else ()
    extra: Tuple[str, ...] = ("ref_log_probs",) if cfg.actor.use_kl_loss else ()
    extra += replayed_routes(cfg)  # (the experts the update replays)
    return MODEL_INPUTS + ("response_mask", *old, "advantages", "rollout_log_probs") + extra


CRITIC_UPDATE = MODEL_INPUTS + ("response_mask", "values", "returns")
