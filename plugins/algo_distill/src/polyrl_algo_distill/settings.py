"""The ``distill`` config group (mounted into the schema by :mod:`polyrl.config.sections`).
Light on purpose (no torch): every composed config imports it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

SIGNALS = ("advantage",)


@dataclass
class TeacherSettings:
    """One frozen teacher. ``model_path``: any form ``actor_rollout_ref.model.path`` accepts
    (a folder, a ``.gguf`` file, a hub id, ``builtin:tiny``); its tokenizer must be the
    student's. ``dtype``: the teacher engine's dtype (default: the student's).
    ``weight`` and ``data_source`` matter only in ``distill.teachers``: a row whose
    ``data_source`` equals a teacher's is scored by that teacher alone; every other row by the
    weighted mean of all teachers' log-probs (weight 0: a teacher for its data source only)."""

    # the teacher model: a folder, .gguf file, hub id or builtin:tiny (required)
    model_path: Any = None
    # the teacher engine's dtype: bfloat16, float16 or float32 (default: the student's)
    dtype: str = "${actor_rollout_ref.model.dtype}"
    # in distill.teachers: its share of the mix of rows no teacher's data_source names (>= 0)
    weight: float = 1.0
    # in distill.teachers: rows of this data_source are scored by this teacher alone
    data_source: Any = None


@dataclass
class DistillSettings:
    """On-policy distillation. The advantage of response token ``t`` is
    ``-coef * (log p_student(t) - log p_teacher(t))``, plus ``task_reward_weight`` times the
    task reward's advantage from ``algorithm.adv_estimator`` (GRPO's group-normalised one by
    default; 0: the teacher alone). ``signal``: where the reverse KL enters; ``advantage``
    (the per-token reward of on-policy distillation) is the one mode. ``teacher`` is the single
    teacher; ``teachers`` a list of several (then ``teacher.model_path`` stays null)."""

    # the single teacher
    teacher: TeacherSettings = field(default_factory=TeacherSettings)
    # several teachers, a list of {model_path, weight, data_source, dtype}; instead of teacher
    teachers: list[TeacherSettings] = field(default_factory=list)
    # the per-token advantage is -coef * (log p_student - log p_teacher) (> 0)
    coef: float = 1.0
    # where the reverse KL enters: advantage (the per-token reward of on-policy distillation)
    signal: str = "advantage"
    # weight of the task reward's advantage (algorithm.adv_estimator) added to it (>= 0)
    task_reward_weight: float = 0.0


def configured_teachers(distill: Any) -> list[Any]:
    """The teacher nodes a run uses: ``distill.teachers`` when it lists any, else
    ``[distill.teacher]``."""
    teachers = list(distill.teachers or ())
    return teachers if teachers else [distill.teacher]


CONFIG_SECTIONS = {"distill": DistillSettings}
