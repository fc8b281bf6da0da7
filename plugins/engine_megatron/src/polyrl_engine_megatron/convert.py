"""Hugging Face <-> megatron-core weights for the Qwen2 / Llama family (pure torch, no megatron).

megatron-core's GPTModel with the local layer spec names and lays out the same weights
differently:

==========================================  ==============================================
Hugging Face                                megatron-core (local spec), TP-split dim
==========================================  ==============================================
model.embed_tokens.weight                   embedding.word_embeddings.weight, rows (0)
model.layers.i.input_layernorm.weight       decoder.layers.i.input_layernorm.weight, -
model.layers.i.self_attn.{q,k,v}_proj.*     decoder.layers.i.self_attention.linear_qkv.*, 0
model.layers.i.self_attn.o_proj.weight      decoder.layers.i.self_attention.linear_proj.weight, 1
model.layers.i.post_attention_layernorm.*   decoder.layers.i.pre_mlp_layernorm.weight, -
model.layers.i.mlp.{gate,up}_proj.weight    decoder.layers.i.mlp.linear_fc1.weight, 0
model.layers.i.mlp.down_proj.weight         decoder.layers.i.mlp.linear_fc2.weight, 1
model.norm.weight                           decoder.final_layernorm.weight, -
lm_head.weight                              output_layer.weight, rows (0); absent when tied
==========================================  ==============================================

``linear_qkv`` holds, per key/value group, that group's query heads then its key head then its
value head; a tensor-parallel rank holds whole groups. ``linear_fc1`` holds, per rank, that
rank's slice of the gate projection followed by its slice of the up projection. The vocabulary
is padded with zero rows to a multiple of the tensor-parallel size (megatron splits it evenly);
the padding is dropped on the way back. Conversion is exact in both directions (a round trip
returns the same tensors).

With pipeline parallelism each stage holds a run of decoder layers under local indices
(``decoder.layers.0`` is the stage's first layer); :class:`PipelineStage` maps its names to the
whole model's. The first stage holds the embedding, the last the final norm and the output
layer; with tied embeddings and more than one stage, the last stage's ``output_layer.weight`` is
its own copy of the embedding (megatron-core keeps the two equal by summing their gradients).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from polyrl.api import ConfigError
from polyrl_engine_megatron import moe as mixture
from polyrl_engine_megatron.moe import MoEShape

FAMILIES = ("qwen2", "llama", *mixture.FAMILIES)
EMBEDDING = "embedding.word_embeddings.weight"
OUTPUT = "output_layer.weight"
FINAL_NORM = "decoder.final_layernorm.weight"
HF_EMBEDDING = "model.embed_tokens.weight"
HF_LM_HEAD = "lm_head.weight"


@dataclass(frozen=True)
class GPTShape:
    """The dimensions both layouts share, read from the HF config."""

    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    ffn_hidden_size: int
    vocab_size: int
    tensor_parallel: int
    tied: bool
    qkv_bias: bool
    rope_theta: float
    moe: MoEShape | None = None  # a mixture-of-experts model's MoE blocks (every layer)
    qk_norm: bool = False  # RMSNorm of each head's queries and keys (Qwen3-MoE)

    @property
    def padded_vocab_size(self) -> int:
        tp = self.tensor_parallel
        return -(-self.vocab_size // tp) * tp

    @property
    def heads_per_group(self) -> int:
        return self.num_heads // self.num_kv_heads

    @classmethod
    def from_hf_config(cls, config: Any, tensor_parallel: int) -> GPTShape:
        """The shape of a Qwen2/Llama/Qwen2-MoE/Qwen3-MoE config split over ``tensor_parallel``
        ranks; a :class:`ConfigError` naming what does not fit otherwise."""
        family = str(getattr(config, "model_type", ""))
        if family not in FAMILIES:
            raise ConfigError(
                f"strategy=megatron converts {', '.join(FAMILIES)} models; this model is "
                f"{family or 'of unknown type'!r}. Use strategy=fsdp2 for other architectures"
            )
        rope = dict(
            getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
        )
        rope_type = rope.get("rope_type") or rope.get("type") or "default"
        if rope_type != "default":
            raise ConfigError(
                f"strategy=megatron converts plain RoPE only; this model's RoPE is {rope_type!r} "
                f"({rope}). Use strategy=fsdp2 for this model"
            )
        heads = int(config.num_attention_heads)
        kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
        head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
        moe = (
            MoEShape.from_hf_config(config, tensor_parallel) if family in mixture.FAMILIES else None
        )
        problems = [
            f"{what}={count} is not divisible by "
            f"actor_rollout_ref.actor.megatron.tensor_model_parallel_size={tensor_parallel}"
            for what, count in (
                ("num_attention_heads", heads),
                ("num_key_value_heads", kv_heads),
                ("intermediate_size", 0 if moe else int(config.intermediate_size)),
            )
            if count % tensor_parallel
        ]
        if problems:
            raise ConfigError("; ".join(problems))
        bias = family in ("qwen2", "qwen2_moe") or bool(getattr(config, "attention_bias", False))
        return cls(
            num_layers=int(config.num_hidden_layers),
            hidden_size=int(config.hidden_size),
            num_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            ffn_hidden_size=int(config.intermediate_size),
            vocab_size=int(config.vocab_size),
            tensor_parallel=tensor_parallel,
            tied=bool(getattr(config, "tie_word_embeddings", False)),
            qkv_bias=bias,
            rope_theta=float(rope.get("rope_theta", getattr(config, "rope_theta", 10000.0))),
            moe=moe,
            qk_norm=family == "qwen3_moe",
        )


@dataclass(frozen=True)
class PipelineStage:
    """The part of the model one pipeline stage holds: decoder layers ``first_layer`` to
    ``first_layer + num_layers - 1``, the embedding when ``is_first``, the final norm and the
    output layer when ``is_last``."""

    first_layer: int
    num_layers: int
    is_first: bool
    is_last: bool

    def global_name(self, local: str) -> str:
        """The whole model's name of this stage's weight ``local``."""
        prefix, found, rest = local.partition("decoder.layers.")
        if not found:
            return local
        index, _, leaf = rest.partition(".")
        return f"{prefix}decoder.layers.{int(index) + self.first_layer}.{leaf}"

    def local_name(self, name: str) -> str | None:
        """This stage's name of the whole model's weight ``name``; None where another stage
        holds it."""
        if name == EMBEDDING:
            return name if self.is_first else None
        if name in (FINAL_NORM, OUTPUT):
            return name if self.is_last else None
        prefix, found, rest = name.partition("decoder.layers.")
        index, _, leaf = rest.partition(".")
        if not found or not index.isdigit():
            raise KeyError(f"{name!r} is not a megatron-core GPTModel weight this converter knows")
        local = int(index) - self.first_layer
        if not 0 <= local < self.num_layers:
            return None
        return f"{prefix}decoder.layers.{local}.{leaf}"


PP_KEY = "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size"
SPLIT_KEY = "actor_rollout_ref.actor.megatron.override_transformer_config"


@dataclass(frozen=True)
class StageSplit:
    """megatron-core's uneven pipeline layouts, ``TransformerConfig`` keys that verl's scripts
    set in ``megatron.override_transformer_config``: ``first`` / ``last``
    (``num_layers_in_first/last_pipeline_stage``) decoder layers on the first / last stage and
    the rest split evenly over the middle stages; or ``embedding`` / ``loss``
    (``account_for_embedding/loss_in_pipeline_split``) counting the embedding / the output
    layer as one more layer of the first / last stage in an even split."""

    first: int | None = None
    last: int | None = None
    embedding: bool = False
    loss: bool = False

    KEYS = (
        "num_layers_in_first_pipeline_stage",
        "num_layers_in_last_pipeline_stage",
        "account_for_embedding_in_pipeline_split",
        "account_for_loss_in_pipeline_split",
    )

    @classmethod
    def from_overrides(cls, overrides: Mapping[str, Any]) -> StageSplit:
        first, last, embedding, loss = (overrides.get(key) for key in cls.KEYS)
        return cls(first=first, last=last, embedding=bool(embedding), loss=bool(loss))

    @property
    def even(self) -> bool:
        return self == EVEN


EVEN = StageSplit()  # megatron-core's default: the layers split evenly


def stage_layer_counts(
    num_layers: int, pipeline_parallel: int, split: StageSplit = EVEN
) -> list[int]:
    """How many decoder layers each stage holds, as megatron-core places them
    (``get_num_layers_to_build``); a :class:`ConfigError` line where they do not fit."""
    if pipeline_parallel == 1:
        return [num_layers]
    if split.first is not None or split.last is not None:
        return _first_last_counts(num_layers, pipeline_parallel, split)
    extra = int(split.embedding) + int(split.loss)
    if (num_layers + extra) % pipeline_parallel:
        counted = f"{num_layers} decoder layers" + (
            f" plus {extra} for the embedding/loss (account_for_*_in_pipeline_split)"
            if extra
            else " (num_hidden_layers)"
        )
        raise ConfigError(
            f"{PP_KEY}={pipeline_parallel} does not divide the model's {counted}; pick a "
            f"divisor, or set {SPLIT_KEY}.num_layers_in_first/last_pipeline_stage"
        )
    per_stage = (num_layers + extra) // pipeline_parallel
    counts = [per_stage] * pipeline_parallel
    counts[0] -= int(split.embedding)
    counts[-1] -= int(split.loss)
    return counts


def _first_last_counts(num_layers: int, pipeline_parallel: int, split: StageSplit) -> list[int]:
    if split.embedding or split.loss:
        raise ConfigError(
            f"{SPLIT_KEY}: num_layers_in_first/last_pipeline_stage and "
            f"account_for_*_in_pipeline_split exclude each other (megatron-core); keep one"
        )
    given = [n for n in (split.first, split.last) if n is not None]
    if any(not isinstance(n, int) or isinstance(n, bool) or n < 1 for n in given):
        raise ConfigError(
            f"{SPLIT_KEY}.num_layers_in_first/last_pipeline_stage={given}: give positive "
            f"numbers of decoder layers"
        )
    middle_stages = pipeline_parallel - len(given)
    middle_layers = num_layers - sum(given)
    if (
        middle_layers < 0
        or bool(middle_layers) != bool(middle_stages)
        or (middle_stages and middle_layers % middle_stages)
    ):
        raise ConfigError(
            f"{SPLIT_KEY}.num_layers_in_first/last_pipeline_stage={given} leave "
            f"{middle_layers} of the model's {num_layers} decoder layers for "
            f"{middle_stages} other stage(s) of {PP_KEY}={pipeline_parallel}; they must split "
            f"evenly (none left with no other stage)"
        )
    per_stage = middle_layers // middle_stages if middle_stages else 0
    counts = [per_stage] * pipeline_parallel
    if split.first is not None:
        counts[0] = split.first
    if split.last is not None:
        counts[-1] = split.last
    return counts


def pipeline_stages(
    num_layers: int, pipeline_parallel: int, split: StageSplit = EVEN
) -> list[PipelineStage]:
    """The stages of ``num_layers`` decoder layers split as megatron-core splits them (evenly
    unless ``split`` says otherwise)."""
    return stages_of(stage_layer_counts(num_layers, pipeline_parallel, split))


VPP_KEY = "actor_rollout_ref.actor.megatron.virtual_pipeline_model_parallel_size"


def virtual_stages(
    num_layers: int, pipeline_parallel: int, virtual: int | None, split: StageSplit = EVEN
) -> list[PipelineStage]:
    """The model chunks in the model's order. Without ``virtual`` (interleaved pipeline
    parallelism) they are the pipeline stages; with it each stage holds ``virtual`` chunks and
    chunk ``v`` of stage ``p`` is ``[v * pipeline_parallel + p]`` of the list: the layers split
    evenly into ``pipeline_parallel x virtual`` runs, as megatron-core places them."""
    if virtual is None:
        return pipeline_stages(num_layers, pipeline_parallel, split)
    if not split.even:
        raise ConfigError(
            f"{VPP_KEY}={virtual} with uneven pipeline stages ({SPLIT_KEY}."
            f"num_layers_in_*/account_for_*): polyrl splits interleaved chunks evenly only; "
            f"drop one of the two"
        )
    chunks = pipeline_parallel * virtual
    if num_layers % chunks:
        raise ConfigError(
            f"{VPP_KEY}={virtual} x {PP_KEY}={pipeline_parallel} = {chunks} model chunks do not "
            f"divide the model's {num_layers} decoder layers; pick sizes whose product divides "
            f"{num_layers}"
        )
    return pipeline_stages(num_layers, chunks)


def stages_of(counts: Sequence[int]) -> list[PipelineStage]:
    """The stages holding ``counts[i]`` consecutive decoder layers each."""
    stages, first = [], 0
    for index, count in enumerate(counts):
        stages.append(
            PipelineStage(
                first_layer=first,
                num_layers=count,
                is_first=index == 0,
                is_last=index == len(counts) - 1,
            )
        )
        first += count
    return stages


def stage_shards(
    shards: Mapping[str, list[torch.Tensor]], shape: GPTShape, stage: PipelineStage
) -> dict[str, list[torch.Tensor]]:
    """The weights of :func:`hf_to_megatron` that ``stage`` holds, under its local names; the
    last stage of a tied model split over several stages gets the embedding as its output
    layer."""
    out = {
        local: tensors
        for name, tensors in shards.items()
        if (local := stage.local_name(name)) is not None
    }
    if shape.tied and stage.is_last and not stage.is_first:
        out[OUTPUT] = [tensor.clone() for tensor in shards[EMBEDDING]]
    return out


def is_tied_copy(local: str, shape: GPTShape, stage: PipelineStage) -> bool:
    """Whether this stage's weight ``local`` duplicates the first stage's embedding: streamed
    and counted once, from the first stage."""
    return local == OUTPUT and shape.tied and not stage.is_first


# (the dense MLP's, the experts' and the shared expert's linear_fc1 / linear_fc2)
# with LoRA (:mod:`.lora`) a row-parallel linear's A and a column-parallel one's B are split too
_ROW_SPLIT = (
    "self_attention.linear_proj.weight",
    "linear_fc2.weight",
    "self_attention.linear_proj.adapter.lora_A",
    "linear_fc2.adapter.lora_A",
)
_COLUMN_SPLIT = (
    EMBEDDING,
    OUTPUT,
    "linear_qkv.weight",
    "linear_qkv.bias",
    "linear_fc1.weight",
    "linear_qkv.adapter.lora_B",
    "linear_fc1.adapter.lora_B",
)


def split_dim(name: str) -> int | None:
    """The dimension along which tensor parallelism splits megatron-core weight ``name``; None
    for a weight every rank holds whole (the norms, the routed experts)."""
    if mixture.is_expert(name):
        return None
    if name.endswith(_COLUMN_SPLIT):
        return 0
    if name.endswith(_ROW_SPLIT):
        return 1
    return None


# ---- Hugging Face -> Megatron ------------------------------------------------------------------
def _pad_rows(tensor: torch.Tensor, rows: int) -> torch.Tensor:
    if tensor.shape[0] == rows:
        return tensor
    return torch.cat([tensor, tensor.new_zeros((rows - tensor.shape[0], *tensor.shape[1:]))])


def _grouped_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, shape: GPTShape):
    """``[q heads of group g | k head g | v head g]`` for every group g, as ``[groups, ...]``."""
    groups, d = shape.num_kv_heads, shape.head_dim
    tail = q.shape[1:]
    return torch.cat(
        [
            q.reshape(groups, shape.heads_per_group * d, *tail),
            k.reshape(groups, d, *tail),
            v.reshape(groups, d, *tail),
        ],
        dim=1,
    )


def hf_to_megatron(
    hf: Mapping[str, torch.Tensor], shape: GPTShape
) -> dict[str, list[torch.Tensor]]:
    """Every megatron-core weight as its list of tensor-parallel shards (one per rank)."""
    tp = shape.tensor_parallel
    out: dict[str, list[torch.Tensor]] = {}

    def split(name: str, tensor: torch.Tensor, dim: int) -> None:
        out[name] = [part.clone() for part in tensor.chunk(tp, dim=dim)]

    def replicate(name: str, tensor: torch.Tensor) -> None:
        out[name] = [tensor.clone() for _ in range(tp)]

    split(EMBEDDING, _pad_rows(hf[HF_EMBEDDING], shape.padded_vocab_size), 0)
    for i in range(shape.num_layers):
        src, dst = f"model.layers.{i}.", f"decoder.layers.{i}."
        attn = src + "self_attn."
        replicate(dst + "input_layernorm.weight", hf[src + "input_layernorm.weight"])
        for kind in ("weight", "bias") if shape.qkv_bias else ("weight",):
            q, k, v = (hf[f"{attn}{p}_proj.{kind}"] for p in "qkv")
            grouped = _grouped_qkv(q, k, v, shape)
            out[f"{dst}self_attention.linear_qkv.{kind}"] = [
                part.reshape(-1, *q.shape[1:]).clone() for part in grouped.chunk(tp, dim=0)
            ]
        split(dst + "self_attention.linear_proj.weight", hf[attn + "o_proj.weight"], 1)
        if shape.qk_norm:
            replicate(dst + "self_attention.q_layernorm.weight", hf[attn + "q_norm.weight"])
            replicate(dst + "self_attention.k_layernorm.weight", hf[attn + "k_norm.weight"])
        replicate(dst + "pre_mlp_layernorm.weight", hf[src + "post_attention_layernorm.weight"])
        if shape.moe:
            out.update(mixture.moe_to_megatron(hf, shape.moe, i, tp))
            continue
        gate = hf[src + "mlp.gate_proj.weight"].chunk(tp, dim=0)
        up = hf[src + "mlp.up_proj.weight"].chunk(tp, dim=0)
        out[dst + "mlp.linear_fc1.weight"] = [torch.cat([g, u]) for g, u in zip(gate, up)]
        split(dst + "mlp.linear_fc2.weight", hf[src + "mlp.down_proj.weight"], 1)
    replicate(FINAL_NORM, hf["model.norm.weight"])
    if not shape.tied:
        split(OUTPUT, _pad_rows(hf[HF_LM_HEAD], shape.padded_vocab_size), 0)
    return out


# ---- Megatron -> Hugging Face ------------------------------------------------------------------
def megatron_to_hf(
    name: str, shards: Sequence[torch.Tensor], shape: GPTShape
) -> Iterator[tuple[str, torch.Tensor]]:
    """The HF weights one megatron-core weight holds, from its tensor-parallel shards (in rank
    order; a replicated weight may pass one). A tied embedding is yielded under both of its HF
    names, as the HF ``state_dict()`` has them."""
    if name == EMBEDDING:
        full = torch.cat(list(shards))[: shape.vocab_size]
        yield HF_EMBEDDING, full
        if shape.tied:
            yield HF_LM_HEAD, full
        return
    if name == OUTPUT:
        yield HF_LM_HEAD, torch.cat(list(shards))[: shape.vocab_size]
        return
    if name == FINAL_NORM:
        yield "model.norm.weight", shards[0]
        return
    prefix, _, rest = name.partition(".layers.")
    index, _, leaf = rest.partition(".")
    if prefix != "decoder" or not index.isdigit():
        raise KeyError(f"{name!r} is not a megatron-core GPTModel weight this converter knows")
    hf = f"model.layers.{index}."
    moe = mixture.moe_to_hf(leaf, shards, hf) if shape.moe else None
    if moe is not None:
        yield from moe
    elif leaf in ("self_attention.q_layernorm.weight", "self_attention.k_layernorm.weight"):
        yield f"{hf}self_attn.{leaf[15]}_norm.weight", shards[0]
    elif leaf == "input_layernorm.weight":
        yield hf + "input_layernorm.weight", shards[0]
    elif leaf == "pre_mlp_layernorm.weight":
        yield hf + "post_attention_layernorm.weight", shards[0]
    elif leaf.startswith("self_attention.linear_qkv."):
        kind = leaf.rpartition(".")[2]
        yield from _split_qkv(torch.cat(list(shards)), shape, hf + "self_attn.", kind)
    elif leaf == "self_attention.linear_proj.weight":
        yield hf + "self_attn.o_proj.weight", torch.cat(list(shards), dim=1)
    elif leaf == "mlp.linear_fc1.weight":
        halves = [shard.chunk(2, dim=0) for shard in shards]
        yield hf + "mlp.gate_proj.weight", torch.cat([gate for gate, _ in halves])
        yield hf + "mlp.up_proj.weight", torch.cat([up for _, up in halves])
    elif leaf == "mlp.linear_fc2.weight":
        yield hf + "mlp.down_proj.weight", torch.cat(list(shards), dim=1)
    else:
        raise KeyError(f"{name!r} is not a megatron-core GPTModel weight this converter knows")


def _split_qkv(
    full: torch.Tensor, shape: GPTShape, prefix: str, kind: str
) -> Iterator[tuple[str, torch.Tensor]]:
    d, per_group = shape.head_dim, shape.heads_per_group
    tail = full.shape[1:]
    grouped = full.reshape(shape.num_kv_heads, (per_group + 2) * d, *tail)
    q, k, v = grouped.split([per_group * d, d, d], dim=1)
    for letter, part in zip("qkv", (q, k, v)):
        yield f"{prefix}{letter}_proj.{kind}", part.reshape(-1, *tail)
