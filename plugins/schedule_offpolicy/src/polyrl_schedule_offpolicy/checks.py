"""What ``trainer.async_mode=one_step_off`` needs of the run config, for ``polyrl validate``: the
rollout on workers of its own (one process per device does one thing at a time), the TIS
correction (the samples come from the previous policy), and a step that generates before it
trains and does not call the rollout again after (offline DPO cannot run ahead)."""

from __future__ import annotations

from typing import Any

from polyrl.api import TIS_CAP_KEY, ConfigError, PolyrlError, build_pipeline, pool_of, tis_enabled


def check_config(cfg: Any) -> list[str]:
    problems = []
    if pool_of(cfg, "rollout") == pool_of(cfg, "actor"):
        problems.append(
            "trainer.async_mode=one_step_off generates the next batch while the actor trains, "
            "which needs the rollout on workers of its own: set "
            "actor_rollout_ref.hybrid_engine=false (a colocated rollout shares each worker with "
            "the actor, so nothing can overlap)"
        )
    cap = cfg.actor_rollout_ref.actor.tis_imp_ratio_cap
    if isinstance(cap, int | float) and not tis_enabled(cap):
        problems.append(
            f"trainer.async_mode=one_step_off trains on samples of the previous policy, which "
            f"needs the truncated importance-sampling correction: set {TIS_CAP_KEY}=2.0 (or "
            f"another cap >= 1)"
        )
    from polyrl_schedule_offpolicy.one_step_off import split_step

    try:
        pipeline = build_pipeline(cfg)
    except PolyrlError:
        return problems  # polyrl validate reports why the step cannot be built
    try:
        split_step(pipeline)
    except ConfigError as exc:
        problems.append(f"trainer.async_mode=one_step_off: {exc}")
    return problems
