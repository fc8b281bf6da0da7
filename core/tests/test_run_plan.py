"""The run plan: one selection of every plugin, stages bound to it, and what workers receive."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from polyrl.config import load_config
from polyrl.errors import PolyrlError
from polyrl.plan import assemble
from polyrl.specs import (
    AdvantageEstimatorSpec,
    LoggerSpec,
    PluginKind,
    PolicyLossSpec,
    RewardProviderSpec,
)
from polyrl.step import Stage
from polyrl.workers.worker_plan import WorkerPlan

SRC = Path(__file__).resolve().parents[1] / "src" / "polyrl"
# A loss that reads the sampler's log-probs: its requires must reach the update stage.
WITH_SAMPLER = PolicyLossSpec(
    name="with_sampler",
    description="reads the sampler's log-probs",
    fn=lambda batch, log_prob, config: (log_prob, {}),
    requires=("old_log_probs", "advantages", "response_mask", "rollout_log_probs"),
)


def _imports_registry(path: Path) -> list[int]:
    lines = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names = {alias.name for alias in node.names}
            if node.module == "polyrl.registry" or (
                node.module == "polyrl" and "registry" in names
            ):
                lines.append(node.lineno)
        elif isinstance(node, ast.Import):
            lines += [node.lineno for a in node.names if a.name == "polyrl.registry"]
    return lines


@pytest.mark.parametrize("package", ["workers", "step"])
def test_no_step_or_worker_module_imports_the_registry(package: str) -> None:
    offenders = {
        str(path.relative_to(SRC)): lines
        for path in sorted((SRC / package).rglob("*.py"))
        if (lines := _imports_registry(path))
    }
    assert offenders == {}, f"modules that import polyrl.registry (line numbers): {offenders}"


def test_the_plan_selects_each_plugin_once_with_provenance() -> None:
    plan = assemble(load_config(["recipe=tiny"]))
    assert plan.problems == []
    assert plan.algorithm.name == "grpo"
    assert plan.training_engine.name == "fsdp2"
    assert plan.training_engine.provenance.distribution == "polyrl-engine-fsdp"
    assert plan.rollout_engine.name == "hf"
    assert [reg.name for reg in plan.loggers] == ["console", "jsonl"]
    assert plan.pools == {"global": (2, ("rollout", "actor", "ref"))}
    # the hf rollout reports log-probs: the bound generate stage provides them
    assert "rollout_log_probs" in plan.pipeline["gen"].provides


def test_ppo_plan_carries_the_critic_engine_to_the_workers() -> None:
    plan = assemble(load_config(["recipe=ppo"]))
    assert plan.problems == []
    assert plan.plugins["critic.strategy"].name == "fsdp2"
    workers = plan.worker_plan()
    assert workers.role_classes["critic"] == "polyrl_algo_ppo.critic:CriticRole"
    assert workers.registration(PluginKind.TRAINING_ENGINE, "fsdp2") is plan.training_engine


def test_a_worker_plan_refuses_a_plugin_it_did_not_select() -> None:
    with pytest.raises(PolyrlError, match="selected no training_engine 'megatron'"):
        WorkerPlan().load(PluginKind.TRAINING_ENGINE, "megatron")


def test_stages_are_bound_to_the_selected_estimator_and_loss(register_plugin) -> None:
    register_plugin(
        [
            AdvantageEstimatorSpec(
                name="with_extra",
                description="reads an extra key",
                fn=lambda batch, config: (batch["x"], batch["x"]),
                requires=("token_level_rewards", "response_mask", "uid", "x"),
            ),
            WITH_SAMPLER,
        ]
    )
    cfg = load_config(
        [
            "recipe=tiny",
            "algorithm.adv_estimator=with_extra",
            "actor_rollout_ref.actor.policy_loss.loss_mode=with_sampler",
        ]
    )
    plan = assemble(cfg)
    assert plan.pipeline["adv"].requires[-1] == "x"
    assert "rollout_log_probs" in plan.pipeline["update_actor"].requires
    (problem,) = plan.problems
    assert "stage 'adv' requires batch key 'x'" in problem


def test_the_plan_describes_plugins_stages_and_pools() -> None:
    text = assemble(load_config(["recipe=ppo"])).describe()
    assert "critic.strategy" in text and "(polyrl-engine-fsdp " in text
    assert "stages:" in text and "values [critic]" in text
    assert "pools:\n  global: " in text


def test_a_wrapped_stage_is_bound_too(register_plugin) -> None:
    # PPO wraps update_actor while the critic warms up: the wrapper must pass the plan on
    register_plugin(WITH_SAMPLER)
    cfg = load_config(
        [
            "recipe=ppo",
            "trainer.critic_warmup=3",
            "actor_rollout_ref.actor.policy_loss.loss_mode=with_sampler",
        ]
    )
    assert "rollout_log_probs" in assemble(cfg).pipeline["update_actor"].requires


def test_a_reward_providers_roles_are_placed_and_reach_the_workers(register_plugin) -> None:
    # a provider that scores through a worker role of its own, which builds the rollout engine
    # named by another key: the plan places the role like the step's and hands both over
    register_plugin(
        RewardProviderSpec(
            name="with_role",
            description="scores on the workers",
            provider="polyrl.rewards.provider:NaiveRewardProvider",
            roles=lambda cfg: {"grader": "my_package.roles:GraderRole"},
            plugin_keys={"critic.strategy": "training_engine"},
        )
    )
    base = ["recipe=tiny", "reward_model.reward_manager=with_role"]
    plan = assemble(load_config(base))
    assert plan.pools == {"global": (2, ("rollout", "actor", "ref", "grader"))}
    assert plan.worker_plan().role_classes["grader"] == "my_package.roles:GraderRole"
    assert plan.plugins["critic.strategy"].name == "fsdp2"
    own = [*base, "trainer.role_pools.grader=grading", "trainer.resource_pools.grading=1"]
    assert assemble(load_config(own)).pools["grading"] == (1, ("grader",))


class _Marker(Stage):
    name = "marker"
    requires = ("old_log_probs",)
    provides = ("marks",)

    def run(self, state, ctx) -> None:  # pragma: no cover - never run here
        raise AssertionError


def _add_marker(cfg, pipeline) -> None:
    if cfg.trainer.total_epochs == 3:  # stands for the plugin's own key asking for it
        pipeline.insert_before("adv", _Marker())
        pipeline["update_actor"].send("marks")


def _broken_edit(cfg, pipeline) -> None:
    raise KeyError("oops")


def _editing_logger(name: str, edit) -> LoggerSpec:
    return LoggerSpec(
        name=name,
        description="edits",
        logger="polyrl.loggers.console:ConsoleLogger",
        edit_step=edit,
    )


def test_an_installed_plugin_edits_the_step_of_any_algorithm(register_plugin) -> None:
    register_plugin(_editing_logger("marking", _add_marker))
    plan = assemble(load_config(["recipe=grpo", "trainer.total_epochs=3"]))
    names = plan.pipeline.names()
    assert names.index("marker") == names.index("adv") - 1
    assert "marks" in plan.pipeline["update_actor"].requires  # kept through bind
    assert plan.problems == []
    assert "marker" not in assemble(load_config(["recipe=grpo"])).pipeline.names()


def test_a_failing_step_edit_names_its_package(register_plugin) -> None:
    register_plugin(_editing_logger("broken_edit", _broken_edit))
    with pytest.raises(PolyrlError, match=r"'broken_edit' .* failed to edit the step .*KeyError"):
        assemble(load_config(["recipe=tiny"]))
