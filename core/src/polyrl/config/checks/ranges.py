"""Types, ranges and choices of single keys (and a few pairs that only make sense together).

The choices are polyrl's own names, kept here so that validating needs no torch:
``core/tests/test_config_validate.py`` checks they equal the tuples :mod:`polyrl.algorithms`
accepts at run time (``LOSS_AGG_MODES``, ``KL_PENALTY_TYPES``).
"""

from __future__ import annotations

import os
from collections.abc import Callable

from polyrl.config.checks.checker import MISSING, Checker

LOSS_AGG_MODES = (
    "token-mean",
    "token-sum",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
)
_KL_ESTIMATORS = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")
# Each estimator alone, or with "+" (its value, k2's gradient: verl's "k3+").
KL_TYPES = _KL_ESTIMATORS + tuple(f"{name}+" for name in _KL_ESTIMATORS)
KL_CTRL_TYPES = ("fixed", "adaptive")
DEVICES = ("cpu", "cuda")
WORKER_BACKENDS = ("ray", "in_process")
RESUME_MODES = ("auto", "disable", "resume_path")
LR_SCHEDULER_TYPES = ("constant", "cosine")
TRUNCATIONS = ("error", "left", "right")
REWARD_ON_ERROR = ("score", "raise")
REWARD_SANDBOX = ("auto", "always", "never")


def _positive(v: float) -> bool:
    return v > 0


def at_least(low: float) -> Callable[[float], bool]:
    return lambda v: v >= low


def _unit_open(v: float) -> bool:
    return 0 < v < 1


