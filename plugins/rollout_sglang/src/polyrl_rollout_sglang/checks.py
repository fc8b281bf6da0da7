"""The SGLang rollout's own rules for a run config (``RolloutEngineSpec.config_check``).

Light on purpose (no SGLang, no torch): ``polyrl validate`` imports it. The single-value rules are
shared with :func:`polyrl_rollout_sglang.config.build_engine_args`, which raises them at run time.
Core already refuses ``trainer.device=cpu`` for this engine (its spec says ``supports_cpu=False``).
"""

from __future__ import annotations

from typing import Any

from polyrl.api import engine_kwargs_problem as core_engine_kwargs_problem
from polyrl.api import role_world

ROLLOUT = "actor_rollout_ref.rollout"
# SGLang's --dtype choices, and the short names polyrl's other engines accept.
DTYPES = {"auto", "half", "float16", "fp16", "bfloat16", "bf16", "float", "float32", "fp32"}
# verl nests engine arguments per backend; a mapping with one of these keys is read nested.
BACKEND_SECTIONS = {"vllm", "sglang", "trtllm"}
# SGLang returns log_softmax(logits) *before* temperature when this is set; the trainer
# recomputes log_softmax(logits / T), so the two would disagree for any T != 1.
ORIGINAL_LOGPROB_ENV = "SGLANG_RETURN_ORIGINAL_LOGPROB"


def dtype_problem(dtype: Any) -> str | None:
    if str(dtype).lower() in DTYPES:
        return None
    return (
        f"{ROLLOUT}.dtype={str(dtype).lower()!r} is not a dtype SGLang knows; "
        f"use one of bfloat16, float16, float32, auto"
    )


def tensor_parallel_problem(tp: Any) -> str | None:
    if not isinstance(tp, int) or isinstance(tp, bool) or tp < 1:
        return f"{ROLLOUT}.tensor_model_parallel_size must be >= 1, got {tp}"
    return None


def bucket_problem(megabytes: Any) -> str | None:
    if isinstance(megabytes, int) and not isinstance(megabytes, bool) and megabytes >= 1:
        return None
    return (
        f"{ROLLOUT}.update_weights_bucket_megabytes must be a whole number of megabytes >= 1, "
        f"got {megabytes!r}"
    )


def engine_kwargs_problem(raw: Any) -> str | None:
    """``engine_kwargs`` is a mapping; verl's nested ``engine_kwargs.sglang`` too."""
    return core_engine_kwargs_problem(
        raw, backend="sglang", engine_name="SGLang", sections=BACKEND_SECTIONS
    )


def original_logprob_problem(environ: dict[str, str]) -> str | None:
    value = environ.get(ORIGINAL_LOGPROB_ENV, "")
    if value.strip().lower() in ("", "0", "false", "no", "off"):
        return None
    return (
        f"{ORIGINAL_LOGPROB_ENV}={value} makes SGLang report log-probs before temperature, "
        f"which the trainer does not recompute; unset it"
    )


def check_config(cfg: Any) -> list[str]:
    """The SGLang rollout's rules for the composed run config (selected as the rollout engine)."""
    import os

    from omegaconf import OmegaConf

    rollout = cfg.actor_rollout_ref.rollout
    tp = rollout.tensor_model_parallel_size
    problems = [
        dtype_problem(rollout.dtype),
        bucket_problem(rollout.update_weights_bucket_megabytes),
        engine_kwargs_problem(OmegaConf.to_container(rollout.engine_kwargs)),
        original_logprob_problem(dict(os.environ)),
    ]
    # core checks the range of tensor_model_parallel_size; here what SGLang adds to it
    if isinstance(tp, int) and tp > 1:
        found = role_world(cfg, "rollout")
        if found is not None and found[0] % tp:
            problems.append(
                f"{ROLLOUT}.tensor_model_parallel_size {tp} does not divide the {found[1]}"
            )
    return [p for p in problems if p]
