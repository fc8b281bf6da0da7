"""verl's ``megatron.override_transformer_config``: keys of megatron-core's ``TransformerConfig``
a user sets over the engine's. Light on purpose (no torch, no megatron): ``polyrl validate``
judges them.

Each key is one of:

- **recompute** (``recompute_granularity``, ``recompute_method``, ``recompute_num_layers``,
  ``recompute_modules``): translated into the engine's own activation recompute, torch's
  non-reentrant checkpoint under the forward's autocast (megatron-core's recompute would redo
  the bf16 forward in float32 with the engine's float32 weights, see :mod:`.model`). ``full``
  with ``uniform`` recomputes every decoder layer, one checkpoint per layer whatever
  ``recompute_num_layers`` (megatron-core keeps one input per chunk of that many layers: the
  same recompute, a hidden state per layer more kept); ``full`` with ``block`` recomputes the
  first ``recompute_num_layers`` layers of each pipeline stage; ``selective`` recomputes the
  named submodules of every layer (``core_attn``, ``mlp``, ``layernorm``); the MoE and MLA
  modules it may name do not exist in the dense models the engine builds.
- **set by the model or the engine** (sizes, normalization, dtypes, the loss's scaling): the
  HF checkpoint and the engine fix these; an override is refused.
- **uneven pipeline stages** (``num_layers_in_first/last_pipeline_stage``,
  ``account_for_*_in_pipeline_split``): passed to ``TransformerConfig``, and the engine's own
  stage layout (:class:`.convert.StageSplit`: weight conversion, streaming, checkpoints) follows
  them; they need ``pipeline_model_parallel_size`` > 1. megatron-core's explicit
  ``pipeline_model_parallel_layout`` is refused.
- **no effect** (Transformer Engine / apex fusions, ``attention_backend``, MoE kernels and
  token dispatchers: grouped GEMM, permute fusion, DeepEP, ``moe_token_dispatcher_type``): the
  engine's local layer spec has no fused kernels to switch on (its core attention is its own),
  and a MoE model's tokens go through megatron-core's all-to-all dispatcher (the one that takes
  micro-batches of any length); the same experts compute the same outputs either way; accepted
  with a note.
- anything else, the other MoE settings among them (``moe_router_dtype``, an auxiliary loss):
  passed to ``TransformerConfig`` as given (megatron-core ignores MoE settings for a dense
  model, and refuses a key it does not have when the engine is built).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

RECOMPUTE_KEYS = (
    "recompute_granularity",
    "recompute_method",
    "recompute_num_layers",
    "recompute_modules",
)
SET_BY_MODEL = (
    "num_layers",
    "hidden_size",
    "num_attention_heads",
    "num_query_groups",
    "kv_channels",
    "ffn_hidden_size",
    "normalization",
    "layernorm_epsilon",
    "gated_linear_unit",
    "activation_func",
    "add_bias_linear",
    "add_qkv_bias",
    "hidden_dropout",
    "attention_dropout",
    "tensor_model_parallel_size",
    "pipeline_model_parallel_size",
    "context_parallel_size",
    "expert_model_parallel_size",
    "pipeline_dtype",
    "params_dtype",
    "bf16",
    "fp16",
    "variable_seq_lengths",
    "calculate_per_token_loss",
    "perform_initialization",
)
UNEVEN_STAGES = (
    "num_layers_in_first_pipeline_stage",
    "num_layers_in_last_pipeline_stage",
    "account_for_embedding_in_pipeline_split",
    "account_for_loss_in_pipeline_split",
)
LAYOUT = "pipeline_model_parallel_layout"
NO_EFFECT = (
    "masked_softmax_fusion",
    "bias_activation_fusion",
    "bias_dropout_fusion",
    "apply_rope_fusion",
    "persist_layer_norm",
    "gradient_accumulation_fusion",
    "cross_entropy_loss_fusion",
    "attention_backend",
    "deallocate_pipeline_outputs",
    "moe_grouped_gemm",
    "moe_permute_fusion",
    "moe_enable_deepep",
    "moe_token_dispatcher_type",
    "moe_shared_expert_overlap",
)
SELECTIVE_MODULES = ("core_attn", "mlp", "layernorm")
ABSENT_MODULES = ("moe_act", "moe", "shared_experts", "mla_up_proj")
GRANULARITIES = (None, "full", "selective")
KEY = "actor_rollout_ref.actor.megatron.override_transformer_config"
METHODS = (None, "uniform", "block")


@dataclass(frozen=True)
class Recompute:
    """Which activations the backward recomputes: whole decoder layers (``layers``: all with
    None, else the first ``layers`` of each stage), or submodules of every layer."""

    full: bool = False
    layers: int | None = None
    modules: tuple[str, ...] = ()

    def layer_recomputed(self, index: int) -> bool:
        """Whether the stage's decoder layer ``index`` is recomputed as a whole."""
        return self.full and (self.layers is None or index < self.layers)


