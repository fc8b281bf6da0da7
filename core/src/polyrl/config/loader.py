"""Compose the config from the schema, a recipe and command-line overrides (Hydra syntax)."""

from __future__ import annotations

import copy
from typing import Any

from hydra import compose, initialize_config_module
from hydra.core.config_store import ConfigStore
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig, OmegaConf

CONFIG_MODULE = "polyrl.config.conf"
PRIMARY_CONFIG = "polyrl"
SCHEMA_NAME = "polyrl_schema"
# The config group holding the selected algorithm's defaults; polyrl.yaml places it after the
# schema and before the recipe, so the recipe and the command line override it.
ALGORITHM_DEFAULTS_GROUP = "algorithm_defaults"
NO_ALGORITHM_DEFAULTS = "none"

ConfigStore.instance().store(
    group=ALGORITHM_DEFAULTS_GROUP, name=NO_ALGORITHM_DEFAULTS, node={}, package="_global_"
)


def _share_the_store_when_copied() -> None:
    """Make a deep copy of Hydra's ConfigStore the store itself.

    Why: every ``compose`` deep-copies its config repository so that re-initialising the
    copy's sources cannot touch the original, and the repository's structured source holds
    the process-wide ConfigStore, so each compose also copied every stored node (the schema
    with its plugin sections and verl's mounted keys, the recipes), a large share of a
    compose's time. Nothing writes through that copy (new sources take ``ConfigStore.instance()``
    again, and ``ConfigStore.load`` copies the node it returns), so sharing it changes no
    result. ``copy.deepcopy`` looks ``__deepcopy__`` up on the object, so this instance
    alone is affected."""
    store = ConfigStore.instance()
    store.__deepcopy__ = lambda memo: store  # type: ignore[attr-defined]


_share_the_store_when_copied()


def load_config(overrides: list[str] | None = None) -> DictConfig:
    """The resolved config for ``overrides`` (e.g. ``["recipe=tiny", "trainer.device=cpu"]``).

    Composed twice: once to learn which algorithm is selected, then again with that algorithm's
    ``config_defaults`` between the schema and the recipe (see
    :class:`polyrl.specs.AlgorithmSpec`). Raises :class:`polyrl.errors.ConfigError` with the
    closest valid key for a misspelled one.
    """
    from polyrl.config.keys import check_override_keys
    from polyrl.config.verl_compat import apply_global_micro_batches

    _store_schema()
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
    _apply_implied_settings(cfg)
    _merge_plugin_settings(cfg)
    apply_global_micro_batches(cfg, overrides)
    OmegaConf.resolve(cfg)
    return cfg


_stored_schema: list[DictConfig] = []  # the schema the ConfigStore holds, as it was built


def _store_schema() -> None:
    """Give Hydra the schema with verl's keys that polyrl does not declare mounted at verl's
    defaults (:mod:`polyrl.config.verl_compat`), whenever it differs from the one stored: the
    installed plugins' sections are part of it, and a plugin registered in-process
    (``polyrl.register``) may have added some since the last call."""
    from polyrl.config.keys import schema_keys
    from polyrl.config.sections import schema_defaults
    from polyrl.config.verl_compat import mount

    schema = schema_defaults()
    if _stored_schema and _stored_schema[0] is schema:
        return
    mounted = copy.deepcopy(schema)
    mount(mounted, set(schema_keys()))
    ConfigStore.instance().store(name=SCHEMA_NAME, node=mounted)
    _stored_schema[:] = [schema]


