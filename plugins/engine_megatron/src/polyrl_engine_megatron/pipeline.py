"""The pipeline-parallel side of the Megatron engine: running micro-batches through
megatron-core's schedule, and gathering every stage's weights onto every rank.

Why megatron-core's schedule for every layout: with one stage it is a plain loop over the
micro-batches (forward, loss, backward), with several it is the 1F1B schedule that passes
activations and their gradients between stages. The engine writes one ``forward_step`` for
both; the loss runs where the logits are (the last stage), and what it records comes back from
the schedule there (an empty list on the other stages).

With interleaved (virtual) pipeline parallelism each rank holds several model chunks, every
one a run of layers of its own: megatron-core's interleaved 1F1B schedule takes the list of
chunks and one data iterator per chunk, and needs at least one micro-batch per stage.

Why every rank gets every weight: a colocated rollout engine on each worker loads the whole
model, so each stage's weights are broadcast over its pipeline group, one tensor at a time,
before the tensor-parallel gather.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
import torch.distributed as dist

from polyrl.api import Batch
from polyrl_engine_megatron.convert import PipelineStage

# megatron-core's forward_step_func: the stage's output and the loss function to run on it
ForwardStep = Callable[[Iterator[Batch], torch.nn.Module], tuple[torch.Tensor, Callable]]


def run_schedule(
    chunks: Sequence[torch.nn.Module],
    micros: Sequence[Batch],
    step: ForwardStep,
    *,
    forward_only: bool,
) -> list[Any]:
    """Every micro-batch forward (and backward unless ``forward_only``) through this rank's
    model chunks (one, or several with interleaved pipeline parallelism, where every chunk
    reads every micro-batch); the loss functions' records in micro-batch order on the last
    stage, [] elsewhere. Collective over the pipeline group: every stage passes the same number
    of micro-batches."""
    from megatron.core.pipeline_parallel import get_forward_backward_func

    width = max(int(micro["input_ids"].shape[1]) for micro in micros)
    rows = max(len(micro) for micro in micros)
    interleaved = len(chunks) > 1
    if interleaved:
        from megatron.core import parallel_state

        stages = parallel_state.get_pipeline_model_parallel_world_size()
        config = chunks[0].config
        config.microbatch_group_size_per_vp_stage = interleaved_group_size(len(micros), stages)
    return get_forward_backward_func()(
        forward_step_func=step,
        data_iterator=[iter(micros) for _ in chunks] if interleaved else iter(micros),
        model=list(chunks) if interleaved else chunks[0],
        num_microbatches=len(micros),
        seq_length=width,  # shapes travel with each activation (variable_seq_lengths)
        micro_batch_size=rows,
        forward_only=forward_only,
    )


def interleaved_group_size(micro_batches: int, stages: int) -> int:
    """megatron-core's ``microbatch_group_size_per_vp_stage`` for ``micro_batches``: the
    smallest group of at least ``stages`` micro-batches (its default, the least memory) that
    leaves no last group smaller than ``stages``, which its interleaved schedule refuses."""
    if micro_batches < stages:
        raise ValueError(
            f"interleaved pipeline parallelism runs at least {stages} micro-batches (one per "
            f"stage); got {micro_batches}"
        )
    for size in range(stages, micro_batches + 1):
        if micro_batches % size == 0 or micro_batches % size >= stages:
            return size
    return micro_batches


def at_least(groups: list[list[int]], count: int) -> list[list[int]]:
    """``groups`` of rows, the largest halved until there are ``count`` (interleaved pipeline
    parallelism needs a micro-batch per stage); as many as there are rows at most."""
    groups = [list(group) for group in groups]
    while len(groups) < count:
        largest = max(range(len(groups)), key=lambda i: len(groups[i]))
        group = groups[largest]
        if len(group) < 2:
            break
        half = len(group) // 2
        groups[largest : largest + 1] = [group[:half], group[half:]]
    return groups


class StageWeights:
    """Streams the weights of every model chunk (pipeline stage, or interleaved chunk) on every
    rank of a pipeline group."""

    def __init__(
        self,
        chunks: Sequence[tuple[int, torch.nn.Module]],
        stages: Sequence[PipelineStage],
        group: Any,
        device: torch.device,
    ) -> None:
        """``chunks``: this rank's ``(index in stages, module)``; ``stages``: every chunk of the
        model in its order."""
        self.chunks = dict(chunks)
        self.stages = list(stages)
        self.group = group
        self.device = device
        local = {
            index: [(name, tuple(p.shape)) for name, p in module.named_parameters()]
            for index, module in self.chunks.items()
        }
        self.layouts: list[list[tuple[str, tuple[int, ...]]]] = [[] for _ in self.stages]
        self.sources = [dist.get_rank()] * len(self.stages)
        self.distributed = len(self.chunks) < len(self.stages)
        gathered = [local]
        if self.distributed:  # every chunk's parameter names and shapes, once (collective)
            gathered = [{} for _ in range(dist.get_world_size(group))]
            dist.all_gather_object(gathered, local, group=group)
        for member, layouts in enumerate(gathered):
            for index, layout in layouts.items():
                self.layouts[index] = layout
                if self.distributed:
                    self.sources[index] = dist.get_global_rank(group, member)

    def stream(
        self, keep: Callable[[PipelineStage, str], bool]
    ) -> Iterator[tuple[PipelineStage, str, torch.Tensor]]:
        """``(stage, local name, this rank's tensor-parallel shard)`` for every weight of every
        chunk that ``keep`` accepts, in the model's order; the same sequence on every rank
        (collective)."""
        params = {index: dict(module.named_parameters()) for index, module in self.chunks.items()}
        for index, (stage, layout) in enumerate(zip(self.stages, self.layouts)):
            for name, shape in layout:
                if not keep(stage, name):
                    continue
                if index in params:
                    tensor = params[index][name].detach().contiguous()
                else:
                    tensor = torch.empty(shape, dtype=torch.float32, device=self.device)
                if self.distributed:
                    dist.broadcast(tensor, src=self.sources[index], group=self.group)
                yield stage, name, tensor
