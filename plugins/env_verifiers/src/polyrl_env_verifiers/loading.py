"""Building the verifiers environment a run names, and what about it this adapter cannot drive.

Why it refuses some environments up front: a problem found here is a one-line ``polyrl
validate`` error; found inside an episode it would be an ``env_error`` in every episode of a run
that otherwise looks healthy.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from polyrl.api import ConfigError


def load_env(name: str, args: Mapping[str, Any]) -> Any:
    """The ``vf.Environment`` that ``name`` builds with ``args``: ``module:function`` is called;
    any other name is an installed environment id for ``vf.load_environment``."""
    import verifiers as vf

    if ":" in name:
        module_name, _, attr = name.partition(":")
        try:
            factory = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as exc:
            raise ConfigError(f"cannot import {name} ({exc}); write it as module:function") from exc
        env = factory(**args)
    else:
        env = vf.load_environment(name, **args)
    if not isinstance(env, vf.Environment):
        raise ConfigError(f"{name} returned {type(env).__name__}, not a verifiers Environment")
    return env


def env_problems(env: Any, rows: str) -> list[str]:
    """What keeps ``env`` from being driven turn by turn here, one line each."""
    import verifiers as vf

    problems = []
    if not isinstance(env, vf.MultiTurnEnv):
        problems.append(
            f"{type(env).__name__} is not a MultiTurnEnv (SingleTurnEnv, ToolEnv and their "
            "subclasses are): only those expose the env_response and stop conditions that let "
            "polyrl drive the turns"
        )
    if env.message_type != "chat":
        problems.append(
            f"message_type={env.message_type!r}: polyrl's episodes are chats; build the "
            "environment with message_type='chat'"
        )
    if group_reward_funcs(env.rubric):
        problems.append(
            f"its rubric has group reward functions ({', '.join(group_reward_funcs(env.rubric))})"
            ", which score a whole group of rollouts at once; polyrl scores each episode alone"
        )
    if rows == "env" and env.dataset_source is None:
        problems.append(
            "it has no dataset for multi_turn.verifiers_rows=env; give it one, or set "
            "multi_turn.verifiers_rows=data"
        )
    return problems


def group_reward_funcs(rubric: Any) -> list[str]:
    """Names of the group-level reward functions in ``rubric`` (a RubricGroup's included).
    verifiers tells them apart by their plural arguments; its own helper does the telling."""
    import verifiers as vf

    if isinstance(rubric, vf.RubricGroup):
        return [name for inner in rubric.rubrics for name in group_reward_funcs(inner)]
    return list(rubric._get_group_reward_func_names())
