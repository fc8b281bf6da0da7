"""Mixture-of-experts layers of Qwen2-MoE and Qwen3-MoE in megatron-core (pure torch, no
megatron): the shape read from the HF config, the ``TransformerConfig`` keys that reproduce the
HF routing, and the weights of one layer's MoE block both ways.

==============================================  ==============================================
Hugging Face (transformers 5: experts fused)    megatron-core (local spec, SequentialMLP)
==============================================  ==============================================
mlp.gate.weight                                 mlp.router.weight (replicated)
mlp.experts.gate_up_proj[e]                     mlp.experts.local_experts.e.linear_fc1.weight
mlp.experts.down_proj[e]                        mlp.experts.local_experts.e.linear_fc2.weight
mlp.shared_expert.{gate,up}_proj.weight         mlp.shared_experts.linear_fc1.weight
mlp.shared_expert.down_proj.weight              mlp.shared_experts.linear_fc2.weight
mlp.shared_expert_gate.weight                   mlp.shared_experts.gate_weight (replicated)
self_attn.{q,k}_norm.weight (Qwen3-MoE)         self_attention.{q,k}_layernorm.weight
==============================================  ==============================================

The shared expert's ``linear_fc1`` / ``linear_fc2`` split over tensor-parallel ranks as a dense
MLP's; the routed experts are whole on every rank that holds them (expert tensor parallelism 1,
verl's scripts' setting: with sequence parallelism each TP rank routes its own tokens, and
expert parallelism spreads the experts over the TP x DP ranks of a stage). The HF routing
(softmax over all experts in float32, top-k, renormalised when ``norm_topk_prob``) is
megatron-core's softmax router with ``moe_router_pre_softmax`` (softmax, then top-k, not
renormalised) or without it (top-k of the logits, then softmax over them: the renormalised
weights). No token is dropped and no auxiliary
loss is added unless ``megatron.override_transformer_config`` asks for it.

Streaming back, each expert's weights come one at a time; :func:`stack_experts` joins a layer's
experts into the fused tensors of transformers' state dict.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from polyrl.api import ConfigError

FAMILIES = ("qwen2_moe", "qwen3_moe")
_EXPERT = re.compile(r"^(model\.layers\.\d+\.mlp\.experts)\.(\d+)\.(gate_up_proj|down_proj)$")


@dataclass(frozen=True)
class MoEShape:
    """What a layer's MoE block has, read from the HF config."""

    num_experts: int
    topk: int
    ffn_hidden_size: int
    shared_ffn_hidden_size: int  # 0: no shared expert
    norm_topk: bool

    @classmethod
    def from_hf_config(cls, config: Any, tensor_parallel: int) -> MoEShape:
        family = str(config.model_type)
        dense = list(getattr(config, "mlp_only_layers", None) or [])
        step = int(getattr(config, "decoder_sparse_step", 1) or 1)
        if dense or step != 1:
            raise ConfigError(
                f"strategy=megatron converts {family} models whose every layer is a MoE layer; "
                f"this one has dense layers (mlp_only_layers={dense}, decoder_sparse_step="
                f"{step}). Use strategy=fsdp2 for this model"
            )
        shape = cls(
            num_experts=int(config.num_experts),
            topk=int(config.num_experts_per_tok),
            ffn_hidden_size=int(config.moe_intermediate_size),
            shared_ffn_hidden_size=int(getattr(config, "shared_expert_intermediate_size", 0) or 0),
            norm_topk=bool(getattr(config, "norm_topk_prob", False)),
        )
        for what, size in (
            ("moe_intermediate_size", shape.ffn_hidden_size),
            ("shared_expert_intermediate_size", shape.shared_ffn_hidden_size),
        ):
            if size % tensor_parallel:
                raise ConfigError(
                    f"{what}={size} is not divisible by "
                    f"actor_rollout_ref.actor.megatron.tensor_model_parallel_size={tensor_parallel}"
                )
        return shape

    def transformer_config_kwargs(self) -> dict[str, Any]:
        """megatron-core's MoE settings that compute the HF block."""
        kwargs: dict[str, Any] = {
            "num_moe_experts": self.num_experts,
            "moe_router_topk": self.topk,
            "moe_ffn_hidden_size": self.ffn_hidden_size,
            "moe_router_score_function": "softmax",
            "moe_router_pre_softmax": not self.norm_topk,
            "moe_router_load_balancing_type": "none",
            "moe_aux_loss_coeff": 0.0,
            "moe_grouped_gemm": False,
        }
        if self.shared_ffn_hidden_size:
            kwargs["moe_shared_expert_intermediate_size"] = self.shared_ffn_hidden_size
            kwargs["moe_shared_expert_gate"] = True
        return kwargs


def _gate_up(gate: torch.Tensor, up: torch.Tensor, tp: int) -> list[torch.Tensor]:
    """megatron's ``linear_fc1`` shards: per rank, its slice of the gate then of the up rows."""
    return [torch.cat([g, u]) for g, u in zip(gate.chunk(tp), up.chunk(tp))]


