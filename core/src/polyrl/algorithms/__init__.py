"""The math of RL post-training, as plain torch functions: masked statistics, loss aggregation,
the PPO policy loss, KL estimators and controllers, and the actor's micro-batch loss.

Importing this package imports torch; the entry-point modules of plugins refer to these names by
import string so that listing plugins stays light.
"""

from polyrl.algorithms.actor_loss import LOSS_NORM_KEY, make_actor_loss_fn
from polyrl.algorithms.functional import masked_mean, masked_sum, masked_var, masked_whiten
from polyrl.algorithms.kl import (
    KL_PENALTY_TYPES,
    AdaptiveKLController,
    FixedKLController,
    apply_kl_in_reward,
    kl_penalty,
    make_kl_controller,
)
from polyrl.algorithms.loss_agg import (
    LOSS_AGG_MODES,
    agg_loss,
    check_loss_agg_mode,
    loss_norm_totals,
)
from polyrl.algorithms.policy_loss import clip_ratios, clipped_surrogate, vanilla_policy_loss

__all__ = [
    "KL_PENALTY_TYPES",
    "LOSS_AGG_MODES",
    "LOSS_NORM_KEY",
    "AdaptiveKLController",
    "FixedKLController",
    "agg_loss",
    "apply_kl_in_reward",
    "check_loss_agg_mode",
    "clip_ratios",
    "clipped_surrogate",
    "kl_penalty",
    "loss_norm_totals",
    "make_actor_loss_fn",
    "make_kl_controller",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "vanilla_policy_loss",
]
