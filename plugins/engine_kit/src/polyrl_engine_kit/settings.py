"""The config keys the kit reads for every engine built on it, as a config section: LoRA on the
actor, at verl's place (``actor_rollout_ref.model.lora_rank`` and its siblings).

The kit registers no plugin, and a section is mounted into the schema through a registered
spec (:mod:`polyrl.config.sections`): each engine built on the kit declares
:data:`LORA_SECTIONS` in its spec's ``config_sections`` (or, where it has its own keys under
``actor_rollout_ref.model``, a subclass of :class:`LoraModelSettings`). The keys are read by
the kit for every such engine (:func:`polyrl_engine_kit.config.resolve_settings` and
:func:`polyrl_engine_kit.checks.node_problems`), so they exist whenever one is installed, and an
engine that does not train adapters is refused by name (``supports_lora``), not as an unknown
key. What LoRA means for a run (the reference, weight sync, the banner) is core's
:mod:`polyrl.lora`, which reads the rank as 0 where no installed plugin declares it.

Light on purpose (no torch): every composed config imports it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

MODEL = "actor_rollout_ref.model"


@dataclass
class LoraModelSettings:
    """LoRA on the actor. ``lora_rank`` 0: full fine-tuning. With LoRA the reference is the same
    model with its adapters off, and weight sync sends merged weights (or the adapters, to a
    rollout engine whose plugin declares ``supports_lora_adapters``). The update is scaled by
    ``lora_alpha / lora_rank``; ``target_modules`` is a list of module names or ``all-linear``;
    ``exclude_modules`` (verl's, peft's): modules left without an adapter among those
    targeted, a regex matched against the full module name or a list of names.
    ``lora_adapter_path`` (verl's): a saved peft adapter folder to start from, its weights and
    its rank, alpha, dropout, targets and exclusions (``adapter_config.json``; ``lora_rank``
    may stay 0). With LoRA the HF export (``trainer.export_hf_model``) is the adapter folder;
    ``export_merged_lora``: also the merged model (base + adapters) in its subfolder
    ``merged/``."""

    lora_rank: int = 0
    lora_alpha: float = 16.0
    target_modules: Any = "all-linear"
    exclude_modules: Any = None
    lora_dropout: float = 0.0
    lora_adapter_path: Any = None
    export_merged_lora: bool = False


LORA = "polyrl_engine_kit.settings:LoraModelSettings"
#: For an engine spec's ``config_sections`` (merged with its own: ``{**LORA_SECTIONS, ...}``).
LORA_SECTIONS = {MODEL: LORA}
