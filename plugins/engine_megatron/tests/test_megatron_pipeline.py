"""Streaming the weights of every pipeline stage on every rank (CPU, 2 gloo ranks, no megatron):
each rank holds only its stage's parameters, and both ranks stream the whole model, in the same
order, with the owning stage's values; a weight the filter drops (the tied output layer's copy)
is not sent at all."""

from __future__ import annotations

import torch
import torch.distributed as dist

from polyrl_engine_kit.launch import run_on_ranks
from polyrl_engine_megatron.convert import pipeline_stages
from polyrl_engine_megatron.pipeline import StageWeights

# what each stage of a 2-layer, tied-embedding model holds (local names), and its shapes
LAYOUTS = [
    {"embedding.word_embeddings.weight": (6, 4), "decoder.layers.0.mlp.weight": (4, 4)},
    {
        "decoder.layers.0.mlp.weight": (4, 4),
        "decoder.final_layernorm.weight": (4,),
        "output_layer.weight": (6, 4),
    },
]


def _stage_module(stage: int) -> torch.nn.Module:
    module = torch.nn.Module()
    for index, (name, shape) in enumerate(LAYOUTS[stage].items()):
        value = torch.full(shape, 10.0 * stage + index)  # which stage and parameter, by value
        parts = name.split(".")
        parent = module
        for part in parts[:-1]:
            if not hasattr(parent, part):
                parent.add_module(part, torch.nn.Module())
            parent = getattr(parent, part)
        parent.register_parameter(parts[-1], torch.nn.Parameter(value))
    return module


def _stream(rank: int, world: int) -> list[tuple[str, float, tuple[int, ...]]]:
    stages = pipeline_stages(2, world)
    module = _stage_module(rank)
    weights = StageWeights([(rank, module)], stages, dist.group.WORLD, torch.device("cpu"))
    sent = []
    broadcast = dist.broadcast

    def counting(tensor: torch.Tensor, *args, **kwargs):
        sent.append(tuple(tensor.shape))
        return broadcast(tensor, *args, **kwargs)

    dist.broadcast = counting
    try:
        streamed = [
            (stage.global_name(name), float(tensor.flatten()[0]), tuple(tensor.shape))
            for stage, name, tensor in weights.stream(
                lambda stage, name: not (stage.is_last and name == "output_layer.weight")
            )
        ]
    finally:
        dist.broadcast = broadcast
    assert len(sent) == len(streamed)  # the dropped copy was never broadcast
    return streamed


def test_every_rank_streams_every_stage_with_the_owners_values() -> None:
    first, second = run_on_ranks(_stream, 2, timeout_s=120)
    assert first == second
    assert first == [
        ("embedding.word_embeddings.weight", 0.0, (6, 4)),
        ("decoder.layers.0.mlp.weight", 1.0, (4, 4)),
        ("decoder.layers.1.mlp.weight", 10.0, (4, 4)),
        ("decoder.final_layernorm.weight", 11.0, (4,)),
    ]
