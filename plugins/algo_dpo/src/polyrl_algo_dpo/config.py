"""The algorithm's settings (``plugins.dpo.*``), its config defaults, and the check that a run
config can train on pairs. Light on purpose (no torch): ``polyrl validate`` imports it.

A batch of pairs is two rows per prompt (chosen, rejected: :mod:`polyrl_algo_dpo.preference`), so
the batch arithmetic of a policy-gradient run carries over with ``rollout.n = 2``; what DPO
needs beyond it is that nothing separates the two rows of a pair before the loss sees them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from polyrl.api import ConfigError, get, plugin_settings

ACTOR = "actor_rollout_ref.actor"
#: ``actor_rollout_ref.actor.policy_loss.loss_mode`` -> TRL's ``loss_type``.
LOSS_TYPES = {"dpo": "sigmoid", "ipo": "ipo"}

CONFIG_DEFAULTS = {
    f"{ACTOR}.policy_loss.loss_mode": "dpo",
    # One optimizer step per batch of pairs, as TRL's DPOTrainer takes.
    f"{ACTOR}.ppo_mini_batch_size": "${data.train_batch_size}",
    # Two responses per prompt: the batch arithmetic of every check holds for pairs.
    "actor_rollout_ref.rollout.n": 2,
}


@dataclass
class DPOSettings:
    # The strength of the implicit KL to the reference (TRL's beta): DPO's logits are
    # beta x (log-ratio margin); IPO's target margin is 1 / (2 beta).
    beta: float = 0.1


def dpo_settings(node: Any) -> DPOSettings:
    """``plugins.dpo`` of the config that ``node`` belongs to."""
    return plugin_settings(node, "dpo", DPOSettings)


def check_config(cfg: Any) -> list[str]:
    """One line per setting that would break training on pairs."""
    problems = [*_loss_problems(cfg), *_pairing_problems(cfg), *preference_file_problems(cfg)]
    try:
        beta = dpo_settings(cfg).beta
    except ConfigError as exc:
        return [*problems, str(exc)]
    if not beta > 0:
        problems.append(f"plugins.dpo.beta={beta} must be > 0 (TRL's default is 0.1)")
    return problems


def _loss_problems(cfg: Any) -> list[str]:
    problems = []
    mode = get(cfg, f"{ACTOR}.policy_loss.loss_mode")
    if mode not in LOSS_TYPES:
        problems.append(
            f"{ACTOR}.policy_loss.loss_mode={mode!r}: algorithm dpo trains with a preference "
            f"loss, {' or '.join(LOSS_TYPES)}"
        )
    temperature = get(cfg, "actor_rollout_ref.rollout.temperature")
    if temperature != 1.0:
        problems.append(
            f"actor_rollout_ref.rollout.temperature={temperature}: the actor and the reference "
            "score pairs at that temperature, and DPO compares the models' own log-probs: set 1.0"
        )
    return problems


def _pairing_problems(cfg: Any) -> list[str]:
    problems = []
    if get(cfg, "actor_rollout_ref.rollout.n") != 2:
        problems.append(
            "actor_rollout_ref.rollout.n must be 2 for dpo: a pair is a prompt with two "
            "responses (chosen, rejected), and the batch arithmetic counts rows by it"
        )
    train, mini = get(cfg, "data.train_batch_size"), get(cfg, f"{ACTOR}.ppo_mini_batch_size")
    if mini != train or get(cfg, f"{ACTOR}.ppo_epochs") != 1:
        problems.append(
            f"dpo takes one optimizer step per batch of pairs: set {ACTOR}.ppo_mini_batch_size "
            f"to data.train_batch_size ({train}, got {mini}) and {ACTOR}.ppo_epochs=1"
        )
    if get(cfg, f"{ACTOR}.shuffle") is True:
        problems.append(f"{ACTOR}.shuffle=true would separate the two rows of a pair: set false")
    if get(cfg, f"{ACTOR}.use_dynamic_bsz") is True:
        problems.append(
            f"{ACTOR}.use_dynamic_bsz=true groups rows by length, which separates the rows of a "
            "pair: set false and size micro-batches with ppo_micro_batch_size_per_gpu"
        )
    micro = get(cfg, f"{ACTOR}.ppo_micro_batch_size_per_gpu")
    if isinstance(micro, int) and micro % 2:
        problems.append(
            f"{ACTOR}.ppo_micro_batch_size_per_gpu={micro} must be even: a micro-batch holds "
            "whole pairs (two rows each)"
        )
    return problems


def preference_file_problems(cfg: Any) -> list[str]:
    """One line per parquet file of ``data.train_files`` / ``data.val_files`` that is not a
    preference file (see :mod:`polyrl_algo_dpo.preference`): it needs ``chosen`` and
    ``rejected``, and the prompt column ``data.prompt_key`` unless ``chosen`` holds whole
    conversations (TRL's implicit prompt). Files that are missing or unreadable are reported by
    core's data check."""
    import pyarrow as pa

    from polyrl_algo_dpo.preference import RESPONSE_COLUMNS

    prompt_key = get(cfg, "data.prompt_key")
    problems = []
    for key in ("data.train_files", "data.val_files"):
        paths = get(cfg, key)
        for path in paths if isinstance(paths, list) else [paths]:
            schema = _readable_schema(path)
            if schema is None:
                continue
            missing = [c for c in RESPONSE_COLUMNS if c not in schema.names]
            conversations = "chosen" in schema.names and pa.types.is_list(
                schema.field("chosen").type
            )
            if prompt_key not in schema.names and not conversations:
                missing.append(f"{prompt_key} (data.prompt_key)")
            if missing:
                problems.append(
                    f"{key}: {path!r} is not a preference file: it lacks {', '.join(missing)} "
                    f"(it has: {', '.join(schema.names)}); one row per pair: the prompt (chat "
                    "messages or text), chosen and rejected (TRL's layouts work too)"
                )
    return problems


def _readable_schema(path: Any) -> Any:
    """The parquet schema of a local ``.parquet`` file, or None (not one, or unreadable)."""
    if not isinstance(path, str) or not path.endswith(".parquet"):
        return None
    import pyarrow.parquet as pq

    try:
        return pq.read_schema(os.path.expanduser(path))
    except Exception:  # noqa: BLE001 - core's data check reports a missing or unreadable file
        return None
