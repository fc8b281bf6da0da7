"""Shard the Hugging Face model with FSDP2 (``fully_shard``).

Each decoder layer (the model's ``_no_split_modules`` classes) becomes its own FSDP unit, so
only one layer's full weights exist at a time; the root unit holds the rest: embeddings, final
norm and ``lm_head``. Tied embeddings (``lm_head.weight is embed_tokens.weight``, as in SmolLM2
and small Qwen2) stay one parameter because both modules live in the root unit.

Loading the model is shared by the engines (:mod:`polyrl_engine_kit.modeling`); its names are
still found here, with a deprecation warning.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, fully_shard

from polyrl.api import ConfigError
from polyrl_engine_kit import modeling as kit_modeling
from polyrl_engine_kit.config import EngineSettings
from polyrl_engine_kit.moved import moved_names

__getattr__ = moved_names(
    __name__,
    "polyrl_engine_kit.modeling",
    {"torch_dtype", "load_hf_config", "load_hf_model", "decoder_layers"},
)


def shard_model(
    model: nn.Module, settings: EngineSettings, device: torch.device
) -> tuple[nn.Module, DeviceMesh]:
    """Apply ``fully_shard`` to every decoder layer, then to the root, over :func:`fsdp_mesh`."""
    mesh = fsdp_mesh(device, dist.get_world_size(), settings.fsdp_size)
    kwargs: dict[str, Any] = {"mesh": mesh, "reshard_after_forward": settings.reshard_after_forward}
    policy = precision_policy(settings)
    if policy is None and len({p.dtype for p in model.parameters()}) > 1:
        # peft keeps adapters in float32 on bf16 master weights; FSDP2 gathers one dtype per unit
        compute = compute_dtype(settings)
        policy = MixedPrecisionPolicy(param_dtype=compute, reduce_dtype=compute)
    if policy is not None:
        kwargs["mp_policy"] = policy
    if settings.buffer_dtype is not None:
        cast_buffers(model, kit_modeling.torch_dtype(settings.buffer_dtype))
    if settings.param_offload and device.type == "cuda":
        kwargs["offload_policy"] = CPUOffloadPolicy()
    for layer in kit_modeling.decoder_layers(model):
        fully_shard(layer, **kwargs)
    fully_shard(model, **kwargs)
    return model, mesh


def compute_dtype(settings: EngineSettings) -> torch.dtype:
    """The dtype the forward and backward compute in: verl's ``mixed_precision.param_dtype``
    when set, else ``actor_rollout_ref.model.dtype`` under ``mixed_precision=true``, else the
    master weights' own (``fsdp_config.model_dtype``)."""
    if settings.param_dtype is not None:
        return kit_modeling.torch_dtype(settings.param_dtype)
    if settings.mixed_precision:
        return kit_modeling.torch_dtype(settings.dtype)
    return kit_modeling.torch_dtype(settings.master_dtype)


def precision_policy(settings: EngineSettings) -> MixedPrecisionPolicy | None:
    """FSDP2's mixed precision for these settings: weights gathered in :func:`compute_dtype`,
    gradients reduced in ``reduce_dtype`` (float32 unless verl's ``mixed_precision.reduce_dtype``
    says otherwise) and kept in the master dtype. None when everything is already in the master
    dtype (nothing to cast)."""
    master = kit_modeling.torch_dtype(settings.master_dtype)
    compute = compute_dtype(settings)
    if settings.reduce_dtype is not None:
        reduce = kit_modeling.torch_dtype(settings.reduce_dtype)
    else:
        reduce = torch.float32
    if compute == master and reduce == master:
        return None
    return MixedPrecisionPolicy(param_dtype=compute, reduce_dtype=reduce)


def freeze_in_compute_dtype(model: nn.Module, settings: EngineSettings) -> None:
    """Keep a frozen model's parameters in :func:`compute_dtype` (no grad, nothing steps them).

    Why: a master copy exists for the optimizer; a frozen model (the reference) has none, so
    fp32 master weights would only cost twice the memory and a cast of every layer on each
    forward's gather. The values are the same: FSDP2's mixed precision casts the same fp32
    tensors to the same dtype each time, here once. Buffers (rotary frequencies) keep their
    dtype, as under mixed precision. verl loads its reference in bf16 too."""
    compute = compute_dtype(settings)
    for param in model.parameters():
        if param.is_floating_point() and param.dtype != compute:
            param.data = param.data.to(compute)


def cast_buffers(model: nn.Module, dtype: torch.dtype) -> None:
    """Cast the model's floating-point buffers to ``dtype`` (verl's ``buffer_dtype``): FSDP2
    casts parameters only, so buffers are converted once, before sharding."""
    for module in model.modules():
        for name, buffer in module.named_buffers(recurse=False):
            if buffer is not None and buffer.is_floating_point():
                setattr(module, name, buffer.to(dtype))


