"""PPO's step: stage order, the critic's warm-up gate, the two critic stages against recorded
worker calls, and the driver-side value metrics (verl's names and formulas)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from polyrl.api import build_pipeline
from polyrl.batch import Batch
from polyrl.config.loader import load_config
from polyrl.step import Stage, StepContext, StepState
from polyrl.workers.dispatch import Dispatch
from polyrl_algo_ppo.metrics import value_metrics
from polyrl_algo_ppo.stages import AfterCriticWarmup, UpdateCriticStage, ValuesStage, ppo_pipeline

RESPONSE = 3


def step_batch() -> Batch:
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    return Batch(
        {
            "input_ids": torch.ones(2, 5, dtype=torch.long),
            "attention_mask": torch.ones(2, 5, dtype=torch.long),
            "position_ids": torch.arange(5).repeat(2, 1),
            "responses": torch.ones(2, RESPONSE, dtype=torch.long),
            "response_mask": mask,
            "values": torch.tensor([[0.5, 0.0, 9.0], [1.0, 7.0, 7.0]]),
            "returns": torch.tensor([[1.0, 2.0, 0.0], [0.0, 0.0, 0.0]]),
            "advantages": torch.zeros(2, RESPONSE),
        }
    )


class RecordingWorkers:
    """Two data-parallel critic ranks that record what they are called with."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, tuple[Any, ...], Dispatch]] = []

    def call(self, role: str, method: str, *args: Any, dispatch: Dispatch = Dispatch.DP_SPLIT):
        self.calls.append((role, method, args, dispatch))
        if method == "compute_values":
            return Batch({"values": torch.full(args[0]["responses"].shape, 0.25)})
        return [
            {"critic/vf_loss": 1.0, "critic/grad_norm": 2.0},
            {"critic/vf_loss": 3.0, "critic/grad_norm": 2.0},
        ]

    def dp_size(self, role: str) -> int:
        return 2

    def sync_weights(self, source: str, target: str) -> dict[str, float]:
        raise AssertionError("not used")


def context(*overrides: str) -> StepContext:
    return StepContext(
        cfg=load_config(["recipe=ppo", *overrides]),
        workers=RecordingWorkers(),
        tokenizer=None,
        reward=None,  # type: ignore[arg-type]
        next_prompts=lambda count=None: Batch(),
    )


def test_the_step_is_the_policy_gradient_step_with_a_critic():
    pipeline = build_pipeline(load_config(["recipe=ppo"]))
    assert pipeline.names() == [
        "gen",
        "reward",
        "old_log_prob",
        "ref",
        "values",
        "adv",
        "update_critic",
        "update_actor",
        "update_weights",
    ]
    assert pipeline.roles() == ("rollout", "actor", "ref", "critic")
    assert pipeline["adv"].requires == ("token_level_rewards", "values", "response_mask")
    assert pipeline.check() == []


def test_adv_estimator_gae_selects_ppo():
    cfg = load_config(["recipe=tiny", "algorithm.adv_estimator=gae"])
    assert "values" in build_pipeline(cfg).names()


def test_warmup_gates_the_actor_update_and_the_weight_sync():
    plain = ppo_pipeline(load_config(["recipe=ppo", "trainer.critic_warmup=1"]))
    assert not isinstance(plain["update_actor"], AfterCriticWarmup)  # 0 and 1: no warm-up
    pipeline = ppo_pipeline(load_config(["recipe=ppo", "trainer.critic_warmup=3"]))
    for name in ("update_actor", "update_weights"):
        assert isinstance(pipeline[name], AfterCriticWarmup)
    assert not isinstance(pipeline["update_critic"], AfterCriticWarmup)

    ran: list[int] = []

    class Probe(Stage):
        name, requires, provides, roles = "probe", ("a",), ("b",), ("actor",)

        def run(self, state: StepState, ctx: StepContext) -> None:
            ran.append(state.step)

    gated = AfterCriticWarmup(Probe(), warmup=3)
    assert (gated.name, gated.requires, gated.provides, gated.roles) == (
        "probe",
        ("a",),
        ("b",),
        ("actor",),
    )
    for step in range(1, 6):
        gated.run(StepState(step=step, batch=Batch()), context())
    assert ran == [3, 4, 5]  # verl: the actor updates once critic_warmup <= step


def test_values_stage_asks_the_critic_for_the_model_inputs_only():
    ctx = context()
    state = StepState(step=1, batch=step_batch())
    ValuesStage().run(state, ctx)
    ((role, method, args, dispatch),) = ctx.workers.calls
    assert (role, method, dispatch) == ("critic", "compute_values", Dispatch.DP_SPLIT)
    assert sorted(args[0].tensors) == sorted(
        ["input_ids", "attention_mask", "position_ids", "responses", "response_mask"]
    )
    assert torch.equal(state.batch["values"], torch.full((2, RESPONSE), 0.25))


def test_update_critic_plans_with_the_critic_keys_and_averages_the_ranks():
    ctx = context(
        "critic.ppo_mini_batch_size=1",
        "critic.ppo_epochs=3",
        "critic.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.rollout.n=4",
    )
    state = StepState(step=2, batch=step_batch().repeat_interleave(4))  # 8 rows, 2 ranks
    UpdateCriticStage().run(state, ctx)
    ((role, method, (batch, plan), _),) = ctx.workers.calls
    assert (role, method) == ("critic", "update")
    assert "advantages" not in batch and {"values", "returns"} <= set(batch.tensors)
    # 1 prompt x n=4 = 4 rows per mini-batch, 2 per rank: 2 mini-batches of a 4-row shard, 3 epochs
    assert len(plan.epochs) == 3 and [len(rows) for rows in plan.epochs[0]] == [2, 2]
    assert state.metrics["critic/vf_loss"] == 2.0 and state.metrics["critic/grad_norm"] == 2.0
    assert state.metrics["critic/optimizer_steps"] == 6.0
    assert state.metrics["critic/values/mean"] == pytest.approx(0.5)


def test_value_metrics_by_hand():
    # real tokens: values [0.5, 0.0, 1.0], returns [1, 2, 0]
    # var(returns) = 1 (unbiased), returns - values = [0.5, 2, -1] -> var 2.25
    metrics = value_metrics(step_batch())
    assert metrics["critic/values/mean"] == pytest.approx(0.5)
    assert metrics["critic/values/max"] == 1.0 and metrics["critic/values/min"] == 0.0
    assert metrics["critic/vf_explained_var"] == pytest.approx(1 - 2.25 / (1 + 1e-5))
    values = np.array([0.5, 0.0, 1.0])
    returns = np.array([1.0, 2.0, 0.0])
    expected = 1 - np.var(returns - values, ddof=1) / (np.var(returns, ddof=1) + 1e-5)
    assert metrics["critic/vf_explained_var"] == pytest.approx(expected)
