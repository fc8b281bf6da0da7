"""Entry point of polyrl-schedule-offpolicy. Light on purpose: the schedules are named by import
string and imported when a run selects one."""

from __future__ import annotations

from collections.abc import Iterator

from polyrl.api import ScheduleSpec, hookimpl
from polyrl_schedule_offpolicy.settings import OFF_POLICY_ALIASES, OFF_POLICY_SECTIONS

_PKG = "polyrl_schedule_offpolicy"


@hookimpl
def polyrl_schedules() -> Iterator[ScheduleSpec]:
    yield ScheduleSpec(
        name="one_step_off",
        description="The next step's batch is generated (by the policy one update behind) "
        "while this step trains; needs the rollout on workers of its own and an off-policy "
        "correction (TIS cap or decoupled_ppo)",
        schedule=f"{_PKG}.schedules:one_step_off",
        describe=f"{_PKG}.one_step_off:describe",
        config_check=f"{_PKG}.checks:check_config",
    )
    yield ScheduleSpec(
        name="k_step_off",
        description="The rollout generates up to trainer.off_policy.max_off_policy_threshold "
        "(k) batches ahead while the actor trains, samples at most k versions behind; needs "
        "the rollout on workers of its own and an off-policy correction; with "
        "trainer.off_policy.partial_rollout=continue|abort the weights reach the rollout "
        "after every update, between chunks of generation",
        schedule=f"{_PKG}.schedules:k_step_off",
        describe=f"{_PKG}.k_step_off:describe",
        config_check=f"{_PKG}.checks:check_config",
        config_sections=OFF_POLICY_SECTIONS,
        key_aliases=OFF_POLICY_ALIASES,
    )
