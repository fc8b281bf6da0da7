"""Entry point of polyrl-schedule-offpolicy. Light on purpose: the schedule is named by import
string and imported when a run selects it."""

from __future__ import annotations

from collections.abc import Iterator

from polyrl.api import ScheduleSpec, hookimpl


@hookimpl
def polyrl_schedules() -> Iterator[ScheduleSpec]:
    yield ScheduleSpec(
        name="one_step_off",
        description="The next step's batch is generated (by the policy one update behind) "
        "while this step trains; needs the rollout on workers of its own and the TIS cap",
        schedule="polyrl_schedule_offpolicy.one_step_off:OneStepOffSchedule",
        describe="polyrl_schedule_offpolicy.one_step_off:describe",
        config_check="polyrl_schedule_offpolicy.checks:check_config",
    )
