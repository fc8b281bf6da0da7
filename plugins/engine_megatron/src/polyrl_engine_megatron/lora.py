"""LoRA adapters on megatron-core's tensor-parallel linears (verl's Megatron LoRA group,
``actor_rollout_ref.model.lora``), and the merged weights the rollout and the export get.

An adapted linear computes ``W x + alpha / rank * B (A x)`` with ``W`` frozen and only ``A``
(``[rank, in]``) and ``B`` (``[out, rank]``) trained. Each adapter is split over the
tensor-parallel ranks the way its base linear is, so that no rank holds more than a rank-sized
slice of activations beyond the base's and the merged weight of each rank's shard is its own
shard of ``W + scale * B @ A``:

- column-parallel base (``linear_qkv``, ``linear_fc1``: each rank holds rows of ``W``): ``A``
  whole on every rank, ``B`` split by rows like ``W``. Every rank's ``B`` slice sends a gradient
  back into ``A x``, so ``A x`` passes megatron-core's copy-to-tensor-parallel region (identity
  forward, all-reduce backward): every rank gets the same, whole gradient of ``A``;
- row-parallel base (``linear_proj``, ``linear_fc2``: each rank holds columns of ``W`` and a
  slice of the input): ``A`` split by columns like ``W``, ``B`` whole; the partial products
  ``A_i x_i`` are summed over the ranks (megatron-core's reduce-from region, as the base sums
  ``W_i x_i``) before ``B``.

With sequence parallelism the same holds along the sequence (:class:`LoraAdapter`). A routed
expert's linear is split over its own group, the expert tensor-parallel one of one rank: its
``A`` and ``B`` are whole, and they are expert parameters like its weight.

The adapter hangs off its base linear as the submodule ``adapter`` (parameters
``<linear>.adapter.lora_A`` / ``lora_B``) and joins the base's output through a forward hook,
so the base's own parameter names, its weight loading and its conversion stay as they are.
Initial values are drawn for the whole matrix from a generator seeded by the run's seed and the
module's name in the whole model (layer and expert numbers), then sliced: every tensor-,
pipeline- and expert-parallel layout starts from the same adapters.

Merging (:func:`merge_adapters`) works on each rank's shards before any gather: ``W_i + scale *
B_i @ A`` (column) and ``W_i + scale * B @ A_i`` (row) are the shards of the merged weight, so
the engine's weight stream, its expert and tensor-parallel gathers and the checkpoint reader
treat a merged weight like any other.
"""

from __future__ import annotations

import fnmatch
import math
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
import torch.nn.functional as F
from torch import nn

from polyrl_engine_megatron.settings import (
    LORA_COLUMN_PARALLEL,
    LORA_INIT_METHODS,
    LORA_ROW_PARALLEL,
)

ADAPTER = "adapter"  # the submodule of an adapted linear
LORA_A = f".{ADAPTER}.lora_A"
LORA_B = f".{ADAPTER}.lora_B"
LINEARS = LORA_COLUMN_PARALLEL + LORA_ROW_PARALLEL

Tag = TypeVar("Tag")


@dataclass(frozen=True)
class LoraSpec:
    """The adapters of one run, from ``actor_rollout_ref.model.lora`` (checked by
    :func:`.checks.lora_problems`)."""

    rank: int
    alpha: float
    targets: tuple[str, ...]
    dropout: float = 0.0
    dropout_position: str = "pre"
    a_init: str = "xavier"
    b_init: str = "zero"

    @property
    def scale(self) -> float:
        return self.alpha / self.rank

    @classmethod
    def from_node(cls, node: Any) -> LoraSpec | None:
        """The spec of a ``model.lora`` node; None with ``rank`` 0 (full fine-tuning)."""
        if not node.rank:
            return None
        return cls(
            rank=int(node.rank),
            alpha=float(node.alpha),
            targets=tuple(str(t) for t in node.target_modules),
            dropout=float(node.dropout),
            dropout_position=str(node.dropout_position),
            a_init=str(node.lora_A_init_method),
            b_init=str(node.lora_B_init_method),
        )

    def adapts(self, module: str) -> bool:
        """Whether the linear ``module`` (its name in the whole model, e.g.
        ``decoder.layers.3.self_attention.linear_qkv``) gets an adapter: its own name is a
        target, or a target with ``*`` matches the whole name (Megatron-Bridge's rule)."""
        leaf = module.rpartition(".")[2]
        if leaf not in LINEARS:
            return False
        return any(fnmatch.fnmatchcase(module, t) if "*" in t else t == leaf for t in self.targets)


