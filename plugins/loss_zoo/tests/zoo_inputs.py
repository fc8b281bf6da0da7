"""Inputs the loss tests share: the actor node with this package's sections mounted, and a
small hand-made batch."""

from __future__ import annotations

from typing import Any

import torch
from omegaconf import OmegaConf

from polyrl.api import Batch
from polyrl.api.testing import schema_config

torch.set_num_threads(1)


def actor_node(**overrides: Any) -> Any:
    """The ``actor_rollout_ref.actor`` node a run hands a loss, with ``overrides`` merged."""
    node = schema_config().actor_rollout_ref.actor
    return OmegaConf.merge(node, overrides) if overrides else node


# Three responses of 3, 2 and 1 tokens; each token's old and new probability chosen by hand.
OLD_P = [[0.5, 0.2, 0.9], [0.3, 0.6, 0.0], [0.05, 0.0, 0.0]]
NEW_P = [[0.65, 0.1, 0.95], [0.45, 0.5, 0.0], [0.3, 0.0, 0.0]]
ADV = [1.5, -0.8, 0.7]
LENGTHS = [3, 2, 1]


def batch_and_log_prob() -> tuple[Batch, torch.Tensor]:
    """The hand-made batch (padding holds log-prob 0) and the new log-probs, a grad leaf."""
    mask = torch.tensor([[1.0 if t < n else 0.0 for t in range(3)] for n in LENGTHS])
    old = torch.log(torch.tensor(OLD_P).clamp_min(1e-30)) * mask
    new = (torch.log(torch.tensor(NEW_P).clamp_min(1e-30)) * mask).requires_grad_(True)
    adv = torch.tensor(ADV).unsqueeze(-1) * mask
    return Batch({"old_log_probs": old, "advantages": adv, "response_mask": mask}), new


def tokens() -> list[tuple[int, int]]:
    """(row, position) of every response token, row-major."""
    return [(i, t) for i, n in enumerate(LENGTHS) for t in range(n)]
