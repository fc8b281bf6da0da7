"""DAPO's config sections at verl's places (mounted into the schema by
:mod:`polyrl.config.sections`): dynamic sampling's ``algorithm.filter_groups`` and
``data.gen_batch_size``, and the soft overlong punishment's ``reward_model.overlong_buffer``
(also under verl's reward-manager name ``reward_model.reward_kwargs.overlong_buffer_cfg``).
Light on purpose (no torch): every composed config imports it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class FilterGroupsSettings:
    """Dynamic sampling: drop the groups whose ``metric`` is the same for every sample, and
    generate more until data.train_batch_size groups are kept.

    ``metric``: score (the reward's score) | seq_reward (sum of token_level_scores) |
    seq_final_reward (sum of token_level_rewards) | any named extra the reward returns per
    sample, e.g. acc. ``max_num_gen_batches``: generation rounds per step (<= 0: no limit).
    ``train_partial_batch``: at max_num_gen_batches, train on the groups kept so far instead of
    stopping the run.
    """

    enable: bool = False
    metric: str = "score"
    max_num_gen_batches: int = 0
    train_partial_batch: bool = False


@dataclass
class DynamicSamplingAlgorithmSettings:
    filter_groups: FilterGroupsSettings = field(default_factory=FilterGroupsSettings)


@dataclass
class DynamicSamplingDataSettings:
    """``gen_batch_size``: prompts drawn per generation round of dynamic sampling."""

    gen_batch_size: int = "${data.train_batch_size}"  # type: ignore[assignment]


@dataclass
class OverlongBufferSettings:
    """A response longer than max_resp_len - len loses up to penalty_factor, linearly over the
    last len tokens (len: 1 .. max_resp_len when enabled). ``max_resp_len`` (verl's DAPO reward
    manager's ``reward_kwargs.max_resp_len``) defaults to data.max_response_length, and may not
    exceed it.

    ``log`` is verl's switch for logging the penalty; polyrl logs it whenever the buffer is
    enabled (``overlong/penalized_frac``, ``overlong/penalty_mean``), so it is accepted for verl's
    scripts and changes nothing."""

    enable: bool = False
    len: int = 0
    penalty_factor: float = 1.0
    log: bool = False
    max_resp_len: int | None = None


@dataclass
class OverlongRewardSettings:
    overlong_buffer: OverlongBufferSettings = field(default_factory=OverlongBufferSettings)


CONFIG_SECTIONS = {
    "algorithm": DynamicSamplingAlgorithmSettings,
    "data": DynamicSamplingDataSettings,
    "reward_model": OverlongRewardSettings,
}
KEY_ALIASES = {
    "reward_model.reward_kwargs.overlong_buffer_cfg": "reward_model.overlong_buffer",
    "reward_model.reward_kwargs.max_resp_len": "reward_model.overlong_buffer.max_resp_len",
}


def buffer_end(cfg: Any) -> int:
    """The response length at which the penalty is full: ``max_resp_len``, else
    data.max_response_length."""
    end = cfg.reward_model.overlong_buffer.max_resp_len
    return int(cfg.data.max_response_length if end is None else end)
