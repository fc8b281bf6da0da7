"""Entry point of polyrl-loss-zoo. Light on purpose: no torch import here; the registry
resolves the import strings only when a loss is selected."""

from __future__ import annotations

from collections.abc import Iterator

from polyrl.api import PolicyLossSpec, hookimpl
from polyrl_loss_zoo.settings import (
    POLICY_LOSS_SECTIONS,
    ROLLOUT_CORRECTION_SECTIONS,
    SAPO_SECTIONS,
)

_PKG = "polyrl_loss_zoo"


@hookimpl
def polyrl_policy_losses() -> Iterator[PolicyLossSpec]:
    yield PolicyLossSpec(
        name="gpg",
        description="GPG: plain policy gradient -A * log pi (no ratio, no clip)",
        fn=f"{_PKG}.plain_gradient:gpg_policy_loss",
    )
    yield PolicyLossSpec(
        name="dro",
        description="DRO: -(A * log pi - dro_beta/2 * (log pi - log pi_old)^2); "
        "policy_loss.dro_beta must be set",
        fn=f"{_PKG}.plain_gradient:dro_policy_loss",
        config_check=f"{_PKG}.plain_gradient:check_dro_config",
        config_sections=POLICY_LOSS_SECTIONS,
    )
    yield PolicyLossSpec(
        name="cispo",
        description="CISPO: -sg(clip(ratio)) * A * log pi: the IS weight is clipped, every "
        "token keeps its gradient",
        fn=f"{_PKG}.clipped_weight:cispo_policy_loss",
    )
    yield PolicyLossSpec(
        name="dppo_tv",
        description="DPPO-Binary-TV: tokens whose probability moved more than clip_ratio_low/"
        "high against the advantage are masked out; ratio truncated at clip_ratio_c",
        fn=f"{_PKG}.dppo:dppo_tv_policy_loss",
    )
    yield PolicyLossSpec(
        name="dppo_kl",
        description="DPPO-Binary-KL: as dppo_tv with the binary KL of the token's probability "
        "as the divergence",
        fn=f"{_PKG}.dppo:dppo_kl_policy_loss",
    )
    yield PolicyLossSpec(
        name="sapo",
        description="SAPO: soft sigmoid gate on the ratio (tau_pos/tau_neg); per-response "
        "token mean, ignores loss_agg_mode as verl does",
        fn=f"{_PKG}.sapo:sapo_policy_loss",
        level="sequence",
        config_check=f"{_PKG}.sapo:check_sapo_config",
        config_sections=SAPO_SECTIONS,
    )
    yield PolicyLossSpec(
        name="geo_mean",
        description="GMPO: geometric mean of token ratios clipped in log space, one loss per "
        "response; ignores loss_agg_mode as verl does",
        fn=f"{_PKG}.geo_mean:geo_mean_policy_loss",
        level="sequence",
    )
    yield PolicyLossSpec(
        name="clip_cov",
        description="Clip-Cov: PPO surrogate; a random clip_cov_ratio share of high-covariance "
        "tokens loses its gradient",
        fn=f"{_PKG}.covariance:clip_cov_policy_loss",
        config_check=f"{_PKG}.covariance:check_clip_cov_config",
        config_sections=POLICY_LOSS_SECTIONS,
    )
    yield PolicyLossSpec(
        name="kl_cov",
        description="KL-Cov: -A * ratio; the kl_cov_ratio share of highest-covariance tokens "
        "adds ppo_kl_coef * |log ratio|",
        fn=f"{_PKG}.covariance:kl_cov_policy_loss",
        config_check=f"{_PKG}.covariance:check_kl_cov_config",
        config_sections=POLICY_LOSS_SECTIONS,
    )
    yield PolicyLossSpec(
        name="decoupled_ppo",
        description="Decoupled PPO (AReaL): ratio clipped around the proximal policy "
        "(old_log_probs), times sg(pi_prox/pi_behav) with the rollout's log-probs; tokens "
        "over policy_loss.behav_imp_weight_cap left out; not with the TIS cap",
        fn=f"{_PKG}.decoupled:decoupled_ppo_policy_loss",
        requires=("old_log_probs", "rollout_log_probs", "advantages", "response_mask"),
        config_check=f"{_PKG}.decoupled:check_decoupled_config",
        config_sections=POLICY_LOSS_SECTIONS,
    )
    yield PolicyLossSpec(
        name="bypass_mode",
        description="verl's rollout correction, bypass mode (selected by algorithm."
        "rollout_correction.bypass_mode=true): IS weights and rejection against the rollout's "
        "log-probs; ppo_clip or reinforce",
        fn=f"{_PKG}.bypass:bypass_mode_policy_loss",
        # no old_log_probs: the rollout's are the old ones, so their forward pass is skipped
        requires=("rollout_log_probs", "advantages", "response_mask"),
        config_check=f"{_PKG}.correction_config:check_bypass_config",
        config_sections=ROLLOUT_CORRECTION_SECTIONS,
        implies=f"{_PKG}.correction_config:implied_settings",
        edit_step=f"{_PKG}.correction_stage:edit_step",
    )
