"""The stage harness of polyrl.testing: a stage run on one batch without Ray, its calls scripted,
its declared contract checked."""

from __future__ import annotations

import math

import pytest
import torch

from polyrl.batch import Batch
from polyrl.step import Stage
from polyrl.step.stages import MODEL_INPUT_KEYS, AdvantageStage, OldLogProbStage
from polyrl.testing.stages import ScriptedRoles, run_stage


def model_inputs(rows: int = 2, width: int = 3) -> Batch:
    batch = Batch({key: torch.ones(rows, width, dtype=torch.long) for key in MODEL_INPUT_KEYS})
    batch["response_mask"] = torch.ones(rows, width)
    return batch


def test_old_log_probs_come_from_the_scripted_actor_with_the_rollout_gap() -> None:
    batch = model_inputs()
    batch["rollout_log_probs"] = torch.full((2, 3), math.log(0.5))
    roles = ScriptedRoles(
        {
            "actor.compute_log_prob": lambda b: Batch(
                {"log_probs": torch.full((2, 3), math.log(0.25))}
            )
        }
    )
    state = run_stage(OldLogProbStage(needed_before_update=True), batch, roles=roles)
    assert torch.allclose(state.batch["old_log_probs"], torch.full((2, 3), math.log(0.25)))
    # |0.5 - 0.25| on every token
    assert state.metrics["training/rollout_probs_diff_max"] == pytest.approx(0.25)
    (call,) = roles.calls
    assert (call.role, call.method) == ("actor", "compute_log_prob")
    assert sorted(call.args[0].tensors) == sorted(MODEL_INPUT_KEYS)


def test_sum_pi_squared_comes_with_the_old_log_probs_whatever_the_plan() -> None:
    """With actor.calculate_sum_pi_squared the stage provides sum_pi_squared (declared, so the
    harness checks it is written) and runs its forward pass even when nothing else would."""
    squares = torch.full((2, 3), 0.3)
    roles = ScriptedRoles(
        {
            "actor.compute_log_prob": lambda b: Batch(
                {"log_probs": torch.zeros(2, 3), "sum_pi_squared": squares}
            )
        }
    )
    stage = OldLogProbStage(sum_pi_squared=True)
    stage.link([])  # no later stage reads old_log_probs
    assert stage.provides == ("old_log_probs", "sum_pi_squared")
    state = run_stage(stage, model_inputs(), roles=roles)
    assert torch.equal(state.batch["sum_pi_squared"], squares)
    assert OldLogProbStage().provides == ("old_log_probs",)


def test_the_stage_is_bound_to_the_estimator_the_config_selects() -> None:
    batch = Batch(
        {
            "token_level_rewards": torch.tensor([[0.0, 1.0], [0.0, 0.0]]),
            "response_mask": torch.ones(2, 2),
        },
        non_tensors={"uid": ["a", "a"]},
    )
    state = run_stage(AdvantageStage(), batch, cfg=["recipe=tiny"])
    # GRPO, one group of scores 1 and 0: (1 - 0.5) / (std 0.7071 + 1e-6) on every token of row 0
    expected = 0.5 / (math.sqrt(0.5) + 1e-6)
    assert torch.allclose(state.batch["advantages"][0], torch.full((2,), expected), atol=1e-5)
    assert torch.allclose(state.batch["advantages"][1], torch.full((2,), -expected), atol=1e-5)


class Forgetful(Stage):
    name = "forgetful"
    requires = ("response_mask",)
    provides = ("bonus",)

    def run(self, state, ctx) -> None:  # declares "bonus" and never writes it
        state.metrics["ran"] = 1.0


def test_a_declared_key_the_stage_does_not_write_fails_in_the_harness() -> None:
    with pytest.raises(AssertionError, match=r"declares it provides \['bonus'\]"):
        run_stage(Forgetful(), model_inputs())
    with pytest.raises(AssertionError, match=r"requires \['response_mask'\]"):
        run_stage(Forgetful(), Batch({"x": torch.zeros(1)}))


def test_an_unscripted_call_is_named() -> None:
    with pytest.raises(AssertionError, match=r"called actor\.compute_log_prob"):
        run_stage(OldLogProbStage(needed_before_update=True), model_inputs())
