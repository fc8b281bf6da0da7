"""Config: the structured schema, composition with Hydra, and validation."""

from polyrl.config.loader import load_config, to_container

__all__ = ["load_config", "to_container"]