def _initial(shape: tuple[int, int], method: str, generator: torch.Generator) -> torch.Tensor:
    """A whole adapter matrix drawn as Megatron-Bridge's init methods draw it: ``xavier``
    normal, ``kaiming`` uniform with ``a = sqrt(5)``, ``normal`` with std 0.2, ``zero``."""
    tensor = torch.empty(shape)
    if method == "zero":
        return tensor.zero_()
    if method == "normal":
        return nn.init.normal_(tensor, 0.0, 0.2, generator=generator)
    if method == "xavier":
        return nn.init.xavier_normal_(tensor, generator=generator)
    if method == "kaiming":
        return nn.init.kaiming_uniform_(tensor, a=math.sqrt(5), generator=generator)
    raise ValueError(f"unknown LoRA init method {method!r}; use one of {LORA_INIT_METHODS}")


class LoraAdapter(nn.Module):
    """``scale * B (A x)`` for one tensor-parallel linear; ``column``: the base is
    column-parallel (``A`` whole, ``B`` this rank's rows), else row-parallel (``A`` this rank's
    columns, ``B`` whole). With ``sequence_parallel`` (the base's) the column-parallel base's
    input and the row-parallel one's output are this rank's slice of the sequence: ``A x`` is
    all-gathered along it (column) or reduce-scattered (row) as the base does with its own, and
    the whole matrix (``A`` or ``B``) sees only the rank's tokens, so it carries megatron-core's
    ``sequence_parallel`` mark: the engine sums its gradient over the TP group."""

    def __init__(
        self,
        lora_a: torch.Tensor,
        lora_b: torch.Tensor,
        column: bool,
        spec: LoraSpec,
        sequence_parallel: bool,
        tp_group: Any,
    ) -> None:
        super().__init__()
        from megatron.core.tensor_parallel import set_tensor_model_parallel_attributes

        self.lora_A = nn.Parameter(lora_a)
        self.lora_B = nn.Parameter(lora_b)
        split, dim, whole = (
            (self.lora_B, 0, self.lora_A) if column else (self.lora_A, 1, self.lora_B)
        )
        set_tensor_model_parallel_attributes(split, is_parallel=True, dim=dim, stride=1)
        whole.sequence_parallel = sequence_parallel
        self.column = column
        self.sequence_parallel = sequence_parallel
        self.scale = spec.scale
        self.dropout = spec.dropout
        self.dropout_position = spec.dropout_position
        self.tp_group = tp_group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from megatron.core.tensor_parallel import (
            copy_to_tensor_model_parallel_region,
            gather_from_sequence_parallel_region,
            reduce_from_tensor_model_parallel_region,
            reduce_scatter_to_sequence_parallel_region,
        )

        if self.dropout_position == "pre":
            x = F.dropout(x, self.dropout, self.training)
        low = F.linear(x, self.lora_A)
        group = self.tp_group
        if self.column and self.sequence_parallel:  # backward: summed and scattered
            low = gather_from_sequence_parallel_region(low, True, group=group)
        elif self.column:
            low = copy_to_tensor_model_parallel_region(low, group=group)
        elif self.sequence_parallel:
            low = reduce_scatter_to_sequence_parallel_region(low, group=group)
        else:
            low = reduce_from_tensor_model_parallel_region(low, group=group)
        out = F.linear(low, self.lora_B)
        if self.dropout_position == "post":
            out = F.dropout(out, self.dropout, self.training)
        return out * self.scale


def _add_adapter_output(
    module: nn.Module, args: tuple, kwargs: dict, output: tuple[torch.Tensor, Any]
) -> tuple[torch.Tensor, Any]:
    """Forward hook of an adapted linear: its ``(output, bias)`` with the adapter's update."""
    x = args[0] if args else kwargs["input_"]
    out, bias = output
    return out + module.adapter(x), bias


