"""Moved: the one-step off-policy schedule is the plugin package polyrl-schedule-offpolicy
(``polyrl_schedule_offpolicy.one_step_off``); this path keeps working with a warning."""

from polyrl._moved import moved_to

__getattr__ = moved_to(
    "polyrl.step.one_step_off",
    "polyrl_schedule_offpolicy.one_step_off",
    "polyrl-schedule-offpolicy",
)
