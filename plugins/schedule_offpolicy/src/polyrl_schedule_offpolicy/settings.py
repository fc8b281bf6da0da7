"""The keys the off-policy schedules read, ``trainer.off_policy.*`` (verl's v1 trainer spells
the group ``trainer.v1.sampler``, an alias of it). Light on purpose (no torch): every composed
config imports it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

SECTION = "trainer.off_policy"
VERL_SECTION = "trainer.v1.sampler"
THRESHOLD_KEY = f"{SECTION}.max_off_policy_threshold"
STRATEGY_KEY = f"{SECTION}.max_off_policy_strategy"
# What happens to a batch found staler than the threshold when its step comes (possible only
# for batches a checkpoint written under a larger threshold holds): generate its prompts again
# with the current weights, or leave its prompts out of the epoch and draw new ones.
STRATEGIES = ("wait", "drop")
PARTIAL_KEY = f"{SECTION}.partial_rollout"
CHUNK_KEY = f"{SECTION}.partial_rollout_chunk_tokens"
# What a sample still being generated when new weights arrive does: ``off`` (weights arrive only
# between rounds, when the rollout is idle), ``continue`` (with the new weights; each token keeps
# the version that sampled it) or ``abort`` (its tokens are thrown away and it starts again).
PARTIAL_MODES = ("off", "continue", "abort")


@dataclass
class OffPolicySettings:
    """``max_off_policy_threshold`` (k): how many policy versions a sample may lag the policy
    that trains on it, so also how many batches the rollout generates ahead (verl's key).
    ``trainer.async_mode=one_step_off`` is k=1. ``max_off_policy_strategy``: ``wait`` (the
    default: every prompt still trains once per epoch; verl defaults to drop) regenerates a
    batch staler than k; ``drop`` leaves it out.

    ``partial_rollout`` (verl's fully-async trainer and slime name it so; AReaL calls it
    interruptible generation): ``off`` keeps whole rounds of one version; ``continue`` or
    ``abort`` generate in chunks of ``partial_rollout_chunk_tokens`` new tokens and sync the
    weights after every update, between two chunks, so a long sample does not hold the new
    weights back; a sample cut by a sync continues with the new weights, or starts again."""

    # k: how many policy versions a sample may lag the policy that trains on it
    max_off_policy_threshold: int = 1
    # a batch staler than k (from a checkpoint of a larger k): wait (generate again) or drop
    max_off_policy_strategy: str = "wait"
    # off, continue or abort: weight syncs between chunks of generation after every update
    partial_rollout: str = "off"
    # with partial_rollout: new tokens generated between two chances of a weight sync
    partial_rollout_chunk_tokens: int = 32


OFF_POLICY_SECTIONS = {SECTION: OffPolicySettings}
OFF_POLICY_ALIASES = {VERL_SECTION: SECTION}


def partial_note(cfg: Any) -> str:
    """What ``polyrl validate``'s schedule line adds for partial rollouts (nothing when off)."""
    settings = cfg.trainer.off_policy
    if settings.partial_rollout == "off":
        return ""
    return (
        f"; partial rollouts ({settings.partial_rollout}): the weights are synced after every "
        f"update, between chunks of {settings.partial_rollout_chunk_tokens} new tokens"
    )