def moe_to_megatron(
    hf: Mapping[str, torch.Tensor], moe: MoEShape, layer: int, tp: int
) -> dict[str, list[torch.Tensor]]:
    """Layer ``layer``'s MoE block as megatron-core's weights, each its tensor-parallel shards."""
    src, dst = f"model.layers.{layer}.mlp.", f"decoder.layers.{layer}.mlp."
    out = {dst + "router.weight": [hf[src + "gate.weight"].clone() for _ in range(tp)]}
    gate_up, down = hf[src + "experts.gate_up_proj"], hf[src + "experts.down_proj"]
    for e in range(moe.num_experts):  # whole on every TP rank (expert tensor parallelism 1)
        expert = f"{dst}experts.local_experts.{e}."
        out[expert + "linear_fc1.weight"] = [gate_up[e].clone() for _ in range(tp)]
        out[expert + "linear_fc2.weight"] = [down[e].clone() for _ in range(tp)]
    if moe.shared_ffn_hidden_size:
        shared = src + "shared_expert."
        out[dst + "shared_experts.linear_fc1.weight"] = _gate_up(
            hf[shared + "gate_proj.weight"], hf[shared + "up_proj.weight"], tp
        )
        out[dst + "shared_experts.linear_fc2.weight"] = [
            p.clone() for p in hf[shared + "down_proj.weight"].chunk(tp, dim=1)
        ]
        out[dst + "shared_experts.gate_weight"] = [
            hf[src + "shared_expert_gate.weight"].clone() for _ in range(tp)
        ]
    return out


def moe_to_hf(
    leaf: str, shards: Sequence[torch.Tensor], hf_layer: str
) -> Iterator[tuple[str, torch.Tensor]] | None:
    """The HF weights of the MoE block's megatron-core weight ``leaf`` (below
    ``decoder.layers.i.``), from its tensor-parallel shards; an expert's (whole on each rank:
    the first) under a per-expert name that :func:`stack_experts` joins. None for a leaf
    outside the MoE block."""
    mlp = hf_layer + "mlp."
    if leaf == "mlp.router.weight":
        return iter([(mlp + "gate.weight", shards[0])])
    if leaf == "mlp.shared_experts.gate_weight":
        return iter([(mlp + "shared_expert_gate.weight", shards[0])])
    found = re.fullmatch(
        r"mlp\.(experts\.local_experts\.(\d+)|shared_experts)\.(linear_fc\d)\.weight", leaf
    )
    if found is None:
        return None
    expert, fc = found.group(2), found.group(3)
    if expert:
        hf_fc = "down_proj" if fc == "linear_fc2" else "gate_up_proj"
        return iter([(f"{mlp}experts.{expert}.{hf_fc}", shards[0])])
    if fc == "linear_fc2":
        return iter([(f"{mlp}shared_expert.down_proj.weight", torch.cat(list(shards), dim=1))])
    halves = [shard.chunk(2) for shard in shards]
    gate = torch.cat([g for g, _ in halves])
    up = torch.cat([u for _, u in halves])
    shared = mlp + "shared_expert."
    return iter([(shared + "gate_proj.weight", gate), (shared + "up_proj.weight", up)])


def stack_experts(
    weights: Iterator[tuple[str, torch.Tensor]], num_experts: int
) -> Iterator[tuple[str, torch.Tensor]]:
    """``weights`` with each layer's per-expert tensors (``...experts.<e>.gate_up_proj``)
    joined into transformers' fused ``...experts.gate_up_proj`` ``[experts, ...]`` once all
    of that layer's experts have come; other weights pass unchanged."""
    pending: dict[str, dict[int, torch.Tensor]] = {}
    for name, tensor in weights:
        found = _EXPERT.match(name)
        if found is None:
            yield name, tensor
            continue
        fused = f"{found.group(1)}.{found.group(3)}"
        parts = pending.setdefault(fused, {})
        parts[int(found.group(2))] = tensor
        if len(parts) == num_experts:
            yield fused, torch.stack([parts[e] for e in range(num_experts)])
            del pending[fused]
    if pending:
        missing = {name: num_experts - len(parts) for name, parts in pending.items()}
        raise RuntimeError(f"experts missing from the weight stream: {missing}")


_LOCAL_EXPERT = re.compile(r"^(.*\.mlp\.experts\.local_experts\.)(\d+)(\..*)$")


def is_expert(name: str) -> bool:
    """Whether megatron-core weight ``name`` belongs to a routed expert (not the shared one)."""
    return ".mlp.experts." in f".{name}"


def local_experts(
    shards: Mapping[str, list[torch.Tensor]], num_experts: int, rank: int, size: int
) -> dict[str, list[torch.Tensor]]:
    """The weights expert-parallel rank ``rank`` of ``size`` holds: the other weights, and its
    ``num_experts / size`` consecutive experts renumbered from 0 (megatron-core's placement)."""
    per_rank = num_experts // size
    out = {}
    for name, tensors in shards.items():
        found = _LOCAL_EXPERT.match(name)
        if found is None:
            out[name] = tensors
            continue
        index = int(found.group(2)) - rank * per_rank
        if 0 <= index < per_rank:
            out[f"{found.group(1)}{index}{found.group(3)}"] = tensors
    return out


def global_expert_name(name: str, rank: int, per_rank: int) -> str:
    """The whole model's name of expert-parallel rank ``rank``'s local expert weight ``name``."""
    found = _LOCAL_EXPERT.match(name)
    if found is None:
        return name
    return f"{found.group(1)}{rank * per_rank + int(found.group(2))}{found.group(3)}"


def gathered_experts(
    name: str, shard: torch.Tensor, group: Any, size: int, per_rank: int
) -> list[tuple[str, torch.Tensor]]:
    """Local expert weight ``name`` of every rank of the expert-parallel ``group`` (of
    ``size`` ranks, ``per_rank`` experts each), under the whole model's expert numbers
    (collective)."""
    import torch.distributed as dist

    copies = [torch.empty_like(shard) for _ in range(size)]
    dist.all_gather(copies, shard.contiguous(), group=group)
    return [(global_expert_name(name, rank, per_rank), copy) for rank, copy in enumerate(copies)]
