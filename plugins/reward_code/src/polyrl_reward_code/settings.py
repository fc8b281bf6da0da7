"""``reward_model.code`` and ``reward_model.sandbox_fusion``: the settings of the code reward.
Light on purpose (no polyrl import beyond the standard library): it is imported whenever a
config is composed."""

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


SANDBOX_FUSION_SECTION = "reward_model.sandbox_fusion"
# The data sources verl sends to SandboxFusion when reward_model.sandbox_fusion.url is set.
SANDBOX_FUSION_SOURCES = ("codecontests", "apps", "codeforces", "taco")


@dataclass
class SandboxFusionSettings:
    """verl's ``reward_model.sandbox_fusion``: the rows of verl's code data sources are run by a
    SandboxFusion service over HTTP (polyrl_reward_code.sandbox_fusion)."""

    url: str | None = None  # the service's /run_code endpoint (http or https); null: not used
    max_concurrent: int = 64  # requests in flight at once from one reward process
    memory_limit_mb: int = 1024  # memory_limit_MB sent with each request (-1: the service's)
    run_timeout_s: float = 10.0  # run_timeout (and compile_timeout) sent with each request
