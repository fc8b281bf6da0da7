"""The run config the textarena environment and its check read, built without composing one."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from polyrl.api import EnvironmentContext
from polyrl_env_textarena.environment import TextArenaEnvironment


def run_config(env_id: str = "GuessTheNumber-v0") -> SimpleNamespace:
    multi_turn = SimpleNamespace(textarena_env_id=env_id)
    rollout = SimpleNamespace(multi_turn=multi_turn)
    return SimpleNamespace(actor_rollout_ref=SimpleNamespace(rollout=rollout))


@pytest.fixture
def env():
    """The environment of a run of seed 5 whose default game is GuessTheNumber-v0."""
    environment = TextArenaEnvironment(EnvironmentContext(config=run_config(), seed=5))
    yield environment
    environment.close()


@pytest.fixture
def config_of():
    return run_config
