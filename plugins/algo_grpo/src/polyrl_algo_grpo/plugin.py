"""Entry point of polyrl-algo-grpo. Light on purpose: no torch import here; the registry
resolves the import strings only when a name is selected."""

from __future__ import annotations

from collections.abc import Iterator

from polyrl.api import (
    ESTIMATOR_KEYS,
    AdvantageEstimatorSpec,
    AlgorithmSpec,
    PolicyLossSpec,
    hookimpl,
    names,
)
from polyrl_algo_grpo.dapo_settings import CONFIG_SECTIONS as DAPO_SECTIONS
from polyrl_algo_grpo.dapo_settings import KEY_ALIASES as DAPO_ALIASES
from polyrl_algo_grpo.gdpo_settings import CONFIG_SECTIONS as GDPO_SECTIONS

_ADV = "polyrl_algo_grpo.advantages"
#: What GRPO gives a group of one sample (``AdvantageEstimatorSpec.groups_of_one``): the notice
#: ``polyrl validate`` prints for ``rollout.n=1`` (``advantages.grpo_advantage`` does it).
GROUPS_OF_ONE = (
    "its advantage is its raw score (verl's GRPO takes mean 0 and std 1 for a group of one), "
    "so a reward that is never negative only pushes probabilities up; rollout.n >= 2 compares "
    "samples of a prompt"
)
_VARIANTS = "polyrl_algo_grpo.group_variants"
_OTB = "polyrl_algo_grpo.optimal_token_baseline"
#: What the optimal token baselines give a group of one sample (verl: no baseline).
OTB_GROUPS_OF_ONE = "its advantage is its return-to-go, as in verl"
# The critic-free step of core (gen, reward, old log-probs, [ref], adv, update, sync), with DAPO's
# overlong punishment when enabled, serves the whole family; they differ in the estimator and,
# for Dr.GRPO, the loss aggregation.
_STEP = "polyrl_algo_grpo.dapo:overlong_shaped_pipeline"
_ROLES = ("actor", "rollout", "ref", "reward_model")
_OVERLONG = ("reward_model.overlong_buffer",)
_OVERLONG_CHECK = "polyrl_algo_grpo.checks:check_overlong_config"


@hookimpl
def polyrl_algorithms() -> Iterator[AlgorithmSpec]:
    yield AlgorithmSpec(
        name="grpo",
        description="GRPO: group-relative outcome advantages, PPO-clipped policy loss",
        pipeline=_STEP,
        estimators=("grpo", "grpo_vectorized"),
        roles=_ROLES,
        config_sections=DAPO_SECTIONS,
        key_aliases=DAPO_ALIASES,
        owned_keys=_OVERLONG,
        config_check=_OVERLONG_CHECK,
    )
    yield AlgorithmSpec(
        name="drgrpo",
        description="Dr.GRPO: GRPO without the std division or the length bias",
        pipeline=_STEP,
        estimators=("drgrpo", "dr_grpo"),
        roles=_ROLES,
        config_sections=DAPO_SECTIONS,
        key_aliases=DAPO_ALIASES,
        owned_keys=_OVERLONG,
        config_check=_OVERLONG_CHECK,
        config_defaults={"actor_rollout_ref.actor.loss_agg_mode": "seq-mean-token-sum-norm"},
    )
    yield AlgorithmSpec(
        name="rloo",
        description="RLOO: leave-one-out baseline over the samples of a prompt",
        pipeline=_STEP,
        estimators=("rloo", "rloo_vectorized"),
        roles=_ROLES,
        config_sections=DAPO_SECTIONS,
        key_aliases=DAPO_ALIASES,
        owned_keys=_OVERLONG,
        config_check=_OVERLONG_CHECK,
    )
    yield AlgorithmSpec(
        name="gdpo",
        description="GDPO: each reward dimension (algorithm.gdpo_reward_keys) normalised in "
        "its group, weighted sum whitened over the batch",
        pipeline="polyrl_algo_grpo.gdpo:gdpo_pipeline",
        estimators=("gdpo",),
        roles=_ROLES,
        config_check="polyrl_algo_grpo.gdpo:check_gdpo_config",
        config_sections=GDPO_SECTIONS,
        owned_keys=("algorithm.gdpo_reward_keys", "algorithm.gdpo_reward_weights"),
    )
    # verl requires actor.calculate_sum_pi_squared=true beside these estimators; selecting one
    # turns it on here (a command line's own value still wins).
    yield AlgorithmSpec(
        name="optimal_token_baseline",
        description="verl's optimal token baselines: a baseline per position, weighted by "
        "each trajectory's path variance",
        pipeline=_STEP,
        estimators=("optimal_token_baseline", "tir_optimal_token_baseline"),
        roles=_ROLES,
        config_sections=DAPO_SECTIONS,
        key_aliases=DAPO_ALIASES,
        owned_keys=_OVERLONG,
        config_check=_OVERLONG_CHECK,
        config_defaults={"actor_rollout_ref.actor.calculate_sum_pi_squared": True},
    )
    # Selected by algorithm.name=dapo only: its estimator is GRPO's, which the grpo algorithm owns.
    yield AlgorithmSpec(
        name="dapo",
        description="DAPO: GRPO with dynamic sampling, clip-higher, overlong shaping, token-mean",
        pipeline="polyrl_algo_grpo.dapo:dapo_pipeline",
        roles=_ROLES,
        config_defaults={
            "algorithm.adv_estimator": "grpo",
            "algorithm.filter_groups.enable": True,
            "actor_rollout_ref.actor.clip_ratio_low": 0.2,
            "actor_rollout_ref.actor.clip_ratio_high": 0.28,
            "actor_rollout_ref.actor.loss_agg_mode": "token-mean",
        },
        config_check="polyrl_algo_grpo.checks:check_dapo_config",
        config_sections=DAPO_SECTIONS,
        key_aliases=DAPO_ALIASES,
        owned_keys=(
            "algorithm.filter_groups",
            "data.gen_batch_size",
            "reward_model.overlong_buffer",
        ),
    )


