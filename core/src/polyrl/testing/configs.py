"""Config nodes for calling estimators and losses outside a run (tests, notebooks).

Estimators and losses read their knobs as attributes of a schema node and rely on the schema for
every default, so a test must hand them the same kind of node a run does; a plain dict or
``SimpleNamespace`` would lack keys and skip the schema's type checks. These helpers build that
node from :mod:`polyrl.config.schema` with a test's overrides merged in (an unknown key or a
value of the wrong type raises, as it would on the command line).
"""

from __future__ import annotations

from typing import Any, cast

from omegaconf import DictConfig, OmegaConf

from polyrl.config.schema import ActorConfig, AlgorithmConfig


def _node(schema: type, overrides: dict[str, Any]) -> DictConfig:
    return cast(DictConfig, OmegaConf.merge(OmegaConf.structured(schema), overrides))


def actor_config(**overrides: Any) -> DictConfig:
    """The ``actor_rollout_ref.actor`` node a policy loss receives, e.g.
    ``actor_config(clip_ratio_high=0.28)``."""
    return _node(ActorConfig, overrides)


def algorithm_config(**overrides: Any) -> DictConfig:
    """The ``algorithm`` node an estimator receives, e.g.
    ``algorithm_config(norm_adv_by_std_in_grpo=False, kl_ctrl={"type": "adaptive"})``."""
    return _node(AlgorithmConfig, overrides)
