"""``reward_model.code``: the settings of the code reward. Light on purpose (no polyrl import
beyond the standard library): it is imported whenever a config is composed."""

from __future__ import annotations

from dataclasses import dataclass

SECTION = "reward_model.code"
SCORE_MODES = ("fraction", "all")


@dataclass
class CodeRewardSettings:
    """The ``code`` data source: a response's Python program run against the row's test cases,
    each case in the sandbox (polyrl_reward_code.scorer)."""

    score: str = "fraction"  # fraction: share of cases passed | all: 1.0 only when all pass
    case_timeout_s: float = 5.0  # wall-clock (and CPU) limit of one case
    max_parallel: int = 2  # cases of one response run at once
    memory_mb: int = 512  # address-space limit of one case's process
    max_output_kb: int = 1024  # more output than this fails the case
    # processes and threads the sandbox user may have while a case runs (no fork bombs)
    max_processes: int = 64
