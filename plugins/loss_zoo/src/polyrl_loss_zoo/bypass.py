"""verl's ``bypass_mode`` loss: rollout correction with the rollout engine's log-probs taken as
the old ones (two policies, no recomputation of ``old_log_probs``), selected by
``algorithm.rollout_correction.bypass_mode=true`` as verl's trainer selects it.

Per micro-batch, against the current policy ``pi`` and the sampling policy ``pi_rollout``
(see :mod:`polyrl_loss_zoo.correction`): the rejection criteria (``rollout_rs``) take tokens
or whole responses out of the policy loss, and ``loss_type`` picks the objective:

- ``ppo_clip``: PPO's clipped surrogate (the built-in ``vanilla`` loss) with
  ``r = pi / pi_rollout``; the ratio is the importance correction, so the ``rollout_is``
  weights are only logged (applying them too would correct twice);
- ``reinforce``: ``-w * A * log pi`` with the truncated weights ``w`` (``rollout_is``), no
  clip.

The rejected tokens leave the policy loss the way verl leaves them out (its aggregation over
the mini-batch still counts the tokens of the response mask; per response, under
``seq-mean-token-mean``, only the kept ones). Metrics are verl's ``rollout_corr/*``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from polyrl.api import Batch, PluginKind, get_registry, masked_mean
from polyrl_loss_zoo.correction import rollout_correction
from polyrl_loss_zoo.correction_config import parse_correction
from polyrl_loss_zoo.ratios import on_response

if TYPE_CHECKING:
    from polyrl.api import PolicyLossFn

SEQ_MEAN_TOKEN_MEAN = "seq-mean-token-mean"
_ppo_clip: list[PolicyLossFn] = []


def ppo_clip_loss() -> PolicyLossFn:
    """The built-in ``vanilla`` loss (PPO's clipped surrogate with the dual clip), looked up
    once: ``ppo_clip`` is verl's vanilla loss with the rollout as the old policy."""
    if not _ppo_clip:
        _ppo_clip.append(get_registry().get(PluginKind.POLICY_LOSS, "vanilla").load())
    return _ppo_clip[0]


def bypass_mode_policy_loss(
    batch: Batch, log_prob: torch.Tensor, config: Any
) -> tuple[torch.Tensor, dict[str, Any]]:
    """Per-token loss ``[B, T]`` (0 on padding and on rejected tokens) and metrics: the
    objective's own (``pg_clipfrac``, ``pg_clipfrac_lower``, ``ppo_kl`` for ``ppo_clip``;
    ``ppo_kl`` for ``reinforce``, of the rollout against the current policy over the kept
    tokens) and ``rollout_corr/*``. ``config`` is the actor node; the settings are its
    ``policy_loss.rollout_correction`` (which follows ``algorithm.rollout_correction``)."""
    correction = parse_correction(config.policy_loss.rollout_correction)
    mask = batch["response_mask"]
    rollout_log_prob = batch["rollout_log_probs"]
    advantages = batch["advantages"]
    weights, kept, corr_metrics = rollout_correction(
        log_prob.detach(), rollout_log_prob, mask, correction
    )
    if correction.loss_type == "reinforce":
        scale = weights if weights is not None else torch.ones_like(log_prob)
        loss = -advantages * log_prob * scale
        with torch.no_grad():
            metrics: dict[str, Any] = {"ppo_kl": masked_mean(rollout_log_prob - log_prob, kept)}
    else:
        surrogate = Batch(
            {"old_log_probs": rollout_log_prob, "advantages": advantages, "response_mask": kept}
        )
        loss, metrics = ppo_clip_loss()(surrogate, log_prob, config)
    loss = on_response(loss, kept)
    if str(config.loss_agg_mode) == SEQ_MEAN_TOKEN_MEAN:
        loss = loss * _kept_share_inverse(mask, kept).to(loss.dtype)
    return loss, {**metrics, **corr_metrics}


def _kept_share_inverse(mask: torch.Tensor, kept: torch.Tensor) -> torch.Tensor:
    """``[B, 1]``: each response's token count over its kept count (0 when none is kept).
    The actor averages a response's loss over the tokens of ``response_mask``; verl averages it
    over the kept ones, which this factor restores."""
    tokens = (mask != 0).sum(dim=-1, keepdim=True).to(torch.float32)
    kept_tokens = (kept != 0).sum(dim=-1, keepdim=True).to(torch.float32)
    return torch.where(kept_tokens > 0, tokens / kept_tokens.clamp_min(1.0), 0.0)
