"""Build megatron-core's GPTModel for a Hugging Face Qwen2/Llama (or Qwen2-MoE/Qwen3-MoE, its MoE
blocks as megatron-core's MoE layers: :mod:`.moe`) checkpoint and load its weights.

The model uses the local layer spec (megatron-core's own modules: no Transformer Engine, no
apex). Its parameters are float32, the master weights the optimizer updates; the forward runs
under ``torch.autocast`` in ``actor_rollout_ref.model.dtype``, which is how the FSDP engine's
mixed precision computes too (bf16 matmuls, float32 weights and reductions). Dropout is off (RL
fine-tuning scores exact log-probs) and every kernel fusion that needs apex or a fixed mask is
off. The model has no position embedding of its own: the core attention (:mod:`.attention`)
rotates queries and keys at each token's HF position and runs torch's SDPA under polyrl's
padding mask, or flash varlen attention over a packed row.

With pipeline parallelism each stage builds its run of layers (``pre_process`` on the first,
``post_process`` on the last) and the activations passed between stages are float32: the
residual stream is float32 under autocast (float32 weights), and
``variable_seq_lengths`` lets every micro-batch have its own shape (the stages exchange it
first). Losses are per token already (polyrl's losses divide by the mini-batch's tokens), so
megatron's schedule must not divide them again (``calculate_per_token_loss``).

Gradient checkpointing (``model.enable_gradient_checkpointing``, or the recompute keys of
``megatron.override_transformer_config``, :mod:`.transformer_overrides`) wraps decoder layers
or their submodules in torch's non-reentrant checkpoint, not megatron-core's recompute:
megatron's ``CheckpointFunction`` re-runs the layer in the backward outside the forward's
``torch.autocast``, so with float32 weights the recompute would run in float32 and the
gradients would be those of another computation than the bf16 forward (torch's checkpoint
restores the autocast state; megatron expects bf16 weights instead).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from polyrl.api import ConfigError
from polyrl_engine_kit.compiling import recomputed_in_backward
from polyrl_engine_megatron.attention import sdpa_core_attention
from polyrl_engine_megatron.convert import GPTShape, PipelineStage, hf_to_megatron, stage_shards
from polyrl_engine_megatron.moe import local_experts
from polyrl_engine_megatron.sequence_parallel import norm_class
from polyrl_engine_megatron.transformer_overrides import Recompute


def init_model_parallel(
    tensor_parallel: int,
    pipeline_parallel: int,
    seed: int,
    virtual: int | None = None,
    expert_parallel: int = 1,
    context_parallel: int = 1,
) -> None:
    """megatron-core's process groups on the default group (once per process: the actor and
    the reference of one worker share them) and its tensor-parallel RNG tracker; ``virtual``:
    model chunks per stage (interleaved pipeline parallelism); ``expert_parallel``: ranks a MoE
    layer's experts are spread over, out of the TP x DP ranks of a stage (expert tensor
    parallelism 1: each expert whole on its rank); ``context_parallel``: ranks that share each
    micro-batch's tokens (:mod:`.context_parallel`; megatron-core's model config keeps 1, its
    own context parallelism being Transformer Engine's)."""
    from megatron.core import parallel_state
    from megatron.core import tensor_parallel as mcore_tp

    if parallel_state.model_parallel_is_initialized():
        sizes = (
            parallel_state.get_tensor_model_parallel_world_size(),
            parallel_state.get_pipeline_model_parallel_world_size(),
            parallel_state.get_virtual_pipeline_model_parallel_world_size(),
            parallel_state.get_expert_model_parallel_world_size(),
            parallel_state.get_context_parallel_world_size(),
        )
        wanted = (tensor_parallel, pipeline_parallel, virtual, expert_parallel, context_parallel)
        if sizes != wanted:
            raise ConfigError(
                f"megatron-core is already split TP x PP = {sizes[0]} x {sizes[1]} (virtual "
                f"{sizes[2]}, expert {sizes[3]}, context {sizes[4]}) in this process; every "
                f"megatron role of a pool must use the same actor_rollout_ref.actor.megatron sizes"
            )
        return
    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=tensor_parallel,
        pipeline_model_parallel_size=pipeline_parallel,
        virtual_pipeline_model_parallel_size=virtual,
        expert_model_parallel_size=expert_parallel,
        expert_tensor_parallel_size=1,
        context_parallel_size=context_parallel,
    )
    mcore_tp.model_parallel_cuda_manual_seed(seed)


