"""The distillation signal: the per-token reverse KL to the teacher on the student's samples.

For a response token ``t`` the student sampled, with the student's log-prob ``s_t`` (the
actor's, before the update) and the teacher's ``q_t``::

    k_t = s_t - q_t                                  (k1, the sampled reverse-KL term)
    A_t = -coef * k_t + task_reward_weight * G_t     (G: the task's advantage, GRPO by default)

``A`` is the advantage of the policy-gradient update, token by token with no discount: the
expected update is then the gradient of ``KL(student || teacher)`` over the student's own
distribution (on-policy distillation, the reverse KL taken as a per-token reward). Padding is
0 in every output.

Several teachers: a row whose ``data_source`` equals a teacher's takes that teacher's
log-probs; every other row the weighted mean of all teachers' log-probs (the log of their
weighted geometric mean: a token counts as likely when the teachers agree that it is).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from polyrl.api import masked_mean


def reverse_kl(
    student_log_probs: torch.Tensor, teacher_log_probs: torch.Tensor, response_mask: torch.Tensor
) -> torch.Tensor:
    """``k_t`` ``[B, R]`` above, 0 on padding."""
    mask = response_mask.to(torch.float32)
    return (student_log_probs.float() - teacher_log_probs.float()) * mask


def distill_advantages(
    student_log_probs: torch.Tensor,
    teacher_log_probs: torch.Tensor,
    response_mask: torch.Tensor,
    coef: float,
    task_advantages: torch.Tensor | None = None,
    task_reward_weight: float = 0.0,
) -> torch.Tensor:
    """``A_t`` ``[B, R]`` above; ``task_advantages`` is read only when its weight is not 0."""
    advantages = -coef * reverse_kl(student_log_probs, teacher_log_probs, response_mask)
    if task_reward_weight:
        if task_advantages is None:
            raise ValueError("task_reward_weight is not 0, but no task advantages were given")
        advantages = advantages + task_reward_weight * task_advantages.float()
    return advantages * response_mask.to(torch.float32)


def mix_teacher_log_probs(
    per_teacher: Sequence[torch.Tensor],
    weights: Sequence[float],
    data_sources: Sequence[str | None],
    row_sources: Sequence[Any] | np.ndarray | None,
) -> torch.Tensor:
    """The teacher log-probs ``[B, R]`` of each row from every teacher's ``[B, R]``: the
    teacher whose ``data_source`` is the row's, else the weighted mean over all teachers
    (``weights`` need not sum to 1; their sum must be > 0). ``row_sources`` may be None when
    no teacher names a data source."""
    stacked = torch.stack([lp.float() for lp in per_teacher])  # [N, B, R]
    w = torch.tensor([float(x) for x in weights], dtype=torch.float32)
    if float(w.sum()) <= 0:
        raise ValueError(f"teacher weights {list(weights)} sum to 0; give one a weight > 0")
    mixed = torch.einsum("n,nbr->br", w / w.sum(), stacked)
    routed = [i for i, source in enumerate(data_sources) if source is not None]
    if not routed:
        return mixed
    if row_sources is None:
        raise ValueError("teachers name data sources, but the batch has no data_source")
    rows = np.asarray(row_sources, dtype=object)
    for i in routed:
        match = torch.from_numpy(rows == data_sources[i]).to(mixed.device)
        mixed = torch.where(match.unsqueeze(-1), stacked[i], mixed)
    return mixed


def signal_metrics(
    student_log_probs: torch.Tensor, teacher_log_probs: torch.Tensor, response_mask: torch.Tensor
) -> dict[str, float]:
    """``distill/reverse_kl/mean`` (per real token), ``distill/reverse_kl/seq_sum_mean`` (the
    per-response sum, the sampled estimate of each response's KL) and the two log-prob means."""
    mask = response_mask.to(torch.float32)
    k = reverse_kl(student_log_probs, teacher_log_probs, response_mask)
    return {
        "distill/reverse_kl/mean": float(masked_mean(k, mask)),
        "distill/reverse_kl/seq_sum_mean": float(k.sum(-1).mean()),
        "distill/student_log_prob/mean": float(masked_mean(student_log_probs.float(), mask)),
        "distill/teacher_log_prob/mean": float(masked_mean(teacher_log_probs.float(), mask)),
    }
