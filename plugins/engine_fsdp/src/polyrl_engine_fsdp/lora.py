"""LoRA adapters on the actor (peft), and the weights a LoRA engine hands out.

peft wraps the Hugging Face model before ``fully_shard`` (so FSDP2 shards the adapters with
their layers) and freezes every base weight; only ``lora_A``/``lora_B`` train. Two views of the
trained model leave the engine:

- :func:`merge_stream`: the model as the rollout engine knows it, ``W + alpha / r * B @ A`` per
  adapted linear layer under the base model's Hugging Face names. Each merged tensor is a new
  tensor computed while streaming, so the training weights are never modified (peft's own
  ``merge_adapter`` writes into them, which a sharded, still-training model cannot afford);
- the adapters alone (:func:`adapter_names`, under peft's saved names by :func:`saved_name`):
  for checkpoints, the HF export's adapter folder (:func:`write_adapter_folder`) and rollout
  engines that load adapters.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from polyrl.api import ConfigError
from polyrl_engine_kit.config import LoraSettings

ADAPTER = "default"  # peft's name of the one adapter the engine trains
PEFT_PREFIX = "base_model.model."
BASE_LAYER = ".base_layer"
ADAPTER_WEIGHTS = "adapter_model.safetensors"


def apply_lora(model: nn.Module, lora: LoraSettings) -> nn.Module:
    """``model`` wrapped by peft with fresh adapters (``B = 0``: the wrapped model computes what
    ``model`` did), or with ``lora.adapter_path``'s saved adapters (verl's
    ``lora_adapter_path``: training continues from them); only the adapters require grad.
    ``lora.exclude_modules`` leaves the matching modules without an adapter."""
    from peft import LoraConfig, PeftModel, get_peft_model
    from peft.tuners.lora import Linear as LoraLinear
    from peft.tuners.tuners_utils import BaseTunerLayer

    targets = (
        lora.target_modules if isinstance(lora.target_modules, str) else list(lora.target_modules)
    )
    excluded = lora.exclude_modules
    try:
        if lora.adapter_path is not None:
            peft_model = PeftModel.from_pretrained(
                model, lora.adapter_path, adapter_name=ADAPTER, is_trainable=True
            )
        else:
            config = LoraConfig(
                task_type="CAUSAL_LM",
                r=lora.rank,
                lora_alpha=lora.alpha,
                lora_dropout=lora.dropout,
                target_modules=targets,
                exclude_modules=excluded if isinstance(excluded, str | None) else list(excluded),
                bias="none",
            )
            peft_model = get_peft_model(model, config)
    except ValueError as exc:  # peft: no module matched target_modules (less exclusions)
        less = f" less exclude_modules={excluded!r}" if excluded else ""
        source = f" (the adapter {lora.adapter_path}'s)" if lora.adapter_path else ""
        raise ConfigError(
            f"actor_rollout_ref.model.target_modules={targets!r}{less}{source} selects no layer "
            f"of {type(model).__name__} ({' '.join(str(exc).split())[:300]}); use all-linear or "
            f"names of its linear layers, e.g. [q_proj,v_proj]"
        ) from exc
    other = sorted(
        {
            type(m).__name__
            for m in peft_model.modules()
            if isinstance(m, BaseTunerLayer) and not isinstance(m, LoraLinear)
        }
    )
    if other:
        raise ConfigError(
            f"actor_rollout_ref.model.target_modules={targets!r} selects non-linear layers "
            f"({', '.join(other)}); the FSDP engine's LoRA adapts linear layers only: use "
            f"all-linear or names of linear layers"
        )
    return peft_model


def lora_scalings(model: nn.Module) -> dict[str, float]:
    """``alpha / r`` of each adapted layer, by the layer's module name in ``model``."""
    from peft.tuners.lora import Linear as LoraLinear

    return {
        name: float(module.scaling[ADAPTER])
        for name, module in model.named_modules()
        if isinstance(module, LoraLinear)
    }


def adapter_names(model: nn.Module) -> set[str]:
    """State-dict names of the trainable tensors (the adapters), as the engine holds them."""
    return {name for name, param in model.named_parameters() if param.requires_grad}


def hf_name(name: str) -> str:
    """The base model's Hugging Face name of a base tensor of the peft model:
    ``base_model.model.model.layers.0.mlp.up_proj.base_layer.weight`` ->
    ``model.layers.0.mlp.up_proj.weight``."""
    return name.removeprefix(PEFT_PREFIX).replace(BASE_LAYER + ".", ".")


def saved_name(name: str) -> str:
    """peft's saved name of an adapter tensor (without the adapter's name), as in
    ``adapter_model.safetensors``: ``...q_proj.lora_A.default.weight`` ->
    ``...q_proj.lora_A.weight``."""
    return name.replace(f".{ADAPTER}.", ".")


def merge_stream(
    model: nn.Module, full: Iterator[tuple[str, torch.Tensor]]
) -> Iterator[tuple[str, torch.Tensor]]:
    """The merged model from ``full``, the peft model's state dict as full tensors (in any
    order): adapter tensors are held until their layer's base weight, ``A`` and ``B`` have all
    passed, then ``W + scaling * B @ A`` is yielded as a new tensor; every other tensor passes
    through under its Hugging Face name."""
    scalings = lora_scalings(model)
    pending: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in full:
        layer, part = _lora_part(name, scalings)
        if layer is None:
            yield hf_name(name), tensor
            continue
        parts = pending.setdefault(layer, {})
        parts[part] = tensor
        if len(parts) == 3:
            del pending[layer]
            base, a, b = parts["base"], parts["A"], parts["B"]
            merged = base + scalings[layer] * (b.to(base.dtype) @ a.to(base.dtype))
            yield hf_name(f"{layer}{BASE_LAYER}.weight"), merged
    if pending:
        raise RuntimeError(f"LoRA layers left unmerged (missing tensors): {sorted(pending)[:3]}")


def _lora_part(name: str, scalings: dict[str, float]) -> tuple[str | None, str]:
    """``(layer, "base" | "A" | "B")`` for the weight tensors of an adapted layer, else
    ``(None, "")`` (biases of adapted layers pass through unmerged)."""
    for suffix, part in (
        (f"{BASE_LAYER}.weight", "base"),
        (f".lora_A.{ADAPTER}.weight", "A"),
        (f".lora_B.{ADAPTER}.weight", "B"),
    ):
        if name.endswith(suffix) and name[: -len(suffix)] in scalings:
            return name[: -len(suffix)], part
    return None, ""


def write_adapter_folder(path: str, model: nn.Module, adapters: dict[str, torch.Tensor]) -> None:
    """``path`` as peft's ``save_pretrained`` lays out an adapter: ``adapter_config.json`` and
    ``adapter_model.safetensors`` (``adapters``: full tensors by peft's saved names), loadable
    with ``peft.PeftModel.from_pretrained(base_model, path)``."""
    from safetensors.torch import save_file

    os.makedirs(path, exist_ok=True)
    config: Any = model.peft_config[ADAPTER]  # type: ignore[index]
    config.save_pretrained(path)
    tensors = {k: v.detach().cpu().contiguous() for k, v in adapters.items()}
    save_file(tensors, os.path.join(path, ADAPTER_WEIGHTS), metadata={"format": "pt"})