def fsdp_mesh(device: torch.device, world_size: int, fsdp_size: int) -> DeviceMesh:
    """The device mesh FSDP2 shards over. verl's ``fsdp_size`` <= 0 (or the world size): one
    dimension, every parameter sharded over all ranks. A divisor of the world below it: hybrid
    sharding (HSDP), a 2-D mesh ``(replicate, shard)`` whose rows are groups of ``fsdp_size``
    consecutive ranks; each group holds a full sharded copy, and gradients are reduce-scattered
    within a group and all-reduced across groups. Why: on many nodes, sharding within a node
    keeps the per-layer all-gathers on the fast links. The checks refuse a size that does not
    divide the world; one reaching here is an error, not silently ignored."""
    if fsdp_size <= 0 or fsdp_size == world_size:
        return init_device_mesh(device.type, (world_size,))
    if fsdp_size > world_size or world_size % fsdp_size:
        raise ConfigError(
            f"fsdp_config.fsdp_size={fsdp_size} does not divide the {world_size} ranks: use a "
            f"divisor of {world_size}, or -1 to shard over all of them"
        )
    return init_device_mesh(
        device.type,
        (world_size // fsdp_size, fsdp_size),
        mesh_dim_names=("replicate", "shard"),
    )


def reshard_all(model: nn.Module) -> None:
    """Return every FSDP unit to its sharded state (after a forward that kept weights whole,
    e.g. ``reshard_after_forward=False`` under ``no_grad``), before reading the state dict."""
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()


# fsdp_config.accumulate_unsharded=auto keeps the full weights and gradients when they take at
# most this share of the GPU's memory.
UNSHARDED_MEMORY_SHARE = 0.10


def accumulates_unsharded(model: nn.Module, settings: EngineSettings, device: torch.device) -> bool:
    """Whether a step keeps the layers gathered between micro-batches (:class:`StepGathering`):
    ``fsdp_config.accumulate_unsharded``, or under ``auto`` on CUDA when the full weights (in
    the compute dtype) and the full float32 gradients of the trained ones fit
    :data:`UNSHARDED_MEMORY_SHARE` of the GPU."""
    if not hasattr(model, "set_reshard_after_backward") or settings.param_offload:
        return False  # offloaded weights live on the CPU between uses by design
    if settings.accumulate_unsharded is not None:
        return settings.accumulate_unsharded
    if device.type != "cuda":
        return False
    weight_bytes = compute_dtype(settings).itemsize
    params = sum(p.numel() for p in model.parameters())
    trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
    needed = weight_bytes * params + 4 * trained
    return needed <= UNSHARDED_MEMORY_SHARE * torch.cuda.get_device_properties(device).total_memory


class StepGathering:
    """FSDP2 within one step (``with StepGathering(...) as gathering``): with ``enabled``, each
    layer's weights are gathered once and kept until the step's last backward, and gradients
    accumulate unsharded in float32 (FSDP2 accumulates in the reduce dtype), reduce-scattered
    once after the last micro-batch; otherwise FSDP2's default (gather per forward and
    backward, reduce-scatter per backward).

    Why: per micro-batch, each layer's gather and reduce-scatter cost host time even on one GPU
    and bandwidth on several; for models small next to the GPU that is the step's overhead.
    ``backward`` must run the backward of every one of the step's ``micro_batches`` (without
    grad, for a forward-only loop, it is never called).
    """

    def __init__(
        self, model: nn.Module, enabled: bool, micro_batches: int, reshard_after_forward: bool
    ) -> None:
        self.model: Any = model
        self.enabled = enabled
        self.remaining = micro_batches
        self.reshard_after_forward = reshard_after_forward

    def __enter__(self) -> StepGathering:
        if self.enabled:
            self.model.set_reshard_after_forward(False)
            self.model.set_reshard_after_backward(False)
            self.model.set_requires_gradient_sync(False)
        return self

    def backward(self, loss: torch.Tensor) -> None:
        self.remaining -= 1
        if self.enabled and self.remaining == 0:  # the last: reduce, then free the gathered
            self.model.set_requires_gradient_sync(True)
            self.model.set_reshard_after_backward(True)
        loss.backward()

    def __exit__(self, *exc: object) -> None:
        if not self.enabled:
            return
        self.model.set_requires_gradient_sync(True)
        self.model.set_reshard_after_backward(True)
        self.model.set_reshard_after_forward(self.reshard_after_forward)
        # The root keeps its weights from forward to backward, FSDP2's own choice for it.
        self.model.set_reshard_after_forward(False, recurse=False)
        reshard_all(self.model)
