"""The training step: a pipeline of stages that algorithm plugins build and edit.

Start here when writing an algorithm plugin: :class:`Stage` (declare ``requires``,
``provides``, ``roles``; implement ``run``), :class:`StepPipeline` (``insert_after``,
``insert_before``, ``replace``, ``remove``), :func:`policy_gradient_pipeline` (the standard step
to start from) and :class:`StepContext` (what ``run`` gets).
"""

from polyrl.step.context import StepContext
from polyrl.step.pipeline import PROMPT_BATCH_KEYS, Stage, StepPipeline, StepState
from polyrl.step.policy_gradient import policy_gradient_pipeline

__all__ = [
    "PROMPT_BATCH_KEYS",
    "Stage",
    "StepContext",
    "StepPipeline",
    "StepState",
    "policy_gradient_pipeline",
]
