"""polyrl-schedule-offpolicy: step schedules that generate ahead of training
(``trainer.async_mode=one_step_off``)."""

__version__ = "0.1.0"
