"""Offline DPO's step, from a batch of preference pairs::

    ref -> update_actor

``ref``: core's stage, the reference's log-probs of both responses of every pair.
``update_actor``: core's actor update with the preference loss (``loss_mode=dpo`` or ``ipo``):
one optimizer step on the whole batch (``ppo_mini_batch_size = data.train_batch_size``), rows in
order, so pairs stay whole through the data-parallel split and the micro-batches; its preference
metrics are logged under TRL's names. No rollout: the responses come from the data.
"""

from __future__ import annotations

from typing import Any

from polyrl.api import RefLogProbStage, StepContext, StepPipeline, StepState, UpdateActorStage
from polyrl_algo_dpo.preference import PREFERENCE_BATCH_KEYS

#: The loss's metrics the actor reports as ``actor/<name>``, logged as TRL names them.
TRL_METRIC_PREFIXES = ("actor/rewards/", "actor/logps/")


class PreferenceUpdateStage(UpdateActorStage):
    """Core's actor update; ``actor/rewards/*`` and ``actor/logps/*`` become ``rewards/*`` and
    ``logps/*`` (TRL's names). ``actor/pg_loss`` is the preference loss."""

    def run(self, state: StepState, ctx: StepContext) -> None:
        super().run(state, ctx)
        for name in [n for n in state.metrics if n.startswith(TRL_METRIC_PREFIXES)]:
            state.metrics[name.removeprefix("actor/")] = state.metrics.pop(name)


def dpo_pipeline(cfg: Any) -> StepPipeline:
    """The step above, from the batches of :func:`polyrl_algo_dpo.data.preference_data`."""
    return StepPipeline(
        [RefLogProbStage(), PreferenceUpdateStage(cfg)], initial_keys=PREFERENCE_BATCH_KEYS
    )