def add_adapters(
    model: nn.Module, spec: LoraSpec, *, seed: int, global_name: Callable[[str], str]
) -> int:
    """Adapters on the targeted linears of ``model`` (a GPTModel chunk on its device), every
    other parameter frozen; returns how many linears were adapted. ``global_name``: a module's
    name in the whole model (its layer and expert numbers), which targets and seeds it. A
    linear is split over its own tensor-parallel group (a routed expert's: the expert
    tensor-parallel group, of one rank here)."""
    from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear

    count = 0
    for name, module in list(model.named_modules()):
        if not spec.adapts(global_name(name)):
            continue
        column = isinstance(module, ColumnParallelLinear)
        if not column and not isinstance(module, RowParallelLinear):
            raise TypeError(f"{name} is a {type(module).__name__}, not a tensor-parallel linear")
        generator = torch.Generator().manual_seed(seed + zlib.crc32(global_name(name).encode()))
        tp_rank = module.tp_group.rank()
        lora_a = _initial((spec.rank, module.input_size), spec.a_init, generator)
        lora_b = _initial((module.output_size, spec.rank), spec.b_init, generator)
        if column:
            rows = module.output_size_per_partition
            lora_b = lora_b[tp_rank * rows : (tp_rank + 1) * rows]
        else:
            columns = module.input_size_per_partition
            lora_a = lora_a[:, tp_rank * columns : (tp_rank + 1) * columns]
        device = module.weight.device
        adapter = LoraAdapter(
            lora_a.contiguous().to(device),
            lora_b.contiguous().to(device),
            column,
            spec,
            bool(module.sequence_parallel),
            module.tp_group,
        )
        module.requires_grad_(False)
        module.add_module(ADAPTER, adapter)
        module.register_forward_hook(_add_adapter_output, with_kwargs=True)
        count += 1
    for name, param in model.named_parameters():
        param.requires_grad_(name.endswith((LORA_A, LORA_B)))
    return count


def merge_adapters(
    weights: Iterable[tuple[Tag, str, torch.Tensor]],
    scale: float,
    adapted: Callable[[Tag, str], bool],
) -> Iterator[tuple[Tag, str, torch.Tensor]]:
    """``weights`` (``(tag, parameter name, this rank's shard)``, in any order) with each
    adapted linear's weight replaced by ``W + scale * B @ A`` (a new tensor: the training
    weights are untouched) and its adapter left out; ``adapted(tag, module name)``: whether that
    linear has an adapter, so that its weight waits for ``A`` and ``B``."""
    pending: dict[tuple[Any, str], dict[str, Any]] = {}
    for tag, name, tensor in weights:
        module, part = _part(name)
        if module is None or not adapted(tag, module):
            yield tag, name, tensor
            continue
        parts = pending.setdefault((tag, module), {})
        parts[part] = tensor
        if len(parts) < 3:
            continue
        del pending[(tag, module)]
        base, a, b = parts["weight"], parts["A"], parts["B"]
        yield tag, f"{module}.weight", base + scale * (b.to(base.dtype) @ a.to(base.dtype))
    if pending:
        left = sorted(module for _, module in pending)
        raise RuntimeError(f"LoRA layers left unmerged (a weight or adapter missing): {left[:3]}")


def _part(name: str) -> tuple[str | None, str]:
    """``(module, "weight" | "A" | "B")`` for a linear's weight or adapter, else ``(None, "")``."""
    for suffix, part in ((LORA_A, "A"), (LORA_B, "B"), (".weight", "weight")):
        if name.endswith(suffix):
            module = name[: -len(suffix)]
            if module.rpartition(".")[2] in LINEARS:
                return module, part
    return None, ""


def merged_state(state: dict[str, Any], scale: float) -> dict[str, Any]:
    """One rank's saved weights (a checkpoint shard's ``model``) with every adapter merged into
    its linear's weight (:func:`merge_adapters`); the adapted linears are those with an ``A``."""
    adapted = {name.removesuffix(LORA_A) for name in state if name.endswith(LORA_A)}
    merged = merge_adapters(
        ((None, name, tensor) for name, tensor in state.items()),
        scale,
        lambda _, module: module in adapted,
    )
    return {name: tensor for _, name, tensor in merged}
