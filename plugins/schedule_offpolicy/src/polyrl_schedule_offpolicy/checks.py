"""What the off-policy schedules (``trainer.async_mode=one_step_off|k_step_off``) need of the
run config, for ``polyrl validate``: the rollout on workers of its own (one process per device
does one thing at a time), an off-policy correction (the samples come from earlier policies:
the TIS cap, or the ``decoupled_ppo`` loss), a threshold and strategy in range, and a step that
generates before it trains and does not call the rollout again after (offline DPO cannot run
ahead)."""

from __future__ import annotations

from typing import Any

from polyrl.api import TIS_CAP_KEY, ConfigError, PolyrlError, build_pipeline, pool_of, tis_enabled
from polyrl_schedule_offpolicy.settings import (
    CHUNK_KEY,
    PARTIAL_KEY,
    PARTIAL_MODES,
    STRATEGIES,
    STRATEGY_KEY,
    THRESHOLD_KEY,
)

LOSS_MODE_KEY = "actor_rollout_ref.actor.policy_loss.loss_mode"
# Policy losses that correct for the behaviour policy themselves (polyrl-loss-zoo's).
SELF_CORRECTING_LOSSES = ("decoupled_ppo",)


def check_config(cfg: Any) -> list[str]:
    mode = f"trainer.async_mode={cfg.trainer.async_mode}"
    problems = []
    if pool_of(cfg, "rollout") == pool_of(cfg, "actor"):
        problems.append(
            f"{mode} generates the next batches while the actor trains, which needs the rollout "
            f"on workers of its own: set actor_rollout_ref.hybrid_engine=false (a colocated "
            f"rollout shares each worker with the actor, so nothing can overlap)"
        )
    cap = cfg.actor_rollout_ref.actor.tis_imp_ratio_cap
    loss_mode = str(cfg.actor_rollout_ref.actor.policy_loss.loss_mode)
    if (
        isinstance(cap, int | float)
        and not tis_enabled(cap)
        and loss_mode not in SELF_CORRECTING_LOSSES
    ):
        problems.append(
            f"{mode} trains on samples of earlier policies, which needs an off-policy "
            f"correction: set {TIS_CAP_KEY}=2.0 (truncated importance sampling, or another cap "
            f">= 1) or {LOSS_MODE_KEY}=decoupled_ppo (polyrl-loss-zoo)"
        )
    problems += _settings_problems(cfg)
    from polyrl_schedule_offpolicy.k_step_off import split_step

    try:
        pipeline = build_pipeline(cfg)
    except PolyrlError:
        return problems  # polyrl validate reports why the step cannot be built
    try:
        generation, _, _ = split_step(pipeline)
    except ConfigError as exc:
        problems.append(f"{mode}: {exc}")
        return problems
    if cfg.trainer.off_policy.partial_rollout != "off":
        from polyrl_schedule_offpolicy.partial_rollout import chunkable_problem

        problems += [problem for problem in [chunkable_problem(generation)] if problem]
    return problems


def _settings_problems(cfg: Any) -> list[str]:
    settings = cfg.trainer.off_policy
    threshold, strategy = settings.max_off_policy_threshold, settings.max_off_policy_strategy
    problems = []
    if cfg.trainer.async_mode == "one_step_off" and threshold != 1:
        problems.append(
            f"trainer.async_mode=one_step_off is k-step with k=1, but {THRESHOLD_KEY}="
            f"{threshold}: use trainer.async_mode=k_step_off for k={threshold}, or drop the key"
        )
    elif not isinstance(threshold, int) or isinstance(threshold, bool) or threshold < 1:
        problems.append(
            f"{THRESHOLD_KEY}={threshold!r} must be a whole number >= 1: the policy versions a "
            f"sample may lag (and the batches generated ahead); 1 is one-step off-policy"
        )
    problems += _partial_problems(cfg)
    if strategy not in STRATEGIES:
        problems.append(
            f"{STRATEGY_KEY}={strategy!r}: use wait (a batch staler than the threshold is "
            f"generated again) or drop (its prompts are left out of the epoch)"
        )
    return problems


def _partial_problems(cfg: Any) -> list[str]:
    settings = cfg.trainer.off_policy
    partial, chunk = settings.partial_rollout, settings.partial_rollout_chunk_tokens
    if partial not in PARTIAL_MODES:
        return [
            f"{PARTIAL_KEY}={partial!r}: use off (weights reach the rollout between rounds), "
            f"continue (a sample cut by a weight sync goes on with the new weights) or abort "
            f"(it starts again)"
        ]
    if partial == "off":
        return []
    problems = []
    if not isinstance(chunk, int) or isinstance(chunk, bool) or chunk < 1:
        problems.append(
            f"{CHUNK_KEY}={chunk!r} must be a whole number >= 1: the new tokens generated "
            f"between two chances of a weight sync"
        )
    if cfg.actor_rollout_ref.rollout.multi_turn.enable:
        problems.append(
            f"{PARTIAL_KEY}={partial} chunks single-turn generation; multi-turn episodes "
            f"(actor_rollout_ref.rollout.multi_turn.enable=true) run whole: set {PARTIAL_KEY}=off"
        )
    return problems
