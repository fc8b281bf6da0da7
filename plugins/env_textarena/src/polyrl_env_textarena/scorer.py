"""The ``textarena`` data source's scorer, which refuses to score.

Rows of ``data_source: textarena`` are scored by their game: the environment gives every
episode TextArena's reward, so the reward provider never sees them. The loader keeps only rows
whose data source some scorer declares (a row no scorer knows cannot teach), so the source is
declared here; and should the rows reach the reward provider anyway, a run without the textarena
environment, each row fails loudly (``reward_model.on_error``) instead of scoring a silent 0.
"""

from __future__ import annotations

from typing import Any

from polyrl.api import RewardError


def refuse(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: Any, settings: Any
) -> float:
    raise RewardError(
        f"rows of data_source {data_source!r} are scored by their TextArena game: train them "
        "with actor_rollout_ref.rollout.multi_turn.enable=true "
        "actor_rollout_ref.rollout.multi_turn.environment=textarena"
    )