def transformer_config_kwargs(
    shape: GPTShape,
    hf_config: Any,
    *,
    pipeline_parallel: int,
    overrides: dict[str, Any] | None = None,
    virtual: int | None = None,
    expert_parallel: int = 1,
) -> dict[str, Any]:
    """``TransformerConfig`` arguments that reproduce the HF model's computation, with the
    keys of ``megatron.override_transformer_config`` that pass to megatron-core over them
    (:func:`.transformer_overrides.split` sorts them out)."""
    kwargs: dict[str, Any] = {
        "num_layers": shape.num_layers,
        "hidden_size": shape.hidden_size,
        "num_attention_heads": shape.num_heads,
        "num_query_groups": shape.num_kv_heads,
        "kv_channels": shape.head_dim,
        "ffn_hidden_size": shape.ffn_hidden_size,
        "normalization": "RMSNorm",
        "layernorm_epsilon": float(hf_config.rms_norm_eps),
        "gated_linear_unit": True,
        "activation_func": F.silu,
        "add_bias_linear": False,
        "add_qkv_bias": shape.qkv_bias,
        "hidden_dropout": 0.0,
        "attention_dropout": 0.0,
        "tensor_model_parallel_size": shape.tensor_parallel,
        "pipeline_model_parallel_size": pipeline_parallel,
        "virtual_pipeline_model_parallel_size": virtual,
        "expert_model_parallel_size": expert_parallel,
        "expert_tensor_parallel_size": 1,
        # megatron-core's MoE layers over TP ranks need it; a dense model computes the same
        "sequence_parallel": shape.tensor_parallel > 1,
        "pipeline_dtype": torch.float32,
        "variable_seq_lengths": True,
        # megatron-core refuses variable_seq_lengths with its default (allgather) MoE
        # dispatcher, also for a dense model
        "moe_token_dispatcher_type": "alltoall",
        "calculate_per_token_loss": True,
        "params_dtype": torch.float32,
        "perform_initialization": False,  # every weight is loaded from the checkpoint
        # Fusions that need apex/Transformer Engine, or (masked softmax) ignore a padding mask.
        "masked_softmax_fusion": False,
        "bias_activation_fusion": False,
        "bias_dropout_fusion": False,
        "apply_rope_fusion": False,
        "persist_layer_norm": False,
        "gradient_accumulation_fusion": False,
        "qk_layernorm": shape.qk_norm,
        **(shape.moe.transformer_config_kwargs() if shape.moe else {}),
    }
    return {**kwargs, **(overrides or {})}


def transformer_config(
    shape: GPTShape,
    hf_config: Any,
    *,
    pipeline_parallel: int,
    overrides: dict[str, Any] | None = None,
    virtual: int | None = None,
    expert_parallel: int = 1,
) -> Any:
    """megatron-core's ``TransformerConfig`` of :func:`transformer_config_kwargs`; a key of
    ``overrides`` it does not have is one :class:`ConfigError` line."""
    from megatron.core import __version__
    from megatron.core.transformer import TransformerConfig

    kwargs = transformer_config_kwargs(
        shape,
        hf_config,
        pipeline_parallel=pipeline_parallel,
        overrides=overrides,
        virtual=virtual,
        expert_parallel=expert_parallel,
    )
    try:
        return TransformerConfig(**kwargs)
    except TypeError as exc:
        raise ConfigError(
            f"megatron.override_transformer_config: {exc}; remove the key: megatron-core "
            f"{__version__} does not have it"
        ) from exc


