"""The DeepSpeed config dict (what ``deepspeed.initialize(config=...)`` reads) for one role.

polyrl owns the parts DeepSpeed would otherwise decide on its own, so that this engine trains
exactly like the FSDP one:

- the optimizer is torch's AdamW (client optimizer; also when offloaded, where DeepSpeed would
  insist on its JIT-compiled CPU Adam), and the LR schedule is polyrl's, stepped by the engine;
- ``managed_gradient_accumulation: false``: the engine decides how many micro-batches make an
  optimizer step (a token budget gives a different number each time), DeepSpeed accumulates
  until ``step()``. The micro-batch size and accumulation steps below are placeholders that
  DeepSpeed's batch arithmetic asks for; the loss function already scales each micro-batch.
- a non-finite gradient norm skips the update (``check_grad_overflow`` for bf16; fp16 and fp32 do so
  anyway), as in the FSDP engine.
"""

from __future__ import annotations

from typing import Any

from polyrl_engine_deepspeed.settings import DeepSpeedSettings

# DeepSpeed prints throughput every `steps_per_print` steps; polyrl reports its own metrics.
_NEVER = 2**31 - 1


def precision_section(dtype: str) -> dict[str, Any]:
    """``bf16``/``fp16`` sections for ``actor_rollout_ref.model.dtype`` (float32: none)."""
    if dtype == "bfloat16":
        return {"bf16": {"enabled": True, "check_grad_overflow": True}}
    if dtype == "float16":
        return {"fp16": {"enabled": True, "loss_scale": 0, "initial_scale_power": 16}}
    return {}


def zero_section(settings: DeepSpeedSettings, stage: int, on_cuda: bool) -> dict[str, Any]:
    """``zero_optimization`` for ``stage`` (the settings' stage, or a frozen role's)."""
    zero: dict[str, Any] = {
        "stage": stage,
        # Overlapping reduction with backward needs gradient partitioning (stage >= 2) when the
        # client owns the accumulation boundary; on CPU there is no stream to overlap on.
        "overlap_comm": on_cuda and stage >= 2,
        "contiguous_gradients": stage >= 2,
    }
    if stage == 0:
        return zero
    if settings.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": on_cuda}
    if settings.offload_param and stage == 3:
        zero["offload_param"] = {"device": "cpu", "pin_memory": on_cuda}
    return zero


def deepspeed_config(
    settings: DeepSpeedSettings,
    *,
    dtype: str,
    clip_grad: float,
    on_cuda: bool,
    trainable: bool,
) -> dict[str, Any]:
    """The whole config. A frozen role (the reference) has no optimizer: under ZeRO-3 DeepSpeed
    still partitions its parameters; ZeRO-1/2 only partition optimizer state and gradients, so a
    frozen role runs at stage 0 (the whole model on each rank, as DeepSpeed would keep it)."""
    stage = settings.zero_stage if trainable or settings.zero_stage == 3 else 0
    config: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "managed_gradient_accumulation": False,
        "gradient_clipping": clip_grad if clip_grad > 0 else 0.0,
        "zero_optimization": zero_section(settings, stage, on_cuda),
        "zero_allow_untested_optimizer": True,
        "zero_force_ds_cpu_optimizer": False,
        "steps_per_print": _NEVER,
        "wall_clock_breakdown": False,
        **precision_section(dtype),
    }
    return config
