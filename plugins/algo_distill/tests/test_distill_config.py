"""``polyrl validate`` on distillation configs (one line per problem, no Ray), the step it
builds, where the teacher is placed, and the two stages run on scripted workers."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from polyrl.api import Batch, assemble
from polyrl.api.testing import AlgorithmConformance, ScriptedRoles, run_stage
from polyrl.config.loader import load_config
from polyrl.config.validate import validate_config
from polyrl_algo_distill.stages import DistillAdvantageStage, TeacherLogProbStage

BASE = ("recipe=tiny", "algorithm.name=distill")
TEACHER = "distill.teacher.model_path=builtin:tiny@1"
TWO = (
    "distill.teachers=[{model_path: 'builtin:tiny@1', data_source: math}, "
    "{model_path: 'builtin:tiny@2', weight: 2}]"
)


def problems(*overrides: str) -> list[str]:
    return validate_config(load_config([*BASE, *overrides]))


def one_problem(*overrides: str) -> str:
    found = problems(*overrides)
    assert len(found) == 1, found
    return found[0]


class TestDistillConformance(AlgorithmConformance):
    plugin_name = "distill"

    def overrides(self) -> list[str]:
        return [*BASE, TEACHER, "distill.task_reward_weight=0.5"]


def test_one_teacher_and_several_teachers_are_valid():
    assert problems(TEACHER) == []
    assert problems(TWO) == []
    cfg = load_config([*BASE, TWO])
    first, second = cfg.distill.teachers
    assert (first.weight, first.data_source, first.dtype) == (1.0, "math", "float32")
    assert (second.weight, second.data_source) == (2.0, None)


@pytest.mark.parametrize(
    ("override", "line"),
    [
        ("distill.coef=0", "distill.coef=0.0 is out of range: it must be > 0, e.g. 1.0"),
        ("distill.coef=-1", "distill.coef=-1.0 is out of range: it must be > 0, e.g. 1.0"),
        (
            "distill.task_reward_weight=-0.5",
            "distill.task_reward_weight=-0.5 is out of range: it must be >= 0 (0: the "
            "teacher's signal alone)",
        ),
        (
            "distill.teacher.weight=-1",
            "distill.teacher.weight=-1.0 is out of range: it must be >= 0",
        ),
        (
            "distill.teacher.dtype=int8",
            "distill.teacher.dtype='int8' is not a dtype the engines know; use bfloat16, "
            "float16 or float32",
        ),
        ("distill.signal=logits", "distill.signal='logits' is not one of advantage"),
        ("distill.signal=loss", "distill.signal=loss is not available"),
    ],
)
def test_out_of_range_settings_are_one_line(override: str, line: str):
    assert one_problem(TEACHER, override).startswith(line)


def test_a_teacher_is_required():
    assert one_problem() == (
        "distill.teacher.model_path is not set: distillation needs a teacher; set "
        "distill.teacher.model_path=<model folder, hub id or builtin:tiny>"
    )


def test_a_missing_teacher_folder_is_one_line(tmp_path):
    missing = tmp_path / "nowhere"
    assert one_problem(f"distill.teacher.model_path={missing}") == (
        f"distill.teacher.model_path={str(missing)!r} does not exist: give an existing model folder"
    )


def test_teachers_and_teacher_together_are_refused():
    assert one_problem(TEACHER, TWO).startswith(
        "distill.teacher.model_path and distill.teachers are both set"
    )


def test_several_teachers_need_a_positive_weight_a_path_and_distinct_sources():
    line = one_problem("distill.teachers=[{model_path: 'builtin:tiny@1', weight: 0}]")
    assert line.startswith("distill.teachers: every weight is 0")
    line = one_problem("distill.teachers=[{model_path: 'builtin:tiny@1'}, {weight: 1}]")
    assert line.startswith("distill.teachers[1].model_path is not set")
    line = one_problem(
        "distill.teachers=[{model_path: 'builtin:tiny@1', data_source: a}, "
        "{model_path: 'builtin:tiny@2', data_source: a}]"
    )
    assert line.startswith("distill.teachers: data_source ['a'] is named by several teachers")


def test_distill_keys_with_another_algorithm_are_refused():
    found = validate_config(load_config(["recipe=tiny", TEACHER]))
    assert len(found) == 1 and "distill" in found[0], found


def test_the_step_has_the_teacher_before_the_advantage():
    plan = assemble(load_config([*BASE, TEACHER]))
    names = plan.pipeline.names()
    assert names.index("old_log_prob") < names.index("teacher") == names.index("adv") - 1
    assert plan.pipeline["adv"].requires == ("old_log_probs", "teacher_log_probs", "response_mask")
    # with a task reward, the estimator's keys join the advantage stage's
    plan = assemble(load_config([*BASE, TEACHER, "distill.task_reward_weight=1"]))
    assert set(plan.pipeline["adv"].requires) >= {"token_level_rewards", "uid"}
    # routing by data source sends the rows' data_source to the teacher
    assert "data_source" not in plan.pipeline["teacher"].requires
    assert "data_source" in assemble(load_config([*BASE, TWO])).pipeline["teacher"].requires


def test_the_teacher_sits_with_the_actor_unless_given_its_own_pool():
    plan = assemble(load_config([*BASE, TEACHER]))
    assert plan.pools["global"] == (2, ("rollout", "actor", "ref", "teacher"))
    plan = assemble(
        load_config(
            [*BASE, TEACHER, "trainer.role_pools.teacher=tp", "trainer.resource_pools.tp=1"]
        )
    )
    assert plan.pools["global"] == (2, ("rollout", "actor", "ref"))
    assert plan.pools["tp"] == (1, ("teacher",))


def _batch() -> Batch:
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    ids = torch.ones(2, 5, dtype=torch.long)
    return Batch(
        {
            "input_ids": ids,
            "attention_mask": torch.ones_like(ids),
            "position_ids": torch.arange(5).expand(2, 5),
            "responses": ids[:, 2:],
            "response_mask": mask,
            "old_log_probs": torch.tensor([[-1.0, -2.0, -0.5], [-0.25, -3.0, -7.0]]),
            "token_level_rewards": torch.tensor([[0.0, 0.0, 1.0], [0.0, 0.0, 0.0]]),
        },
        {"uid": np.array(["p", "p"], dtype=object), "data_source": np.array(["a", "b"])},
    )


def test_the_stages_give_the_hand_derived_advantages():
    teacher = torch.tensor([[-0.5, -3.0, -0.5], [-1.25, -1.0, -9.0]])
    roles = ScriptedRoles(
        {"teacher.compute_log_prob": lambda b: Batch({"teacher_log_probs": teacher})}
    )
    cfg = [*BASE, TEACHER, "distill.coef=2", "distill.task_reward_weight=0.5"]
    state = run_stage(TeacherLogProbStage(load_config(cfg)), _batch(), cfg=cfg, roles=roles)
    assert roles.calls[0].role == "teacher" and "data_source" not in roles.calls[0].args[0]
    state = run_stage(DistillAdvantageStage(load_config(cfg)), state.batch, cfg=cfg)
    # k: [[-0.5, 1, 0], [1, -2, pad]]; GRPO on one group of scores 1 and 0: (x - 0.5) / std,
    # std (unbiased) of {1, 0} = 0.7071 -> +0.7071 and -0.7071 per token
    g = 0.5 / (0.5**0.5 + 1e-6)
    expected = torch.tensor(
        [[1.0 + 0.5 * g, -2.0 + 0.5 * g, 0.5 * g], [-2.0 - 0.5 * g, 4.0 - 0.5 * g, 0.0]]
    )
    assert torch.allclose(state.batch["advantages"], expected, atol=1e-5)
    assert torch.equal(state.batch["returns"], state.batch["advantages"])
    assert state.metrics["distill/reverse_kl/mean"] == pytest.approx(-0.1)
