"""Entry point of polyrl-algo-distill. Light on purpose: no torch import here; the registry
resolves the import strings only when the algorithm is selected."""

from __future__ import annotations

from collections.abc import Iterator

from polyrl.api import AlgorithmSpec, hookimpl
from polyrl_algo_distill.settings import CONFIG_SECTIONS


@hookimpl
def polyrl_algorithms() -> Iterator[AlgorithmSpec]:
    yield AlgorithmSpec(
        name="distill",
        description="on-policy distillation: a frozen teacher scores the student's samples; "
        "the per-token reverse KL to it is the advantage (optionally plus the task's)",
        pipeline="polyrl_algo_distill.stages:distill_pipeline",
        roles=("actor", "rollout", "ref", "teacher", "reward_model"),
        role_classes={"teacher": "polyrl_algo_distill.teacher:TeacherRole"},
        config_defaults={"algorithm.adv_estimator": "grpo"},
        config_check="polyrl_algo_distill.checks:check_config",
        config_sections=CONFIG_SECTIONS,
        owned_keys=("distill",),
    )
