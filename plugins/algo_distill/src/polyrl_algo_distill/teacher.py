"""The teacher worker role: frozen models on the actor's training engine, scoring the student's
samples.

Each teacher of ``distill`` gets its own engine, built like the reference's (the actor's engine
node with ``actor_rollout_ref.ref`` over it, not trainable: no optimizer, no gradients) but
loading the teacher's model (``model_path``) in the teacher's ``dtype``; the other model
settings are the student's, with LoRA off. The teacher reads the student's token ids as they
are, so a teacher whose tokenizer has another vocabulary is refused when the role is built
(a folder without a tokenizer is taken to share the student's).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from omegaconf import OmegaConf

from polyrl.api import (
    Batch,
    ConfigError,
    DataParallelRank,
    PluginKind,
    Role,
    RoleContext,
    TrainingEngine,
    plain_node,
    resolve_model_path,
    training_engine_context,
)
from polyrl_algo_distill.kl_signal import mix_teacher_log_probs
from polyrl_algo_distill.settings import configured_teachers
from polyrl_algo_distill.stages import TEACHER_LOG_PROBS


def teacher_key(cfg: Any, index: int) -> str:
    """The config key of teacher ``index``, for messages."""
    return "distill.teacher" if not cfg.distill.teachers else f"distill.teachers[{index}]"


def check_same_vocabulary(teacher_path: str, student_tokenizer: str, key: str) -> None:
    """Refuse a teacher whose tokenizer maps tokens to other ids than the student's."""
    from transformers import AutoTokenizer

    try:
        teacher = AutoTokenizer.from_pretrained(teacher_path)
    except (OSError, ValueError):
        return
    if teacher.get_vocab() != AutoTokenizer.from_pretrained(student_tokenizer).get_vocab():
        raise ConfigError(
            f"{key}.model_path={teacher_path!r} has a tokenizer vocabulary other than the "
            f"student's ({student_tokenizer}); the teacher scores the student's token ids as they "
            f"are, so pick a teacher of the student's model family (same tokenizer)"
        )


class TeacherRole(Role):
    """``compute_log_prob``: the teachers' log-probs of the batch's responses, mixed per row."""

    def __init__(self, ctx: RoleContext) -> None:
        super().__init__(ctx)
        cfg = ctx.cfg
        arr = cfg.actor_rollout_ref
        self.temperature = float(arr.rollout.temperature)
        teachers = configured_teachers(cfg.distill)
        self.weights = [float(t.weight) for t in teachers]
        self.data_sources = [
            None if t.data_source is None else str(t.data_source) for t in teachers
        ]
        student_tokenizer = (
            resolve_model_path(str(arr.model.tokenizer_path))
            if arr.model.tokenizer_path
            else ctx.model_path
        )
        engine_cls = ctx.plan.load(PluginKind.TRAINING_ENGINE, arr.actor.strategy)
        engine_cfg = OmegaConf.merge(plain_node(arr.actor), plain_node(arr.ref))
        self.engines: list[TrainingEngine] = []
        for index, teacher in enumerate(teachers):
            path = resolve_model_path(str(teacher.model_path))
            check_same_vocabulary(path, student_tokenizer, teacher_key(cfg, index))
            model = OmegaConf.merge(
                plain_node(arr.model),
                {"path": path, "dtype": str(teacher.dtype), "tokenizer_path": None, "lora_rank": 0},
            )
            engine_ctx = training_engine_context(ctx, engine_cfg, trainable=False)
            self.engines.append(engine_cls(replace(engine_ctx, model_path=path, model=model)))

    def data_parallel_rank(self) -> DataParallelRank:
        return self.engines[0].data_parallel_rank()

    def compute_log_prob(self, batch: Batch) -> Batch:
        """``teacher_log_probs`` ``[B, R]`` of the batch's responses (see
        :func:`~polyrl_algo_distill.kl_signal.mix_teacher_log_probs` for several teachers)."""
        per_teacher = [
            engine.compute_log_prob(batch, temperature=self.temperature)[0]
            for engine in self.engines
        ]
        if len(per_teacher) == 1:
            return Batch({TEACHER_LOG_PROBS: per_teacher[0]})
        mixed = mix_teacher_log_probs(
            per_teacher, self.weights, self.data_sources, batch.get("data_source")
        )
        return Batch({TEACHER_LOG_PROBS: mixed})
