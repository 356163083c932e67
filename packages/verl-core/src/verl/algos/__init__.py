"""RL algorithms as pure functions on tensors and masks, in registries a recipe selects by name.

Extension points (each a `Registry`; add an entry with `@REGISTRY.register(name)` in a module listed in
`trainer.plugins`, or point a recipe at a function with `{_target_: pkg.module.fn, **kwargs}`):

    ADV_ESTIMATORS   algorithm.adv_estimator    gae, grpo, drgrpo, rloo, reinforce_plus_plus, ..., remax, opo
    POLICY_LOSSES    actor.policy_loss          vanilla (= dual_clip), gspo, cispo
    KL_ESTIMATORS    algorithm.kl_penalty, actor.kl_loss_type   k1|kl, abs, mse|k2, low_var_kl|k3, full
    AGG_MODES        actor/critic.loss_agg_mode token-mean, seq-mean-token-mean, seq-mean-token-sum, -sum-norm
    KL_CONTROLLERS   algorithm.kl_ctrl.type     fixed, adaptive
    DPO_LOSSES       (dpo_loss kind)            sigmoid|dpo, ipo

No distributed code lives here: the trainer calls these on the driver or inside a worker's micro-batch.
See docs/algorithms.md for the formulas and papers.
"""

from verl.algos.advantages import ADV_ESTIMATORS, compute_advantages, estimator_needs_values, estimator_requires
from verl.algos.aggregation import AGG_MODES, agg_loss
from verl.algos.dapo import filter_groups, overlong_penalty
from verl.algos.dpo import DPO_LOSSES, dpo_loss
from verl.algos.kl import (
    KL_CONTROLLERS,
    KL_ESTIMATORS,
    AdaptiveKLController,
    FixedKLController,
    apply_kl_penalty,
    kl_loss,
    kl_penalty,
    make_kl_controller,
)
from verl.algos.metrics import compute_policy_metrics, data_metrics, ratio_stats, rollout_mismatch_metrics, token_stats
from verl.algos.plugins import load_plugins
from verl.algos.policy_losses import POLICY_LOSSES, clip_range, compute_policy_loss, entropy_loss, truncated_is_weights
from verl.algos.utils import masked_mean, masked_sum, masked_var, masked_whiten
from verl.algos.value_loss import compute_value_loss
from verl.registry import Registry, UnknownNameError

__all__ = [
    "ADV_ESTIMATORS",
    "AGG_MODES",
    "DPO_LOSSES",
    "KL_CONTROLLERS",
    "KL_ESTIMATORS",
    "POLICY_LOSSES",
    "AdaptiveKLController",
    "FixedKLController",
    "Registry",
    "UnknownNameError",
    "agg_loss",
    "apply_kl_penalty",
    "clip_range",
    "compute_advantages",
    "compute_policy_loss",
    "compute_policy_metrics",
    "compute_value_loss",
    "data_metrics",
    "dpo_loss",
    "entropy_loss",
    "estimator_needs_values",
    "estimator_requires",
    "filter_groups",
    "kl_loss",
    "kl_penalty",
    "load_plugins",
    "make_kl_controller",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "overlong_penalty",
    "ratio_stats",
    "rollout_mismatch_metrics",
    "token_stats",
    "truncated_is_weights",
]
