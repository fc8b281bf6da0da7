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

ConfigStore.instance().store(name=SCHEMA_NAME, node=PolyrlConfig)


def load_config(overrides: list[str] | None = None) -> DictConfig:
    """The resolved config for ``overrides`` (e.g. ``["recipe=tiny", "trainer.device=cpu"]``).

    Raises :class:`polyrl.errors.ConfigError` with the closest valid key for a misspelled one.
    """
    from polyrl.config.keys import check_override_keys, hydra_error_to_config_error

    overrides = list(overrides or [])
    check_override_keys(overrides)
    GlobalHydra.instance().clear()
    try:
        with initialize_config_module(config_module=CONFIG_MODULE, version_base="1.3"):
            cfg = compose(config_name=PRIMARY_CONFIG, overrides=overrides)
    except Exception as exc:
        raise hydra_error_to_config_error(exc) from exc
    finally:
        GlobalHydra.instance().clear()
    OmegaConf.resolve(cfg)
    return cfg


def to_container(cfg: DictConfig) -> dict[str, Any]:
    """A plain dict of the resolved config (for logging and checkpoints)."""
    return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]
