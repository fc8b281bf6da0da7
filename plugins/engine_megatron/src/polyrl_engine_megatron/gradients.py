"""The Megatron engine's gradients after the last micro-batch: averaged over the data-parallel
ranks, and their global norm.

Why experts differ (expert parallelism): the ranks of an expert-parallel group are data-parallel
replicas of the dense weights, but each holds its own experts, and the all-to-all that brought
every replica's tokens to an expert brings their gradients back to it, so an expert's gradient
already sums the losses of its expert-parallel group. It is summed over the expert's other
copies (the expert-data-parallel group) and divided by the whole data-parallel size, as
megatron-core scales it: the same mean over every replica's loss as a dense weight's. In the
norm, each expert counts once: summed over the expert-parallel group, where every rank holds
different ones.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from polyrl_engine_megatron.convert import split_dim
from polyrl_engine_megatron.moe import is_expert


@dataclass(frozen=True)
class GradientGroups:
    """The process groups (None: a group of one) over which gradients are reduced.

    With context parallelism each rank's gradient is its tokens' share of its replica's
    gradient: ``data_parallel`` is then megatron-core's data-parallel group with the
    context-parallel ranks (the shares summed, the replicas with them), and the sum is divided
    by ``data_parallel_size``, the replicas alone."""

    data_parallel: Any = None
    data_parallel_size: int = 1
    expert_data_parallel: Any = None
    expert_data_parallel_size: int = 1
    expert_parallel: Any = None
    tensor_parallel: Any = None
    pipeline_parallel: Any = None
    context_parallel_size: int = 1

    @classmethod
    def from_parallel_state(cls) -> GradientGroups:
        """The groups of megatron-core's parallel state (initialised) for this rank: experts'
        copies are the ranks holding the same experts, TP x CP x DP / EP (expert tensor
        parallelism 1)."""
        from megatron.core import parallel_state as ps

        def group_of_many(size: int, group: Any) -> Any:
            return group if size > 1 else None

        return cls(
            data_parallel=ps.get_data_parallel_group(with_context_parallel=True),
            data_parallel_size=ps.get_data_parallel_world_size(),
            expert_data_parallel=ps.get_expert_data_parallel_group(),
            expert_data_parallel_size=ps.get_expert_data_parallel_world_size(),
            expert_parallel=group_of_many(
                ps.get_expert_model_parallel_world_size(), ps.get_expert_model_parallel_group()
            ),
            tensor_parallel=group_of_many(
                ps.get_tensor_model_parallel_world_size(), ps.get_tensor_model_parallel_group()
            ),
            pipeline_parallel=group_of_many(
                ps.get_pipeline_model_parallel_world_size(),
                ps.get_pipeline_model_parallel_group(),
            ),
            context_parallel_size=ps.get_context_parallel_world_size(),
        )


def average_gradients(
    names: Sequence[str], grads: Sequence[torch.Tensor], groups: GradientGroups
) -> None:
    """Every gradient the mean over the data-parallel replicas' losses (each the sum of its
    context-parallel ranks' shares), in place."""
    handles = []
    for name, grad in zip(names, grads):
        expert = is_expert(name)
        group = groups.expert_data_parallel if expert else groups.data_parallel
        size = (
            groups.expert_data_parallel_size
            if expert
            else groups.data_parallel_size * groups.context_parallel_size
        )
        if size > 1:
            handles.append(dist.all_reduce(grad, group=group, async_op=True))
    for handle in handles:
        handle.wait()
    if groups.data_parallel_size > 1:
        for grad in grads:
            grad.div_(groups.data_parallel_size)


def global_norm(
    names: Sequence[str],
    grads: Sequence[torch.Tensor],
    groups: GradientGroups,
    device: torch.device,
) -> float:
    """The L2 norm of the whole model's gradient: tensor-parallel shards summed over the TP
    group, experts over the expert-parallel group, stages over the pipeline group, each
    replicated weight once. ``names``: the weights to count (a tied copy left out)."""
    sharded = torch.zeros((), device=device)
    experts = torch.zeros((), device=device)
    replicated = torch.zeros((), device=device)
    for name, grad in zip(names, grads):
        square = grad.float().pow(2).sum()
        if is_expert(name):
            experts += square
        elif split_dim(name) is not None:
            sharded += square
        else:
            replicated += square
    if groups.tensor_parallel is not None:
        dist.all_reduce(sharded, group=groups.tensor_parallel)
    if groups.expert_parallel is not None:
        dist.all_reduce(experts, group=groups.expert_parallel)
    total = sharded + experts + replicated
    if groups.pipeline_parallel is not None:
        dist.all_reduce(total, group=groups.pipeline_parallel)
    return float(total.sqrt())
