"""verl's ``bypass_mode`` loss, refused: it is the entry point of verl's rollout-correction
framework (``algorithm.rollout_correction.*``: the rollout's log-probs taken as the old ones,
token or sequence importance weights, a dozen rejection-sampling rules), which polyrl does not
implement. Selecting it fails in one line instead of running a loss with another meaning."""

from __future__ import annotations

from typing import Any

from polyrl.api import ConfigError

REFUSAL = (
    "actor_rollout_ref.actor.policy_loss.loss_mode=bypass_mode: verl's rollout correction "
    "(algorithm.rollout_correction.*, bypass of the old log-probs, IS weights and rejection "
    "sampling) is not supported by polyrl; use loss_mode=vanilla with "
    "actor_rollout_ref.actor.tis_imp_ratio_cap=<cap> for truncated importance sampling"
)


def check_bypass_config(cfg: Any) -> list[str]:
    return [REFUSAL]


def bypass_mode_policy_loss(batch: Any, log_prob: Any, config: Any) -> Any:
    raise ConfigError(REFUSAL)
