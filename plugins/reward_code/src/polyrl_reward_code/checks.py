"""The code reward's rules for a run config (``DataSourceScorerSpec.config_check``), run by
``polyrl validate`` and before Ray starts whenever the package is installed, and what verl's
SandboxFusion keys imply for the rest of the config (``implies``)."""

from __future__ import annotations

from typing import Any

from polyrl.api import Checker, at_least, get_registry
from polyrl_reward_code.sandbox_fusion import request_deadline_s, url_problem
from polyrl_reward_code.settings import SANDBOX_FUSION_SECTION, SCORE_MODES, SECTION

CUSTOM_FUNCTION = "custom_reward_function.path"


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


def check_sandbox_fusion(cfg: Any) -> list[str]:
    """One line per unusable key of ``reward_model.sandbox_fusion``. Offline on purpose: a
    config is validated where the service may not be reachable; a failing request is reported
    by the first reward process that meets it."""
    c = Checker(cfg, get_registry())
    url = c.get(f"{SANDBOX_FUSION_SECTION}.url")
    if url not in (None, "") and (problem := url_problem(url)):
        c.add(f"{SANDBOX_FUSION_SECTION}.url={url!r} {problem}")
    c.number(f"{SANDBOX_FUSION_SECTION}.max_concurrent", at_least(1), ">= 1", integer=True)
    c.number(
        f"{SANDBOX_FUSION_SECTION}.memory_limit_mb",
        lambda v: v == -1 or v >= 1,
        ">= 1, or -1 for the service's own limit",
        integer=True,
    )
    run_timeout = c.number(f"{SANDBOX_FUSION_SECTION}.run_timeout_s", lambda v: v > 0, "> 0")
    if url and run_timeout:
        _check_sample_timeout(c, run_timeout)
    if url and c.get(CUSTOM_FUNCTION):
        c.notice(
            f"{SANDBOX_FUSION_SECTION}.url has no effect with {CUSTOM_FUNCTION}: the custom "
            f"function scores every row (as in verl)"
        )
    return c.problems


def _check_sample_timeout(c: Checker, run_timeout: float) -> None:
    """The cases of a sample run at once, so the sample takes about as long as its slowest
    request; a shorter ``reward_model.timeout_s`` loses the whole sample's score."""
    sample_timeout, slowest = c.get("reward_model.timeout_s"), request_deadline_s(run_timeout)
    if isinstance(sample_timeout, int | float) and sample_timeout < slowest:
        c.notice(
            f"reward_model.timeout_s={sample_timeout:g} is shorter than a SandboxFusion case may "
            f"take ({slowest:g} s with {SANDBOX_FUSION_SECTION}.run_timeout_s={run_timeout:g}): "
            f"a sample with a slow case then scores reward_model.failure_score as a whole; set "
            f"reward_model.timeout_s={slowest:g}"
        )


def implied_settings(cfg: Any) -> dict[str, tuple[Any, str]]:
    """A SandboxFusion URL needs reward workers that may open connections: the sandboxed ones
    have no network. Nothing of a response runs in them on this route (the service runs it),
    so the URL stands for plain workers, ``reward_model.sandbox=never``."""
    url = cfg.reward_model.sandbox_fusion.url
    if not url or cfg.custom_reward_function.path:
        return {}
    return {"reward_model.sandbox": ("never", f"{SANDBOX_FUSION_SECTION}.url={url}")}
