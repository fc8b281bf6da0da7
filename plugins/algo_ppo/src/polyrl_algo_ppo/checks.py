"""PPO's rules for a run config (``AlgorithmSpec.config_check``), run by ``polyrl validate`` and
before Ray starts. Light on purpose (no torch). The critic's engine-specific keys
(``critic.optim``, ``critic.model.fsdp_config`` ...) are its engine's to check."""

from __future__ import annotations

import os
from typing import Any

from polyrl.api import (
    LOSS_AGG_MODES,
    Checker,
    PluginKind,
    PolyrlError,
    at_least,
    check_ppo_batches,
    get_registry,
    is_positive_int,
    looks_local,
    role_world,
)
from polyrl_algo_ppo.settings import REWEIGHT_METHODS

CRITIC = "critic"


def check_config(cfg: Any) -> list[str]:
    """One line per problem of a PPO run config."""
    checker = Checker(cfg, get_registry())
    if checker.get("critic.enable") is False:
        checker.add(
            "critic.enable=false, but algorithm 'ppo' trains a critic: GAE needs its values; "
            "drop critic.enable, or pick a critic-free algorithm (algorithm.adv_estimator=grpo)"
        )
    _check_estimator(checker)
    _check_engine(checker)
    _check_ranges(checker)
    _check_batches(checker)
    _check_model_path(checker)
    return checker.problems


def _check_estimator(c: Checker) -> None:
    name = c.get("algorithm.adv_estimator")
    try:
        spec = c.registry.get(PluginKind.ADVANTAGE_ESTIMATOR, str(name)).spec
    except PolyrlError:
        return  # reported by the selection check
    if "values" not in spec.requires:
        c.add(
            f"algorithm 'ppo' trains a critic, but algorithm.adv_estimator={name!r} does not read "
            f"its values; use algorithm.adv_estimator=gae, or drop algorithm.name=ppo"
        )


def _check_engine(c: Checker) -> None:
    name = c.get("critic.strategy")
    engines = c.registry.all(PluginKind.TRAINING_ENGINE)
    capable = ", ".join(r.name for r in engines if r.spec.supports_value_head) or "none installed"
    try:
        reg = c.registry.get(PluginKind.TRAINING_ENGINE, str(name))
    except PolyrlError:
        c.add(
            f"critic.strategy={name!r} is not an installed training engine; engines with a value "
            f"head: {capable}"
        )
        return
    if not reg.spec.supports_value_head:
        c.add(
            f"critic.strategy={name!r} (package {reg.provenance.distribution}) has no value head "
            f"(its spec lacks supports_value_head), so it cannot train a critic; engines that "
            f"can: {capable}"
        )
    device = c.get("trainer.device")
    if device in ("cpu", "cuda") and not getattr(reg.spec, f"supports_{device}"):
        c.add(
            f"critic.strategy={name!r} (package {reg.provenance.distribution}) does not support "
            f"trainer.device={device}"
        )


def _check_ranges(c: Checker) -> None:
    c.number("critic.cliprange_value", lambda v: v > 0, "> 0, e.g. 0.5")
    c.number("critic.grad_clip", lambda v: v > 0, "> 0")
    c.number("trainer.critic_warmup", at_least(0), ">= 0 (steps)", integer=True)
    c.choice("critic.loss_agg_mode", LOSS_AGG_MODES)
    c.choice("algorithm.pf_ppo.reweight_method", REWEIGHT_METHODS)
    for key in (
        "forward_micro_batch_size_per_gpu",
        "ppo_max_token_len_per_gpu",
        "forward_max_token_len_per_gpu",
    ):
        c.number(f"critic.{key}", at_least(1), ">= 1", integer=True)


def _check_batches(c: Checker) -> None:
    train, n = c.get("data.train_batch_size"), c.get("actor_rollout_ref.rollout.n")
    found = role_world(c.cfg, CRITIC)
    if found is None or not (is_positive_int(train) and is_positive_int(n)):
        return  # reported by core's batch and placement checks
    check_ppo_batches(c, CRITIC, train, n, *found)


def _check_model_path(c: Checker) -> None:
    path = c.get("critic.model.path")
    if path is None:
        return
    if not isinstance(path, str) or not path:
        c.add(f"critic.model.path={path!r} must be a model path, or null for the actor's model")
    elif looks_local(path) and not os.path.exists(os.path.expanduser(path)):
        c.add(
            f"critic.model.path={path!r} does not exist: give an existing model folder or .gguf "
            f"file, or null to start the critic from the actor's model"
        )
