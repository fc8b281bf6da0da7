"""Offline DPO's step, from a batch of preference pairs::

    ref -> update_actor

``ref``: core's stage, the reference's log-probs of both responses of every pair.
``update_actor``: core's actor update with the preference loss (``loss_mode=dpo`` or ``ipo``):
one optimizer step on the whole batch (``ppo_mini_batch_size = data.train_batch_size``), rows in
order, so pairs stay whole through the data-parallel split and the micro-batches. The loss names
its preference metrics as TRL does (``rewards/*``, ``logps/*``): a policy loss's metric that has
its own group is logged under it, not under ``actor/``. No rollout: the responses come from the
data.
"""

from __future__ import annotations

from typing import Any

from polyrl.api import RefLogProbStage, StepPipeline, UpdateActorStage
from polyrl_algo_dpo.preference import PREFERENCE_BATCH_KEYS


def dpo_pipeline(cfg: Any) -> StepPipeline:
    """The step above, from the batches of :func:`polyrl_algo_dpo.data.preference_data`."""
    return StepPipeline(
        [RefLogProbStage(), UpdateActorStage(cfg)], initial_keys=PREFERENCE_BATCH_KEYS
    )