def check_ranges(checker: Checker) -> None:
    c = checker
    actor = "actor_rollout_ref.actor"
    rollout = "actor_rollout_ref.rollout"
    c.number(f"{actor}.optim.lr", _positive, "> 0")
    c.number(f"{actor}.optim.clip_grad", _positive, "> 0")
    c.number(f"{actor}.optim.lr_warmup_steps_ratio", lambda v: 0 <= v <= 1, "in [0, 1]")
    c.number(f"{actor}.optim.min_lr_ratio", lambda v: 0 <= v <= 1, "in [0, 1]")
    c.choice(f"{actor}.optim.lr_scheduler_type", LR_SCHEDULER_TYPES)
    c.choice(f"{actor}.optim.warmup_style", LR_SCHEDULER_TYPES, optional=True)
    c.number(f"{actor}.clip_ratio", _unit_open, "between 0 and 1 (exclusive), e.g. 0.2")
    # No upper bound: clip_ratio_low >= 1 leaves the ratio unclipped from below, as CISPO's
    # verl example sets it (10), and verl accepts any positive value.
    for which in ("low", "high"):
        c.number(
            f"{actor}.clip_ratio_{which}",
            _positive,
            "> 0 (the ratio is clipped to [1 - clip_ratio_low, 1 + clip_ratio_high]), or null",
            optional=True,
        )
    c.number(f"{actor}.clip_ratio_c", lambda v: v > 1, "> 1 (the dual-clip bound, e.g. 3.0)")
    c.number(f"{actor}.ppo_epochs", at_least(1), ">= 1", integer=True)
    c.number(f"{actor}.entropy_coeff", at_least(0), ">= 0")
    c.number(f"{actor}.kl_loss_coef", at_least(0), ">= 0")
    c.choice(f"{actor}.loss_agg_mode", LOSS_AGG_MODES)
    c.choice(f"{actor}.kl_loss_type", KL_TYPES)

    c.number(f"{rollout}.n", at_least(1), ">= 1", integer=True)
    c.number(f"{rollout}.temperature", at_least(0), ">= 0")
    c.number(f"{rollout}.top_p", lambda v: 0 < v <= 1, "in (0, 1]")
    c.number(f"{rollout}.top_k", at_least(-1), "-1 (off) or a positive count", integer=True)
    c.number(f"{rollout}.gpu_memory_utilization", lambda v: 0 < v <= 1, "in (0, 1]")
    c.number(f"{rollout}.tensor_model_parallel_size", at_least(1), ">= 1", integer=True)
    val = f"{rollout}.val_kwargs"
    c.number(f"{val}.temperature", at_least(0), ">= 0")
    c.number(f"{val}.top_p", lambda v: 0 < v <= 1, "in (0, 1]")
    c.number(f"{val}.top_k", at_least(-1), "-1 (off) or a positive count", integer=True)
    val_n = c.number(f"{val}.n", at_least(1), ">= 1", integer=True)
    # Validation is greedy at temperature 0 and sampled above it; do_sample is not read (as in
    # verl's rollout), see polyrl.config.verl_compat.unread_do_sample_notice.
    if val_n and val_n > 1 and c.get(f"{val}.temperature") == 0:
        c.add(
            f"{val}.n={val_n} at {val}.temperature=0 gives {val_n} identical greedy answers: "
            f"set {val}.temperature > 0 (e.g. 0.6; validation samples at it) or {val}.n=1"
        )
    if c.get(f"{val}.do_sample") is True and c.get(f"{val}.temperature") == 0:
        c.add(f"{val}.do_sample=true needs {val}.temperature > 0 (e.g. 0.6)")

    c.number("algorithm.gamma", lambda v: 0 <= v <= 1, "in [0, 1]")
    c.number("algorithm.lam", lambda v: 0 <= v <= 1, "in [0, 1]")
    c.choice("algorithm.kl_penalty", KL_TYPES)
    c.choice("algorithm.kl_ctrl.type", KL_CTRL_TYPES)
    c.number("algorithm.kl_ctrl.kl_coef", at_least(0), ">= 0")

    c.number("data.max_prompt_length", at_least(1), ">= 1", integer=True)
    c.number("data.max_response_length", at_least(1), ">= 1", integer=True)
    c.choice("data.truncation", TRUNCATIONS)

    c.choice("trainer.device", DEVICES)
    c.choice("trainer.worker_backend", WORKER_BACKENDS)
    c.number("trainer.total_epochs", at_least(1), ">= 1", integer=True)
    c.number("trainer.joined_cluster_growth_s", at_least(0), ">= 0")
    c.number("trainer.log_val_generations", at_least(0), "0 (off) or more", integer=True)
    c.number(
        "trainer.total_training_steps", at_least(1), "null or >= 1", optional=True, integer=True
    )
    mode = c.choice("trainer.resume_mode", RESUME_MODES)
    if mode == "resume_path":
        path = c.get("trainer.resume_from_path")
        if not path or path is MISSING:
            c.add("trainer.resume_mode=resume_path needs trainer.resume_from_path=<checkpoint dir>")
        elif not os.path.exists(os.path.expanduser(str(path))):
            c.add(f"trainer.resume_from_path={path!r} does not exist")

    c.number("reward_model.timeout_s", _positive, "> 0")
    c.number("reward_model.num_workers", at_least(1), ">= 1", integer=True)
    c.choice("reward_model.on_error", REWARD_ON_ERROR)
    c.choice("reward_model.sandbox", REWARD_SANDBOX)
    c.number("reward_model.sandbox_memory_mb", at_least(64), ">= 64", integer=True)
    c.number("custom_reward_function.load_timeout_s", _positive, "> 0")
    c.number("reward_model.max_consecutive_timeouts", at_least(1), ">= 1", integer=True)
    c.number("reward_model.max_failure_rate", lambda v: 0 < v <= 1, "in (0, 1]")
    c.number("reward_model.failure_window_steps", at_least(1), ">= 1", integer=True)
    custom = c.get("custom_reward_function.path")
    if c.get("reward_model.reward_manager") == "batch" and not custom:
        c.add(
            "reward_model.reward_manager=batch calls custom_reward_function once per batch "
            "(verl's BatchRewardManager): set custom_reward_function.path"
        )
    if isinstance(custom, str) and custom and not os.path.exists(os.path.expanduser(custom)):
        c.add(
            f"custom_reward_function.path={custom!r} does not exist: give the .py file that "
            f"defines {c.get('custom_reward_function.name')}()"
        )
