"""GDPO's keys on ``algorithm`` (verl's names and defaults), mounted into the schema by polyrl's
config composition. Light on purpose (no torch): every composed config imports it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class GdpoSettings:
    """``gdpo_reward_keys``: the per-sample values the reward returns beside its score (the keys
    of the dict a ``compute_score`` returns, e.g. ``[format_reward, accuracy_reward]``), one
    reward dimension each. ``gdpo_reward_weights``: their weights in the sum (null: 1 each)."""

    gdpo_reward_keys: Any = None
    gdpo_reward_weights: Any = None


CONFIG_SECTIONS = {"algorithm": GdpoSettings}
