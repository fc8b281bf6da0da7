"""The reward model's stage: every response scored by a sequence-classification model (worker
role ``reward_model``), combined with the rule-based score of the ``reward`` stage.

``reward_model.combine``: ``replace`` (verl's rule: with a reward model on, its score is the
reward) or ``sum`` (rule-based score + model score, e.g. a format check plus a learned quality
score). The score lands on each response's last token, as rule-based scores do. Shaping that a
stage between ``reward`` and this one applied to ``token_level_rewards`` (an overlong penalty) is
kept: the rewards move by exactly the change of the scores.

:func:`polyrl.step.policy_gradient_pipeline` inserts this stage right after ``reward`` when
``reward_model.enable`` is true.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from polyrl.errors import ConfigError
from polyrl.step.context import StepContext
from polyrl.step.pipeline import Stage, StepState
from polyrl.workers.dispatch import Dispatch

if TYPE_CHECKING:
    import torch

COMBINE_MODES = ("replace", "sum")
#: What the reward model reads: prompt + response rows as the rollout laid them out.
RM_INPUT_KEYS = ("input_ids", "attention_mask", "position_ids")


def check_reward_model_config(rm: Any) -> None:
    """Raise :class:`ConfigError` naming the key when the ``reward_model`` node cannot work."""
    path = rm.model.path
    if not path:
        raise ConfigError(
            "reward_model.enable=true needs reward_model.model.path: a folder (or hub id) of "
            "a sequence-classification reward model"
        )
    local = os.path.expanduser(str(path))
    if os.path.exists(local) and not os.path.isfile(os.path.join(local, "config.json")):
        raise ConfigError(
            f"reward_model.model.path={path!r} is not a Hugging Face model folder (no "
            f"config.json); point it at what save_pretrained wrote"
        )
    if rm.combine not in COMBINE_MODES:
        raise ConfigError(
            f"reward_model.combine={rm.combine!r}: use one of {', '.join(COMBINE_MODES)}"
        )
    if int(rm.micro_batch_size_per_gpu) < 1:
        raise ConfigError(
            f"reward_model.micro_batch_size_per_gpu={rm.micro_batch_size_per_gpu} must be >= 1"
        )


def on_last_token(values: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """``[rows, T]`` zeros with ``values[i]`` on row ``i``'s last response token."""
    import torch

    placed = torch.zeros(response_mask.shape, dtype=torch.float32)
    last = (response_mask.sum(-1).long() - 1).clamp(min=0)
    placed[torch.arange(len(values)), last] = values.float()
    return placed * response_mask


class RewardModelStage(Stage):
    """Adds ``rm_scores`` (the model's score on each response's last token) and folds it into
    ``token_level_scores`` and ``token_level_rewards`` per ``reward_model.combine``."""

    name = "reward_model"
    requires = (*RM_INPUT_KEYS, "response_mask", "token_level_scores", "token_level_rewards")
    provides = ("rm_scores", "token_level_scores", "token_level_rewards")
    roles = ("reward_model",)

    def __init__(self, cfg: Any) -> None:
        check_reward_model_config(cfg.reward_model)
        self.combine = str(cfg.reward_model.combine)

    def run(self, state: StepState, ctx: StepContext) -> None:
        batch = state.batch
        out = ctx.workers.call(
            "reward_model",
            "compute_rm_score",
            batch.select_keys(RM_INPUT_KEYS),
            dispatch=Dispatch.DP_SPLIT,
        )
        rm_scores = on_last_token(out["rm_scores"], batch["response_mask"])
        rule_scores = batch["token_level_scores"]
        scores = rm_scores if self.combine == "replace" else rule_scores + rm_scores
        batch["token_level_rewards"] = batch["token_level_rewards"] + (scores - rule_scores)
        batch["token_level_scores"] = scores
        batch["rm_scores"] = rm_scores
        per_response = out["rm_scores"]
        state.metrics["reward_model/score/mean"] = float(per_response.mean())
        state.metrics["reward_model/score/max"] = float(per_response.max())
        state.metrics["reward_model/score/min"] = float(per_response.min())
