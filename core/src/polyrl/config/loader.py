"""Compose the config from the schema, a recipe and command-line overrides (Hydra syntax)."""

from __future__ import annotations

from typing import Any

from hydra import compose, initialize_config_module
from hydra.core.config_store import ConfigStore
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig, OmegaConf

from polyrl.config.schema import PolyrlConfig

CONFIG_MODULE = "polyrl.config.conf"
PRIMARY_CONFIG = "polyrl"
SCHEMA_NAME = "polyrl_schema"
# The config group holding the selected algorithm's defaults; polyrl.yaml places it after the
# schema and before the recipe, so the recipe and the command line override it.
ALGORITHM_DEFAULTS_GROUP = "algorithm_defaults"
NO_ALGORITHM_DEFAULTS = "none"

ConfigStore.instance().store(name=SCHEMA_NAME, node=PolyrlConfig)
ConfigStore.instance().store(
    group=ALGORITHM_DEFAULTS_GROUP, name=NO_ALGORITHM_DEFAULTS, node={}, package="_global_"
)


def load_config(overrides: list[str] | None = None) -> DictConfig:
    """The resolved config for ``overrides`` (e.g. ``["recipe=tiny", "trainer.device=cpu"]``).

    Composed twice: once to learn which algorithm is selected, then again with that algorithm's
    ``config_defaults`` between the schema and the recipe (see
    :class:`polyrl.specs.AlgorithmSpec`). Raises :class:`polyrl.errors.ConfigError` with the
    closest valid key for a misspelled one.
    """
    from polyrl.config.keys import check_override_keys

    overrides = list(overrides or [])
    check_override_keys(overrides)
    cfg = _compose(overrides)
    defaults = _algorithm_defaults(cfg)
    if defaults is not None:
        name, values = defaults
        ConfigStore.instance().store(
            group=ALGORITHM_DEFAULTS_GROUP, name=name, node=values, package="_global_"
        )
        cfg = _compose([*overrides, f"{ALGORITHM_DEFAULTS_GROUP}={name}"])
    OmegaConf.resolve(cfg)
    return cfg


def _compose(overrides: list[str]) -> DictConfig:
    from polyrl.config.keys import hydra_error_to_config_error

    GlobalHydra.instance().clear()
    try:
        with initialize_config_module(config_module=CONFIG_MODULE, version_base="1.3"):
            return compose(config_name=PRIMARY_CONFIG, overrides=overrides)
    except Exception as exc:
        raise hydra_error_to_config_error(exc) from exc
    finally:
        GlobalHydra.instance().clear()


def _algorithm_defaults(cfg: DictConfig) -> tuple[str, dict[str, Any]] | None:
    """``(algorithm name, nested defaults)`` of the selected algorithm, or None when it brings
    none or cannot be selected (``polyrl validate`` reports the latter with the valid names)."""
    from polyrl.errors import PolyrlError
    from polyrl.plan import select_algorithm

    try:
        registration = select_algorithm(cfg.algorithm.name, str(cfg.algorithm.adv_estimator))
    except PolyrlError:
        return None
    if not registration.spec.config_defaults:
        return None
    nested: dict[str, Any] = {}
    for dotted, value in registration.spec.config_defaults.items():
        *parents, leaf = dotted.split(".")
        node = nested
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return registration.name, nested


def to_container(cfg: DictConfig) -> dict[str, Any]:
    """A plain dict of the resolved config (for logging and checkpoints)."""
    return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]
