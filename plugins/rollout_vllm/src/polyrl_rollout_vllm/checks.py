"""The vLLM rollout's own rules for a run config (``RolloutEngineSpec.config_check``).

Light on purpose (no vLLM, no torch): ``polyrl validate`` imports it. The single-value rules are
shared with :func:`polyrl_rollout_vllm.config.build_engine_args`, which raises them at run time.
"""

from __future__ import annotations

from typing import Any

from polyrl.api import engine_kwargs_problem as core_engine_kwargs_problem
from polyrl.api import role_world

ROLLOUT = "actor_rollout_ref.rollout"
# The keys that mark engine_kwargs as nested per backend (verl's layout).
BACKEND_SECTIONS = {"vllm", "sglang"}
DTYPES = {"bfloat16", "bf16", "float16", "fp16", "half", "float32", "fp32", "float", "auto"}


def dtype_problem(dtype: Any) -> str | None:
    if str(dtype).lower() in DTYPES:
        return None
    return (
        f"{ROLLOUT}.dtype={str(dtype).lower()!r} is not a dtype vLLM knows; "
        f"use one of bfloat16, float16, float32, auto"
    )


def tensor_parallel_problem(tp: Any, device: str) -> str | None:
    """``tensor_model_parallel_size`` is at least 1, and 1 on CPU."""
    if not isinstance(tp, int) or isinstance(tp, bool) or tp < 1:
        return f"{ROLLOUT}.tensor_model_parallel_size must be >= 1, got {tp}"
    if tp > 1 and not str(device).startswith("cuda"):
        return (
            f"{ROLLOUT}.tensor_model_parallel_size={tp} is not supported on CPU: vLLM's CPU "
            f"tensor parallelism runs workers in other processes, where the trainer's weights "
            f"cannot be streamed in memory; set it to 1 on CPU"
        )
    return None


def engine_kwargs_problem(raw: Any) -> str | None:
    """verl nests engine arguments per backend (``engine_kwargs.vllm``); each must be a mapping."""
    return core_engine_kwargs_problem(
        raw, backend="vllm", engine_name="vLLM", sections=BACKEND_SECTIONS
    )


def check_config(cfg: Any) -> list[str]:
    """The vLLM rollout's rules for the composed run config (selected as the rollout engine)."""
    from omegaconf import OmegaConf

    rollout = cfg.actor_rollout_ref.rollout
    device = str(cfg.trainer.device)
    tp = rollout.tensor_model_parallel_size
    problems = [dtype_problem(rollout.dtype)]
    # core checks the range of tensor_model_parallel_size; here what vLLM adds to it
    if isinstance(tp, int) and tp > 1:
        problems.append(tensor_parallel_problem(tp, device))
        found = role_world(cfg, "rollout")
        if found is not None and found[0] % tp:
            problems.append(
                f"{ROLLOUT}.tensor_model_parallel_size {tp} does not divide the {found[1]}"
            )
    problems.append(engine_kwargs_problem(OmegaConf.to_container(rollout.engine_kwargs)))
    return [p for p in problems if p]