def build_gpt_model(
    shape: GPTShape,
    hf_config: Any,
    stage: PipelineStage,
    *,
    pipeline_parallel: int,
    recompute: Recompute,
    overrides: dict[str, Any] | None = None,
    device: torch.device | None = None,
    virtual: int | None = None,
    chunk: int | None = None,
    expert_parallel: int = 1,
) -> Any:
    """This stage's GPTModel (float32 parameters, uninitialised) on ``device`` (the current
    CUDA device by default; the CPU for tests), the layers or submodules that ``recompute``
    names recomputed in the backward; checks that megatron-core placed the stage's layers where
    ``stage`` says. With ``virtual`` chunks per stage (interleaved pipeline parallelism),
    ``stage`` is model chunk ``chunk`` of this rank."""
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_block import (
        TransformerBlockSubmodules,
        get_num_layers_to_build,
    )
    from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

    device = device or torch.device("cuda", torch.cuda.current_device())
    if device.type == "cpu":  # megatron-core allocates on the current CUDA device otherwise
        overrides = {**(overrides or {}), "use_cpu_initialization": True}
    config = transformer_config(
        shape,
        hf_config,
        pipeline_parallel=pipeline_parallel,
        overrides=overrides,
        virtual=virtual,
        expert_parallel=expert_parallel,
    )
    spec = get_gpt_layer_local_spec(
        num_experts=shape.moe.num_experts if shape.moe else None,
        moe_grouped_gemm=False,
        qk_layernorm=shape.qk_norm,
    )
    attention = spec.submodules.self_attention.submodules
    attention.core_attention = sdpa_core_attention()
    # torch's RMSNorm with megatron-core's sequence-parallel mark (:mod:`.sequence_parallel`)
    spec.submodules.input_layernorm = spec.submodules.pre_mlp_layernorm = norm_class()
    if shape.qk_norm:
        attention.q_layernorm = attention.k_layernorm = norm_class()
    layers = get_num_layers_to_build(config, vp_stage=chunk)
    block = TransformerBlockSubmodules(layer_specs=[spec] * layers, layer_norm=norm_class())
    model = GPTModel(
        config,
        block,
        vocab_size=shape.padded_vocab_size,
        max_sequence_length=int(hf_config.max_position_embeddings),
        share_embeddings_and_output_weights=shape.tied,
        # the rotary embedding is applied by the core attention, at the HF positions
        position_embedding_type="none",
        parallel_output=True,
        pre_process=stage.is_first,
        post_process=stage.is_last,
        **({} if virtual is None else {"vp_stage": chunk}),
    ).to(device)
    built = (get_transformer_layer_offset(config, vp_stage=chunk), len(model.decoder.layers))
    if built != (stage.first_layer, stage.num_layers):
        raise RuntimeError(
            f"megatron-core built decoder layers {built[0]}..{sum(built) - 1} on this stage, "
            f"polyrl expected {stage.first_layer}..{stage.first_layer + stage.num_layers - 1}"
        )
    for index, layer in enumerate(model.decoder.layers):
        if recompute.layer_recomputed(index):
            layer.forward = recomputed_in_backward(layer.forward)
            continue
        for module in _recomputed_modules(layer, recompute.modules):
            module.forward = recomputed_in_backward(module.forward)
    return model


def _recomputed_modules(layer: Any, names: tuple[str, ...]) -> list[torch.nn.Module]:
    """The submodules of a decoder layer that megatron-core's selective recompute names."""
    modules = {
        "core_attn": [layer.self_attention.core_attention],
        "mlp": [layer.mlp],
        "layernorm": [layer.input_layernorm, layer.pre_mlp_layernorm],
    }
    return [module for name in names for module in modules[name]]


def load_hf_weights(
    model: torch.nn.Module,
    model_path: str,
    shape: GPTShape,
    stage: PipelineStage,
    tp_rank: int,
    trust_remote_code: bool,
    expert_rank: int = 0,
    expert_parallel: int = 1,
) -> None:
    """Read the HF checkpoint (float32, on the CPU) and copy this rank's shards of its
    pipeline stage into ``model`` (of a MoE model, the experts of its expert-parallel rank)."""
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(
        model_path, dtype=torch.float32, trust_remote_code=trust_remote_code
    ).state_dict()
    shards = stage_shards(hf_to_megatron(hf, shape), shape, stage)
    del hf
    if shape.moe and expert_parallel > 1:
        shards = local_experts(shards, shape.moe.num_experts, expert_rank, expert_parallel)
    params = dict(model.named_parameters())
    missing = sorted(set(params) - set(shards))
    unexpected = sorted(set(shards) - set(params))
    if missing or unexpected:
        raise ConfigError(
            f"the HF checkpoint does not map onto megatron-core's GPTModel: missing {missing[:4]}, "
            f"unexpected {unexpected[:4]}"
        )
    with torch.no_grad():
        for name, param in params.items():
            shard = shards[name][tp_rank]
            if shard.shape != param.shape:
                raise ConfigError(
                    f"{name}: the converted shard is {tuple(shard.shape)}, megatron-core expects "
                    f"{tuple(param.shape)}"
                )
            param.copy_(shard)
