"""The run config the verifiers environment reads, built without composing one, and this folder
on the path so ``vf_envs:<function>`` imports."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))


class Section(SimpleNamespace):
    """A config section with OmegaConf's ``get``."""

    def get(self, key: str, default: Any = None) -> Any:
        return getattr(self, key, default)


def run_config(name: str, rows: str = "env", **args: Any) -> SimpleNamespace:
    multi_turn = Section(verifiers_env=name, verifiers_env_args=args, verifiers_rows=rows)
    rollout = SimpleNamespace(multi_turn=multi_turn)
    return SimpleNamespace(actor_rollout_ref=SimpleNamespace(rollout=rollout))


@pytest.fixture
def config_of():
    return run_config
