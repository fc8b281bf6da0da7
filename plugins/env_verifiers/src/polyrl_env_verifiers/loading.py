"""Building the verifiers environment a run names, and what about it this adapter cannot drive.

Why it refuses some environments up front: a problem found here is a one-line ``polyrl
validate`` error; found inside an episode it would be an ``env_error`` in every episode of a run
that otherwise looks healthy.
"""

from __future__ import annotations

import importlib
import signal
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from functools import partial
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
    else:
        factory = partial(vf.load_environment, name)
    with stop_handlers_kept():
        env = factory(**args)
    if not isinstance(env, vf.Environment):
        raise ConfigError(f"{name} returned {type(env).__name__}, not a verifiers Environment")
    return env


@contextmanager
def stop_handlers_kept() -> Iterator[None]:
    """The process's SIGINT and SIGTERM handlers as they were before the block. A verifiers
    ``Environment`` installs its own when it is built (its teardown, then exit 143 on SIGTERM):
    in polyrl's driver they would replace the stop handling that finishes the step, keeps the
    checkpoint and exits with the run's status. Its teardown still runs at exit (verifiers
    registers it with ``atexit`` too)."""
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread can set handlers, so none can be changed here
        return
    kept = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in kept.items():
            signal.signal(sig, handler)


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
