"""Build the Hugging Face model and shard it with FSDP2 (``fully_shard``).

Each decoder layer (the model's ``_no_split_modules`` classes) becomes its own FSDP unit, so
only one layer's full weights exist at a time; the root unit holds the rest: embeddings, final
norm and ``lm_head``. Tied embeddings (``lm_head.weight is embed_tokens.weight``, as in SmolLM2
and small Qwen2) stay one parameter because both modules live in the root unit.

A value model (a critic) is ``AutoModelForTokenClassification`` with one label: loaded from a
causal-LM checkpoint it takes the backbone's weights and gets a fresh linear ``score`` head (the
checkpoint's ``lm_head`` is left out), which is how verl builds its critic.
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, fully_shard

from polyrl.api import ConfigError, ModelHead
from polyrl_engine_fsdp.config import EngineSettings

_CONFIG_KWARGS = ("attn_implementation",)


def torch_dtype(name: str) -> torch.dtype:
    return {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[name]


def load_hf_config(model_path: str, settings: EngineSettings) -> Any:
    """The model's config with ``override_config`` applied (keys set as attributes)."""
    from transformers import AutoConfig

    if not os.path.isdir(model_path):
        raise ConfigError(
            f"actor_rollout_ref.model.path={model_path!r} is not a local folder; the FSDP engine "
            f"loads a Hugging Face folder (polyrl resolves hub ids and .gguf files before this)"
        )
    config = AutoConfig.from_pretrained(model_path, trust_remote_code=settings.trust_remote_code)
    for key, value in settings.override_config.items():
        if key in _CONFIG_KWARGS:
            continue
        setattr(config, key, value)
    config.use_cache = False
    return config


def load_hf_model(
    model_path: str,
    settings: EngineSettings,
    device: torch.device,
    head: ModelHead = ModelHead.CAUSAL_LM,
) -> nn.Module:
    """The model with ``head`` in float32 (the master weights) on ``device``."""
    from transformers import AutoModelForCausalLM, AutoModelForTokenClassification

    config = load_hf_config(model_path, settings)
    kwargs: dict[str, Any] = {}
    for key in _CONFIG_KWARGS:
        if key in settings.override_config:
            kwargs[key] = settings.override_config[key]
    auto_class: Any = AutoModelForCausalLM
    if head is ModelHead.VALUE:
        auto_class = AutoModelForTokenClassification
        config.num_labels = 1
        config.classifier_dropout = 0.0  # values are regressed: no noise on the head's input
    model = auto_class.from_pretrained(
        model_path,
        config=config,
        dtype=torch.float32,
        trust_remote_code=settings.trust_remote_code,
        **kwargs,
    )
    if settings.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model.to(device)


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The repeated blocks to shard one by one, found through ``_no_split_modules``."""
    names = set(getattr(model, "_no_split_modules", None) or ())
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if not layers:
        raise ConfigError(
            f"cannot find the decoder layers of {type(model).__name__} (its _no_split_modules "
            f"is {sorted(names)}); the FSDP engine shards Hugging Face causal LMs that declare them"
        )
    return layers


def shard_model(
    model: nn.Module, settings: EngineSettings, device: torch.device
) -> tuple[nn.Module, DeviceMesh]:
    """Apply ``fully_shard`` to every decoder layer, then to the root."""
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    kwargs: dict[str, Any] = {"mesh": mesh, "reshard_after_forward": settings.reshard_after_forward}
    compute = torch_dtype(settings.dtype)
    if settings.mixed_precision and compute != torch.float32:
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=compute, reduce_dtype=torch.float32)
    if settings.param_offload and device.type == "cuda":
        kwargs["offload_policy"] = CPUOffloadPolicy()
    for layer in decoder_layers(model):
        fully_shard(layer, **kwargs)
    fully_shard(model, **kwargs)
    return model, mesh


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
    weight_bytes = torch_dtype(settings.dtype).itemsize if settings.mixed_precision else 4
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
