"""The code reward's rules for a run config (``DataSourceScorerSpec.config_check``), run by
``polyrl validate`` and before Ray starts whenever the package is installed."""

from __future__ import annotations

from typing import Any

from polyrl.api import Checker, at_least, get_registry
from polyrl_reward_code.settings import SCORE_MODES, SECTION


def check_config(cfg: Any) -> list[str]:
    """One line per out-of-range key of ``reward_model.code``."""
    c = Checker(cfg, get_registry())
    c.choice(f"{SECTION}.score", SCORE_MODES)
    c.number(f"{SECTION}.case_timeout_s", lambda v: v > 0, "> 0")
    c.number(f"{SECTION}.max_parallel", at_least(1), ">= 1", integer=True)
    c.number(f"{SECTION}.memory_mb", at_least(64), ">= 64", integer=True)
    c.number(f"{SECTION}.max_output_kb", at_least(1), ">= 1", integer=True)
    c.number(f"{SECTION}.max_processes", at_least(1), ">= 1", integer=True)
    return c.problems