def _apply_implied_settings(cfg: DictConfig) -> None:
    """Write what the installed plugins' keys imply (``implies`` of their specs, see
    :class:`polyrl.specs._Spec`) into the composed config, before plugins are selected from it:
    verl's ``algorithm.rollout_correction.bypass_mode=true`` selects the policy loss it stands
    for, as verl's trainer does, and ``polyrl config`` shows the result. A key the user set to
    another value is refused in one line: silently overriding it would run another loss than
    the one asked for, and keeping it would ignore the setting that implies the other."""
    from polyrl.config.sections import schema_defaults
    from polyrl.errors import ConfigError
    from polyrl.registry import get_registry
    from polyrl.specs import resolve_object

    defaults = schema_defaults()
    for reg in get_registry().all():
        rule = getattr(reg.spec, "implies", None)
        if rule is None:
            continue
        owner = f"the plugin {reg.name!r} ({reg.provenance.distribution})"
        try:
            implied = dict(resolve_object(rule)(cfg))
        except ConfigError:
            raise
        except Exception as exc:  # a plugin bug: its keys would be silently ignored
            raise ConfigError(
                f"the settings that {owner} derives from the config cannot be computed "
                f"({type(exc).__name__}: {exc}); report it to {reg.provenance.distribution}"
            ) from exc
        for key, (value, because) in implied.items():
            current = OmegaConf.select(cfg, key, default=None)
            if current == value:
                continue
            if current != OmegaConf.select(defaults, key, default=None):
                raise ConfigError(
                    f"{key}={current} conflicts with {because}, which means {key}={value} "
                    f"to {owner}; drop one of them"
                )
            OmegaConf.update(cfg, key, value)


def _merge_plugin_settings(cfg: DictConfig) -> None:
    """Give each selected plugin that declares a ``config_class`` its typed section
    ``plugins.<name>``: the dataclass's defaults with the user's values merged over them, so
    that ``polyrl config`` shows every setting and a value of the wrong type is refused here,
    in one line naming the key and the type it takes. A section with keys the class does not
    declare is left as given: ``polyrl validate`` names the closest valid key."""
    from dataclasses import fields

    from omegaconf.errors import ValidationError

    from polyrl.config.keys import schema_types
    from polyrl.errors import ConfigError

    for name, cls in _selected_config_classes(cfg).items():
        given = OmegaConf.select(cfg, f"plugins.{name}", default=None)
        given = OmegaConf.to_container(given, resolve=False) if given is not None else {}
        if not isinstance(given, dict) or set(given) - {f.name for f in fields(cls)}:
            continue
        try:
            section = OmegaConf.merge(OmegaConf.structured(cls), given)
        except ValidationError as exc:
            key = f"plugins.{name}.{exc.full_key}" if exc.full_key else f"plugins.{name}"
            expected = schema_types(cls, f"plugins.{name}.").get(key)
            takes = f"; {key} takes {expected}" if expected else ""
            first = str(exc).splitlines()[0]
            raise ConfigError(f"invalid config: {key}: {first}{takes}") from exc
        OmegaConf.update(cfg, f"plugins.{name}", section, merge=False, force_add=True)


def _selected_config_classes(cfg: DictConfig) -> dict[str, type]:
    """``{name: config class}`` of the selected plugins that declare one (the first per name);
    names that select nothing, or classes that cannot be loaded, are left to ``polyrl
    validate``."""
    from dataclasses import is_dataclass

    from polyrl.errors import PolyrlError
    from polyrl.plan import SINGLE_KINDS, select_algorithm, select_plugins
    from polyrl.registry import get_registry
    from polyrl.specs import PluginKind, resolve_object

    registry = get_registry()
    selected = []
    try:
        name = cfg.algorithm.name
        selected.append(select_algorithm(name or None, str(cfg.algorithm.adv_estimator), registry))
    except PolyrlError:
        pass
    for kind in (*SINGLE_KINDS, PluginKind.LOGGER):
        try:
            selected += select_plugins(cfg, registry, None, (kind,)).values()
        except PolyrlError:
            continue
    classes: dict[str, type] = {}
    for reg in selected:
        target = getattr(reg.spec, "config_class", None)
        if target is None or reg.name in classes:
            continue
        try:
            cls = resolve_object(target)
        except Exception:  # noqa: BLE001 - polyrl validate reports it with the package
            continue
        if is_dataclass(cls):
            classes[reg.name] = cls
    return classes


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
