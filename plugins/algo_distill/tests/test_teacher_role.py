"""The teacher role on the real FSDP2 engine, in this process (one rank): it loads the
teacher's own model and dtype, frozen; its log-probs are the teacher model's; several teachers
are mixed and routed per row; a teacher with another vocabulary is refused."""

from __future__ import annotations

import shutil
from typing import Any

import numpy as np
import pytest
import torch

from polyrl.api import Batch, ConfigError, RoleContext, assemble, resolve_model_path
from polyrl.api.testing import rollout_contract
from polyrl.config.loader import load_config
from polyrl_algo_distill.teacher import TeacherRole

PROMPT, RESPONSE, ROWS = 5, 4, 3


@pytest.fixture(autouse=True)
def _own_process_group() -> Any:
    """The engine makes a 1-rank group when none exists; destroy it after each test."""
    import torch.distributed as dist

    torch.set_num_threads(1)
    existed = dist.is_initialized()
    yield
    if not existed and dist.is_initialized():
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def student_path() -> str:
    return resolve_model_path("builtin:tiny")


def teacher_role(student_path: str, *overrides: str) -> TeacherRole:
    cfg = load_config(
        ["recipe=tiny", "algorithm.name=distill", "trainer.n_gpus_per_node=1", *overrides]
    )
    ctx = RoleContext(
        role="teacher",
        cfg=cfg,
        model_path=student_path,
        rank=0,
        world_size=1,
        device="cpu",
        plan=assemble(cfg, check=False).worker_plan(),
    )
    return TeacherRole(ctx)


def rollout_batch() -> Batch:
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 60, (ROWS, PROMPT + RESPONSE), generator=gen)
    attention = torch.ones_like(ids)
    attention[1, :2] = 0  # a shorter prompt
    attention[2, -2:] = 0  # a shorter response
    return Batch(
        {
            "input_ids": ids * attention,
            "attention_mask": attention,
            "position_ids": (attention.cumsum(-1) - 1).clamp(min=0),
            "responses": (ids * attention)[:, PROMPT:],
            "response_mask": attention[:, PROMPT:].float(),
        },
        {"data_source": np.array(["math", "chat", "math"], dtype=object)},
    )


def expected_log_probs(path: str, batch: Batch) -> torch.Tensor:
    model = rollout_contract.hf_causal_lm(path)
    return rollout_contract.teacher_forced_log_probs(model, batch) * batch["response_mask"]


def test_the_teacher_loads_its_own_frozen_model_in_its_dtype(student_path):
    role = teacher_role(
        student_path, "distill.teacher.model_path=builtin:tiny@1", "distill.teacher.dtype=bfloat16"
    )
    (engine,) = role.engines
    teacher_path = resolve_model_path("builtin:tiny@1")
    assert teacher_path != student_path and engine.ctx.model_path == teacher_path
    assert engine.ctx.trainable is False and engine.ctx.model.dtype == "bfloat16"
    assert engine.settings.dtype == "bfloat16"


def test_its_log_probs_are_the_teacher_models_not_the_students(student_path):
    role = teacher_role(student_path, "distill.teacher.model_path=builtin:tiny@1")
    batch = rollout_batch()
    got = role.compute_log_prob(batch)["teacher_log_probs"] * batch["response_mask"]
    teacher = expected_log_probs(resolve_model_path("builtin:tiny@1"), batch)
    assert torch.allclose(got, teacher, atol=1e-4)
    assert not torch.allclose(got, expected_log_probs(student_path, batch), atol=1e-2)


def test_several_teachers_are_routed_by_data_source_and_mixed_by_weight(student_path):
    role = teacher_role(
        student_path,
        "distill.teachers=[{model_path: 'builtin:tiny@1', weight: 1, data_source: math}, "
        "{model_path: 'builtin:tiny@2', weight: 3}]",
    )
    batch = rollout_batch()
    got = role.compute_log_prob(batch)["teacher_log_probs"] * batch["response_mask"]
    one = expected_log_probs(resolve_model_path("builtin:tiny@1"), batch)
    two = expected_log_probs(resolve_model_path("builtin:tiny@2"), batch)
    assert torch.allclose(got[[0, 2]], one[[0, 2]], atol=1e-4)  # the math rows: teacher 1
    assert torch.allclose(got[1], 0.25 * one[1] + 0.75 * two[1], atol=1e-4)  # the mix


def test_a_teacher_with_another_vocabulary_is_refused(student_path, tmp_path):
    from transformers import AutoTokenizer

    other = tmp_path / "other_vocab"
    shutil.copytree(resolve_model_path("builtin:tiny@1"), other)
    tokenizer = AutoTokenizer.from_pretrained(other)
    tokenizer.add_tokens(["<|tool|>"])
    tokenizer.save_pretrained(other)
    with pytest.raises(ConfigError) as err:
        teacher_role(student_path, f"distill.teacher.model_path={other}")
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(
        f"distill.teacher.model_path={str(other)!r} has a tokenizer vocabulary other than the "
        f"student's"
    )
