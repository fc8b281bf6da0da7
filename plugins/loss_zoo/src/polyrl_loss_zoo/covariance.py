"""Clip-Cov and KL-Cov (Cui et al., 2025, arXiv 2505.22617, "The Entropy Mechanism of
Reinforcement Learning for Reasoning Language Models").

Policy entropy falls when tokens with a high covariance between their advantage and their
log-prob are pushed further (confident and rewarded). Both losses treat a small share of those
tokens differently from the PPO surrogate, per token, with the covariance

    cov_t = (A_t - mean(A)) * (log pi_t - mean(log pi))       (means over the response tokens)

- ``clip_cov``: of the tokens PPO did not clip whose ``cov`` lies in ``(clip_cov_lb,
  clip_cov_ub)``, ``max(1, int(clip_cov_ratio * tokens))`` chosen AT RANDOM lose their gradient
  (their loss is multiplied by 0); the rest is PPO's clipped surrogate.
- ``kl_cov``: the ``max(1, int(kl_cov_ratio * tokens))`` tokens with the LARGEST ``cov`` get
  ``-A * r + ppo_kl_coef * |log r|`` (a KL penalty); the rest the unclipped ``-A * r``.

Settings are verl's ``actor_rollout_ref.actor.policy_loss.{clip_cov_ratio, clip_cov_lb,
clip_cov_ub, kl_cov_ratio, ppo_kl_coef}``. The random choice of ``clip_cov`` draws from torch's
global generator, as verl does, so it follows the run's seed; tests inject their own choice.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from polyrl.api import ConfigError, clip_ratios, masked_mean
from polyrl_loss_zoo.ratios import on_response

if TYPE_CHECKING:
    from polyrl.api import Batch

# (number of candidate tokens, how many to take) -> positions among the candidates
Choose = Callable[[int, int], torch.Tensor]


def choose_at_random(candidates: int, count: int) -> torch.Tensor:
    """``count`` distinct positions of ``range(candidates)`` in random order."""
    return torch.randperm(candidates)[:count]


def _positive_ratio(config: Any, key: str) -> float:
    value = float(config.policy_loss[key])
    if not value > 0:
        raise ConfigError(
            f"actor_rollout_ref.actor.policy_loss.{key}={value} must be > 0 (the share of tokens "
            f"treated differently; verl's default is 0.0002)"
        )
    return value


def check_clip_cov_config(cfg: Any) -> list[str]:
    """``clip_cov_ratio`` is positive and ``clip_cov_lb < clip_cov_ub``."""
    node = cfg.actor_rollout_ref.actor
    problems = _ratio_problems(node, "clip_cov_ratio")
    lb, ub = float(node.policy_loss.clip_cov_lb), float(node.policy_loss.clip_cov_ub)
    if not lb < ub:
        problems.append(
            f"actor_rollout_ref.actor.policy_loss.clip_cov_lb={lb} must be below "
            f"clip_cov_ub={ub}: no token's covariance could lie between them"
        )
    return problems


def check_kl_cov_config(cfg: Any) -> list[str]:
    """``kl_cov_ratio`` is positive."""
    return _ratio_problems(cfg.actor_rollout_ref.actor, "kl_cov_ratio")


def _ratio_problems(node: Any, key: str) -> list[str]:
    try:
        _positive_ratio(node, key)
    except ConfigError as exc:
        return [str(exc)]
    return []


def _covariance(advantages: torch.Tensor, log_prob: torch.Tensor, mask: torch.Tensor) -> Any:
    log_prob = log_prob.detach()
    return (advantages - masked_mean(advantages, mask)) * (log_prob - masked_mean(log_prob, mask))


def clip_cov_loss(
    batch: Batch, log_prob: torch.Tensor, config: Any, choose: Choose = choose_at_random
) -> tuple[torch.Tensor, dict[str, Any]]:
    """Clip-Cov per-token loss ``[B, T]`` with the tokens to detach picked by ``choose``;
    metrics ``pg_clipfrac`` (share of tokens whose gradient was cut) and ``ppo_kl``."""
    mask = batch["response_mask"]
    advantages = batch["advantages"]
    policy = config.policy_loss
    share = _positive_ratio(config, "clip_cov_ratio")
    lb, ub = float(policy.clip_cov_lb), float(policy.clip_cov_ub)
    low, high = clip_ratios(config)
    log_ratio = log_prob - batch["old_log_probs"]
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - low, 1.0 + high)
    with torch.no_grad():
        response = mask > 0
        candidate = (clipped <= unclipped) & response  # PPO did not clip these
        cov = _covariance(advantages, log_prob, mask)
        candidate &= (cov > lb) & (cov < ub)
        positions = torch.nonzero(candidate)
        count = min(max(int(share * int(mask.sum().item())), 1), len(positions))
        picked = positions[choose(len(positions), count).to(positions.device)]
        keep = torch.ones_like(advantages)
        keep[picked[:, 0], picked[:, 1]] = 0.0
    loss = torch.maximum(unclipped, clipped) * keep
    with torch.no_grad():
        metrics = {
            "pg_clipfrac": masked_mean((keep == 0).to(log_prob.dtype), mask),
            "ppo_kl": masked_mean(-log_ratio, mask),
        }
    return on_response(loss, mask), metrics


def clip_cov_policy_loss(
    batch: Batch, log_prob: torch.Tensor, config: Any
) -> tuple[torch.Tensor, dict[str, Any]]:
    """Clip-Cov with the random choice (see the module doc)."""
    return clip_cov_loss(batch, log_prob, config)


def kl_cov_policy_loss(
    batch: Batch, log_prob: torch.Tensor, config: Any
) -> tuple[torch.Tensor, dict[str, Any]]:
    """KL-Cov per-token loss ``[B, T]``; metric ``ppo_kl`` is the mean ``|log r|`` (verl's)."""
    mask = batch["response_mask"]
    advantages = batch["advantages"]
    share = _positive_ratio(config, "kl_cov_ratio")
    coef = float(config.policy_loss.ppo_kl_coef)
    log_ratio = log_prob - batch["old_log_probs"]
    ratio = torch.exp(log_ratio)
    plain = -advantages * ratio
    penalised = plain + coef * log_ratio.abs()
    with torch.no_grad():
        response = mask > 0
        cov = _covariance(advantages, log_prob, mask)[response]  # row-major order of tokens
        penalise = torch.zeros_like(response)
        if cov.numel():
            top = torch.topk(cov, max(1, int(cov.numel() * share))).indices
            flat = torch.nonzero(response.reshape(-1), as_tuple=True)[0][top]
            penalise.view(-1)[flat] = True
    loss = torch.where(penalise, penalised, plain)
    with torch.no_grad():
        metrics = {"ppo_kl": masked_mean(log_ratio.abs(), mask)}
    return on_response(loss, mask), metrics
