"""The pipeline-parallel side of the Megatron engine: running micro-batches through
megatron-core's schedule, and gathering every stage's weights onto every rank.

Why megatron-core's schedule for every layout: with one stage it is a plain loop over the
micro-batches (forward, loss, backward), with several it is the 1F1B schedule that passes
activations and their gradients between stages. The engine writes one ``forward_step`` for
both; the loss runs where the logits are (the last stage), and what it records comes back from
the schedule there (an empty list on the other stages).

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
    model: torch.nn.Module, micros: Sequence[Batch], step: ForwardStep, *, forward_only: bool
) -> list[Any]:
    """Every micro-batch forward (and backward unless ``forward_only``) through this rank's
    stage; the loss functions' records in micro-batch order on the last stage, [] elsewhere.
    Collective over the pipeline group: every stage passes the same number of micro-batches."""
    from megatron.core.pipeline_parallel import get_forward_backward_func

    width = max(int(micro["input_ids"].shape[1]) for micro in micros)
    rows = max(len(micro) for micro in micros)
    return get_forward_backward_func()(
        forward_step_func=step,
        data_iterator=iter(micros),
        model=model,
        num_microbatches=len(micros),
        seq_length=width,  # shapes travel with each activation (variable_seq_lengths)
        micro_batch_size=rows,
        forward_only=forward_only,
    )


class StageWeights:
    """Streams the weights of every pipeline stage on every rank of a pipeline group."""

    def __init__(
        self,
        model: torch.nn.Module,
        stages: Sequence[PipelineStage],
        stage_index: int,
        group: Any,
        device: torch.device,
    ) -> None:
        self.model = model
        self.stages = list(stages)
        self.stage_index = stage_index
        self.group = group
        self.device = device
        local = [(name, tuple(p.shape)) for name, p in model.named_parameters()]
        if len(self.stages) == 1:
            self.layouts = [local]
            self.sources = [dist.get_rank()]
        else:  # every stage's parameter names and shapes, once (collective)
            self.layouts = [[] for _ in self.stages]
            dist.all_gather_object(self.layouts, local, group=group)
            self.sources = [dist.get_global_rank(group, i) for i in range(len(self.stages))]

    def stream(
        self, keep: Callable[[PipelineStage, str], bool]
    ) -> Iterator[tuple[PipelineStage, str, torch.Tensor]]:
        """``(stage, local name, this rank's tensor-parallel shard)`` for every weight of every
        stage that ``keep`` accepts, in stage order; the same sequence on every rank
        (collective)."""
        params = dict(self.model.named_parameters())
        for index, (stage, layout) in enumerate(zip(self.stages, self.layouts)):
            for name, shape in layout:
                if not keep(stage, name):
                    continue
                if index == self.stage_index:
                    tensor = params[name].detach().contiguous()
                else:
                    tensor = torch.empty(shape, dtype=torch.float32, device=self.device)
                if len(self.stages) > 1:
                    dist.broadcast(tensor, src=self.sources[index], group=self.group)
                yield stage, name, tensor
