"""Load a Hugging Face model (and its config) as every engine trains it: float32 master weights,
``override_config`` applied, optional gradient checkpointing.

A value model (a critic) is ``AutoModelForTokenClassification`` with one label: loaded from a
causal-LM checkpoint it takes the backbone's weights and gets a fresh linear ``score`` head (the
checkpoint's ``lm_head`` is left out), which is how verl builds its critic.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from torch import nn

from polyrl.api import ConfigError, ModelHead
from polyrl_engine_kit.config import EngineSettings

_CONFIG_KWARGS = ("attn_implementation",)


def torch_dtype(name: str) -> torch.dtype:
    return {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[name]


def load_hf_config(model_path: str, settings: EngineSettings) -> Any:
    """The model's config with ``override_config`` applied (keys set as attributes)."""
    from transformers import AutoConfig

    if not os.path.isdir(model_path):
        raise ConfigError(
            f"actor_rollout_ref.model.path={model_path!r} is not a local folder; the engines "
            f"load a Hugging Face folder (polyrl resolves hub ids and .gguf files before this)"
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
    master_dtype: torch.dtype = torch.float32,
) -> nn.Module:
    """The model with ``head`` in ``master_dtype`` (the master weights the optimizer steps:
    float32 unless the FSDP engine's ``fsdp_config.model_dtype`` asks otherwise) on
    ``device``."""
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
        dtype=master_dtype,
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
            f"is {sorted(names)}); the engines shard Hugging Face causal LMs that declare them"
        )
    return layers
