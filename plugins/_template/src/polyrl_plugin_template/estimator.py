"""REINFORCE with a batch-mean baseline.

For response ``i`` with outcome score ``s_i`` (the sum of its token-level rewards), the advantage of
every one of its tokens is ``A_i = s_i - b_i``, where the baseline ``b_i`` is the mean score of the
batch (or, with ``leave_one_out``, the mean of the other ``B - 1`` scores, which keeps the gradient
estimate unbiased). With ``normalize`` the advantages are divided by the batch's score standard
deviation plus ``epsilon``. Unlike GRPO it needs no groups: it works with ``rollout.n=1``.

The returns equal the advantages (there is no critic to regress on them).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from polyrl.api import plugin_settings
from polyrl_plugin_template.settings import ReinforceBaselineSettings

if TYPE_CHECKING:
    from polyrl.api import Batch

SETTINGS_SECTION = "template_reinforce"


def reinforce_batch_baseline(batch: Batch, config: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Advantages and returns ``[B, T]`` (see the module docstring); zero on padding.

    Reads ``token_level_rewards`` and ``response_mask`` from ``batch`` (it ignores the group
    ids), and its settings from the section ``plugins.template_reinforce`` of the config that
    ``config`` (the ``algorithm`` node) belongs to.
    """
    settings = plugin_settings(config, SETTINGS_SECTION, ReinforceBaselineSettings)
    token_level_rewards = batch["token_level_rewards"]
    mask = batch["response_mask"].to(token_level_rewards.dtype)
    scores = (token_level_rewards * mask).sum(dim=-1)
    count = scores.shape[0]
    if settings.leave_one_out and count > 1:
        baseline = (scores.sum() - scores) / (count - 1)
    else:
        baseline = scores.mean().expand_as(scores)
    advantages = scores - baseline
    if settings.normalize and count > 1:
        advantages = advantages / (scores.std() + settings.epsilon)
    advantages = advantages.unsqueeze(-1) * mask
    return advantages, advantages.clone()