@hookimpl
def polyrl_advantage_estimators() -> Iterator[AdvantageEstimatorSpec]:
    yield AdvantageEstimatorSpec(
        name="grpo",
        description="GRPO: (score - group mean) / (group std + 1e-6); "
        "algorithm.norm_adv_by_std_in_grpo=false drops the std",
        fn=f"{_ADV}:grpo_advantage",
        requires_groups=True,
        groups_of_one=GROUPS_OF_ONE,
    )
    for name in ("drgrpo", "dr_grpo"):
        yield AdvantageEstimatorSpec(
            name=name,
            description="Dr.GRPO: score - group mean (no std), with seq-mean-token-sum-norm",
            fn=f"{_ADV}:drgrpo_advantage",
            requires_groups=True,
        )
    # verl's *_vectorized names are other implementations of the same formulas; ours is
    # vectorised already.
    for name in ("rloo", "rloo_vectorized"):
        yield AdvantageEstimatorSpec(
            name=name,
            description="RLOO: score - mean score of the other samples of the group",
            fn=f"{_ADV}:rloo_advantage",
            requires_groups=True,
        )
    yield AdvantageEstimatorSpec(
        name="grpo_vectorized",
        description="GRPO (verl's vectorised name): (score - group mean) / (group std + 1e-6)",
        fn=f"{_ADV}:grpo_advantage",
        requires_groups=True,
        groups_of_one=GROUPS_OF_ONE,
    )
    yield AdvantageEstimatorSpec(
        name="grpo_passk",
        description="Pass@k: only a group's best response learns, with best - second best "
        "(over the group std unless norm_adv_by_std_in_grpo=false)",
        fn=f"{_VARIANTS}:grpo_passk_advantage",
        requires_groups=True,
    )
    yield AdvantageEstimatorSpec(
        name="opo",
        description="OPO: score - length-weighted group mean score",
        fn=f"{_VARIANTS}:opo_advantage",
        requires_groups=True,
    )
    yield AdvantageEstimatorSpec(
        name="gpg",
        description="GPG: (score - group mean) * batch size / number of non-zero scores",
        fn=f"{_VARIANTS}:gpg_advantage",
        requires_groups=True,
    )
    yield AdvantageEstimatorSpec(
        name="gdpo",
        description="GDPO: per-dimension group normalisation of reward_components, weighted "
        "sum whitened over the batch",
        fn="polyrl_algo_grpo.gdpo:gdpo_advantage",
        requires=("reward_components", "response_mask", "uid"),
        requires_groups=True,
    )
    otb = (
        ("optimal_token_baseline", "returns-to-go minus a baseline per position"),
        ("tir_optimal_token_baseline", "the same over each response's own tokens (multi-turn)"),
    )
    for name, what in otb:
        yield AdvantageEstimatorSpec(
            name=name,
            description=f"verl's optimal token baseline: {what}, weighted by each "
            f"trajectory's path variance (needs actor.calculate_sum_pi_squared=true)",
            fn=f"{_OTB}:{name}_advantage",
            requires=(*ESTIMATOR_KEYS, names.OLD_LOG_PROBS, names.SUM_PI_SQUARED),
            requires_groups=True,
            groups_of_one=OTB_GROUPS_OF_ONE,
            config_check=f"{_OTB}:check_otb_config",
        )


@hookimpl
def polyrl_policy_losses() -> Iterator[PolicyLossSpec]:
    yield PolicyLossSpec(
        name="gspo",
        description="GSPO: clipped sequence-level importance ratio (geometric mean of token "
        "ratios); use with loss_agg_mode=seq-mean-token-mean",
        fn="polyrl_algo_grpo.gspo:gspo_policy_loss",
    )
