"""``trainer.async_mode`` and ``actor_rollout_ref.actor.tis_imp_ratio_cap`` are checked before any
worker starts: one line per problem, saying how to fix it."""

from __future__ import annotations

import pytest

from polyrl.config import load_config
from polyrl.config.validate import summarize, validate_config

SPLIT = (
    "actor_rollout_ref.hybrid_engine=false",
    "actor_rollout_ref.rollout.n_gpus_per_node=1",
    "trainer.n_gpus_per_node=1",
)
ONE_STEP_OFF = ("trainer.async_mode=one_step_off", "actor_rollout_ref.actor.tis_imp_ratio_cap=2")


def problems(*overrides: str, recipe: str = "tiny") -> list[str]:
    return validate_config(load_config([f"recipe={recipe}", *overrides]))


def one_problem(*overrides: str, recipe: str = "tiny") -> str:
    found = problems(*overrides, recipe=recipe)
    assert len(found) == 1, found
    assert "\n" not in found[0]
    return found[0]


def test_one_step_off_with_split_placement_and_tis_is_valid() -> None:
    assert problems(*SPLIT, *ONE_STEP_OFF) == []
    assert problems("actor_rollout_ref.actor.tis_imp_ratio_cap=3.5") == []  # TIS alone, in sync


def test_colocated_rollout_cannot_overlap() -> None:
    line = one_problem(*ONE_STEP_OFF)
    assert "needs the rollout on workers of its own" in line
    assert "actor_rollout_ref.hybrid_engine=false" in line


def test_one_step_off_needs_the_tis_correction() -> None:
    line = one_problem(*SPLIT, "trainer.async_mode=one_step_off")
    assert "set actor_rollout_ref.actor.tis_imp_ratio_cap=2.0" in line


@pytest.mark.parametrize("cap", ["0", "0.5", "-2"])
def test_the_cap_is_off_or_at_least_one(cap: str) -> None:
    line = one_problem(f"actor_rollout_ref.actor.tis_imp_ratio_cap={cap}")
    assert line.startswith(
        f"actor_rollout_ref.actor.tis_imp_ratio_cap={float(cap)} is out of range"
    )


def test_unknown_mode_suggests_the_closest() -> None:
    line = one_problem("trainer.async_mode=one_step_of")
    assert "unknown schedule 'one_step_of'" in line, line
    assert "one_step_off (polyrl-schedule-offpolicy), sync (polyrl)" in line
    assert "Did you mean 'one_step_off'?" in line


def test_a_step_that_does_not_generate_is_refused() -> None:
    found = problems(*SPLIT, *ONE_STEP_OFF, recipe="dpo")
    assert any(
        p.startswith("trainer.async_mode=one_step_off: the selected algorithm's step does not "
                     "generate") for p in found
    ), found  # fmt: skip
    assert any("tis_imp_ratio_cap=2: no stage" in p for p in found), found


def test_validate_says_which_stages_run_ahead() -> None:
    sync = summarize(load_config(["recipe=tiny"]))
    assert "schedule: sync (generate, train, sync the weights, every step)" in sync
    ahead = summarize(load_config(["recipe=tiny", *SPLIT, *ONE_STEP_OFF]))
    assert (
        "schedule: one_step_off (gen, reward run one step ahead of old_log_prob -> ref -> adv -> "
        "update_actor; TIS cap 2)" in ahead
    )
