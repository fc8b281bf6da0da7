"""The ``dapo`` algorithm's rules for a run config (``AlgorithmSpec.config_check``), checked by
``polyrl validate`` and before Ray starts. Light on purpose: no torch. (The schema already
types every key: only ranges and relations are checked here.)"""

from __future__ import annotations

from typing import Any

from polyrl.api import role_world


def _filter_groups_problems(cfg: Any) -> list[str]:
    settings = cfg.algorithm.filter_groups
    prompts, train = cfg.data.gen_batch_size, cfg.data.train_batch_size
    if not settings.enable:
        if prompts == train:
            return []
        return [
            f"data.gen_batch_size={prompts} differs from data.train_batch_size={train}, but "
            f"only dynamic sampling reads it; set algorithm.filter_groups.enable=true or leave "
            f"data.gen_batch_size unset"
        ]
    problems = []
    if not str(settings.metric).strip():
        problems.append(
            "algorithm.filter_groups.metric is empty: name what must differ within a group "
            "(score, seq_reward, seq_final_reward, or a reward extra such as acc)"
        )
    if prompts < 1:
        problems.append(f"data.gen_batch_size={prompts} must be >= 1 (prompts per generation)")
        return problems
    found = role_world(cfg, "rollout")
    if found and prompts % found[0]:
        problems.append(
            f"data.gen_batch_size {prompts} is not divisible by the rollout's {found[1]}: "
            f"each generation batch is split across the ranks; make it a multiple of {found[0]}"
        )
    return problems


def check_overlong_config(cfg: Any) -> list[str]:
    """The overlong buffer's keys (every algorithm whose step applies it), one line each."""
    buffer = cfg.reward_model.overlong_buffer
    if not buffer.enable:
        return []
    limit = int(cfg.data.max_response_length)
    problems = []
    end = buffer.max_resp_len
    if end is not None and not 1 <= end <= limit:
        problems.append(
            f"reward_model.overlong_buffer.max_resp_len={end} must be from 1 to "
            f"data.max_response_length ({limit}): no response is longer than that"
        )
        return problems
    end_name = "max_resp_len" if end is not None else "data.max_response_length"
    end = limit if end is None else int(end)
    if not 1 <= buffer.len <= end:
        problems.append(
            f"reward_model.overlong_buffer.len={buffer.len} must be from 1 to "
            f"{end_name} ({end}): the penalty ramps up over the last len tokens "
            f"(DAPO: 4096 of 20480)"
        )
    if buffer.penalty_factor < 0:
        problems.append(
            f"reward_model.overlong_buffer.penalty_factor={buffer.penalty_factor} must be >= 0 "
            f"(the penalty at the length limit; DAPO: 1.0)"
        )
    return problems


def check_dapo_config(cfg: Any) -> list[str]:
    """Dynamic sampling's and the overlong buffer's keys, one line per problem."""
    return _filter_groups_problems(cfg) + check_overlong_config(cfg)