def split(
    overrides: Mapping[str, Any], where: str = KEY
) -> tuple[dict[str, Any], list[str], list[str]]:
    """``(TransformerConfig keys to pass, problems, notices)`` for the override dict at config
    key ``where``; ``problems`` and ``notices`` are one line each."""
    passed: dict[str, Any] = {}
    problems: list[str] = []
    notices: list[str] = []
    for key, value in overrides.items():
        if key in RECOMPUTE_KEYS:
            continue
        if key in SET_BY_MODEL:
            problems.append(
                f"{where}.{key}={value}: the Megatron engine sets {key} from the model's HF "
                f"config and its own settings; remove it"
            )
        elif key == LAYOUT:
            if value is not None:
                problems.append(
                    f"{where}.{key}={value} asks for megatron-core's explicit pipeline layout "
                    f"(verl); polyrl does not support it: use num_layers_in_first/last_pipeline_"
                    f"stage or account_for_embedding/loss_in_pipeline_split"
                )
        elif key in UNEVEN_STAGES:
            if value not in (None, False):
                passed[key] = value
        elif key in NO_EFFECT:
            notices.append(
                f"{where}.{key}={value} (verl) has no effect in polyrl: the Megatron engine's "
                f"local layer spec has no Transformer Engine, apex or DeepEP kernels and its MoE "
                f"layers dispatch tokens all-to-all"
            )
        else:
            passed[key] = value
    _, recompute_problems = recompute_plan(overrides, gradient_checkpointing=False, where=where)
    return passed, problems + recompute_problems, notices + _absent_modules(overrides, where)


def uneven_stage_problems(
    overrides: Mapping[str, Any], pipeline_parallel: Any, where: str = KEY
) -> list[str]:
    """The uneven-stage keys of ``overrides`` need several stages; their values are checked
    against the model's layers when the engine is built (:func:`.convert.stage_layer_counts`)."""
    given = {k: v for k, v in overrides.items() if k in UNEVEN_STAGES and v not in (None, False)}
    if not given or pipeline_parallel != 1:
        return []
    keys = ", ".join(f"{k}={v}" for k, v in given.items())
    return [
        f"{where}.{{{keys}}} places layers on pipeline stages, but pipeline_model_parallel_size "
        f"is 1; remove them or set pipeline_model_parallel_size > 1"
    ]


def recompute_plan(
    overrides: Mapping[str, Any], *, gradient_checkpointing: bool, where: str = KEY
) -> tuple[Recompute, list[str]]:
    """The recompute the override dict asks for (``model.enable_gradient_checkpointing`` adds
    every layer), and its problems."""
    granularity = overrides.get("recompute_granularity")
    method = overrides.get("recompute_method")
    layers = overrides.get("recompute_num_layers")
    modules = overrides.get("recompute_modules", ["core_attn"])
    problems = []
    if granularity not in GRANULARITIES:
        problems.append(f"{where}.recompute_granularity={granularity}: use full or selective")
    if method not in METHODS:
        problems.append(f"{where}.recompute_method={method}: use uniform or block")
    if granularity == "full" and method is None:
        problems.append(
            f"{where}.recompute_granularity=full needs recompute_method=uniform or block, as in "
            f"megatron-core"
        )
    if granularity == "full" and not (isinstance(layers, int) and layers >= 1):
        problems.append(f"{where}.recompute_num_layers={layers}: give a positive number of layers")
    if not isinstance(modules, (list, tuple)) or any(
        m not in SELECTIVE_MODULES + ABSENT_MODULES for m in modules
    ):
        problems.append(
            f"{where}.recompute_modules={modules}: name some of "
            f"{', '.join(SELECTIVE_MODULES + ABSENT_MODULES)}"
        )
        modules = []
    if problems:
        return Recompute(full=gradient_checkpointing), problems
    if gradient_checkpointing or (granularity == "full" and method == "uniform"):
        return Recompute(full=True), []
    if granularity == "full":
        return Recompute(full=True, layers=int(layers)), []
    if granularity == "selective":
        return Recompute(modules=tuple(m for m in modules if m in SELECTIVE_MODULES)), []
    return Recompute(), []


def _absent_modules(overrides: Mapping[str, Any], where: str) -> list[str]:
    modules = overrides.get("recompute_modules", ["core_attn"])
    if overrides.get("recompute_granularity") != "selective" or not isinstance(modules, list):
        return []
    absent = [m for m in modules if m in ABSENT_MODULES]
    if not absent:
        return []
    return [
        f"{where}.recompute_modules={modules} (verl): {', '.join(absent)} has no effect in "
        f"polyrl; the Megatron engine's dense models have no such module"
    ]
