"""Entry point of polyrl-reward-judge: the ``judge`` reward provider. Light on purpose: no
torch, no openai; the registry resolves the import strings only when the judge is selected."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from polyrl.api import RewardProviderSpec, hookimpl
from polyrl_reward_judge.settings import SECTION


def judge_roles(cfg: Any) -> dict[str, str]:
    """``RewardProviderSpec.roles``: the worker role ``judge`` with the rollout backend; none
    with the openai backend (its judge is behind a URL)."""
    if cfg.reward_model.judge.backend == "rollout":
        return {"judge": "polyrl_reward_judge.role:JudgeRole"}
    return {}


@hookimpl
def polyrl_reward_providers() -> Iterator[RewardProviderSpec]:
    yield RewardProviderSpec(
        name="judge",
        description="LLM as judge: a judge model (a polyrl rollout engine, or an "
        "OpenAI-compatible endpoint) grades each response; unparsed verdicts are counted",
        provider="polyrl_reward_judge.provider:JudgeReward",
        config_check="polyrl_reward_judge.checks:check_config",
        config_sections={SECTION: "polyrl_reward_judge.settings:JudgeSettings"},
        roles=judge_roles,
        plugin_keys={f"{SECTION}.rollout": "rollout_engine"},
        api_version=">=1.0,<2",
    )
