"""The run's schema: core's groups with every installed plugin's config sections mounted.

Core declares only what every run needs (:mod:`polyrl.config.schema`). A plugin declares the keys
it reads itself, as dataclasses placed at verl's paths in the tree (``config_sections`` of its
spec, e.g. the FSDP engine's ``actor_rollout_ref.actor.fsdp_config``). Sections are mounted for
every *installed* plugin, not only the selected ones: verl's command lines set keys of backends
they do not select, and a key must mean the same whether or not its owner is picked. Once
mounted, a section is an ordinary typed node: Hydra type-checks overrides, ``polyrl config``
shows the defaults, a misspelled key gets "did you mean", and code reads it by attribute.

Two plugins may declare the same key (the vLLM and SGLang engines both read verl's
``enable_prefix_caching``) only with the same type and default; otherwise the first keeps it and
the clash is reported by ``polyrl validate`` (:func:`section_problems`), naming both packages.

``key_aliases`` of a spec map an older or verl-only key (or group) to the key it means; command
-line overrides are rewritten before the config is composed (:func:`apply_aliases`).
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable
from dataclasses import dataclass, is_dataclass
from typing import Any, TypeVar

from omegaconf import DictConfig, OmegaConf, open_dict

from polyrl.config.schema import PolyrlConfig

log = logging.getLogger(__name__)
_V = TypeVar("_V")


@dataclass(frozen=True)
class ConfigSection:
    """One plugin's typed section at ``path``: ``default`` is the dataclass, or an instance of it
    whose values may be interpolations (``"${actor_rollout_ref.actor.fsdp_config.x}"``)."""

    path: str
    default: Any
    owner: str  # "name (distribution)", for messages

    @property
    def dataclass(self) -> type:
        return self.default if isinstance(self.default, type) else type(self.default)


@dataclass(frozen=True)
class _Mounted:
    sections: tuple[ConfigSection, ...]
    aliases: dict[str, str]
    problems: tuple[str, ...]


_cache: dict[tuple[int, ...], tuple[tuple[Any, ...], _Mounted]] = {}
#: The schema built from the cached :class:`_Mounted` (with the problems met mounting it): a
#: command line is checked against it several times, and building it is most of a check.
_schemas: dict[tuple[int, ...], tuple[tuple[Any, ...], tuple[DictConfig, tuple[str, ...]]]] = {}
#: Registries kept in each cache: a config may be loaded with the process-wide registry and
#: validated with the caller's own, and one entry would rebuild the schema at every switch.
_KEPT = 4


def installed_sections(registry: Any = None) -> tuple[ConfigSection, ...]:
    """Every installed plugin's config sections, parents before children."""
    return _mounted(registry).sections


def key_aliases(registry: Any = None) -> dict[str, str]:
    """``{alias: key}`` declared by the installed plugins."""
    return _mounted(registry).aliases


def section_problems(registry: Any = None) -> list[str]:
    """Sections that could not be mounted: an import that failed, a key declared twice with
    different types or defaults. One line each, naming the packages."""
    mounted = _mounted(registry)
    problems = list(mounted.problems)
    schema_defaults(registry, problems)
    return problems


def schema_config(registry: Any = None, problems: list[str] | None = None) -> DictConfig:
    """A fresh, typed and struct-mode config of every key a run may set: core's schema with the
    installed plugins' sections mounted, at their defaults."""
    return copy.deepcopy(schema_defaults(registry, problems))  # callers may change theirs


def schema_defaults(registry: Any = None, problems: list[str] | None = None) -> DictConfig:
    """:func:`schema_config`'s config itself, shared, for reading defaults only: a copy of the
    whole schema costs more than most validations' checks, and a validation reads it several
    times. Never change it (every later caller would see the change)."""

    def build() -> tuple[DictConfig, tuple[str, ...]]:
        cfg = OmegaConf.structured(PolyrlConfig)
        owners: dict[str, str] = {}
        met: list[str] = []
        with open_dict(cfg):
            for section in _mounted(registry).sections:
                _mount(cfg, section, owners, met)
        return cfg, tuple(met)

    schema, met = _cached(_schemas, registry, build)
    if problems is not None:
        problems.extend(met)
    return schema


def apply_aliases(
    overrides: list[str], registry: Any = None, extra: dict[str, str] | None = None
) -> list[str]:
    """``overrides`` with every key that is a declared alias (or lies below an aliased group),
    or one of ``extra`` (core's), written as the key it means; the ``+``/``++``/``~`` prefix
    is kept."""
    aliases = {**key_aliases(registry), **(extra or {})}
    if not aliases:
        return list(overrides)
    rewritten = []
    for item in overrides:
        key, sep, value = item.partition("=")
        bare = key.lstrip("+~")
        prefix = key[: len(key) - len(bare)]
        rewritten.append(f"{prefix}{_alias_target(bare, aliases)}{sep}{value}")
    return rewritten


def _alias_target(key: str, aliases: dict[str, str]) -> str:
    if key in aliases:
        return aliases[key]
    parts = key.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        group = ".".join(parts[:cut])
        if group in aliases:
            return ".".join([aliases[group], *parts[cut:]])
    return key


def _cached(
    cache: dict[tuple[int, ...], tuple[tuple[Any, ...], _V]], registry: Any, build: Callable[[], _V]
) -> _V:
    """``build()`` for ``registry`` as it is now, from ``cache`` when built before. What the
    mounted sections depend on is the key: the registry and the specs registered in it (a
    registration changes it); the entry holds them, so that no other object takes their ids
    while it is cached. Beyond :data:`_KEPT` entries the oldest is dropped."""
    from polyrl.registry import get_registry

    registry = registry if registry is not None else get_registry()
    owners = (registry, *(reg.spec for reg in registry.all()))
    key = tuple(map(id, owners))
    if key not in cache:
        while len(cache) >= _KEPT:
            del cache[next(iter(cache))]
        cache[key] = (owners, build())
    return cache[key][1]


def _mounted(registry: Any) -> _Mounted:
    from polyrl.registry import get_registry

    registry = registry if registry is not None else get_registry()
    return _cached(_cache, registry, lambda: _collect(registry.all()))


def _collect(registrations: list[Any]) -> _Mounted:
    from polyrl.specs import resolve_object

    sections: dict[tuple[str, Any], ConfigSection] = {}
    aliases: dict[str, str] = {}
    problems: list[str] = []
    for reg in registrations:
        owner = f"{reg.name} ({reg.provenance.distribution})"
        for path, target in dict(getattr(reg.spec, "config_sections", {}) or {}).items():
            ident = (path, target if isinstance(target, str) else id(target))
            if ident in sections:
                continue
            try:
                default = resolve_object(target)
            except Exception as exc:  # noqa: BLE001 - reported, the rest of the schema still works
                problems.append(
                    f"config section {path} of {owner} cannot be loaded: {target!r} "
                    f"({type(exc).__name__}: {exc}); its keys are unknown until it imports"
                )
                continue
            if not is_dataclass(default):
                problems.append(
                    f"config section {path} of {owner} must be a dataclass or an instance of "
                    f"one, got {type(default).__name__}"
                )
                continue
            sections[ident] = ConfigSection(path, default, owner)
        for alias, meant in dict(getattr(reg.spec, "key_aliases", {}) or {}).items():
            aliases.setdefault(alias, meant)
    ordered = sorted(sections.values(), key=lambda s: s.path.count("."))
    return _Mounted(tuple(ordered), aliases, tuple(problems))


def _mount(cfg: DictConfig, section: ConfigSection, owners: dict[str, str], problems: list) -> None:
    node = OmegaConf.structured(section.default)
    existing = OmegaConf.select(cfg, section.path)
    if existing is None:
        OmegaConf.update(cfg, section.path, node, force_add=True)
        for leaf in _leaf_keys(node, section.path):
            owners[leaf] = section.owner
        return
    _merge_into(existing, node, section.path, section.owner, owners, problems)


def _merge_into(
    parent: DictConfig,
    node: DictConfig,
    base: str,
    owner: str,
    owners: dict[str, str],
    problems: list,
) -> None:
    """Add ``node``'s keys to the existing group ``parent`` (at ``base``), keeping its type."""
    with open_dict(parent):
        _add_keys(parent, node, base, owner, owners, problems)


def _add_keys(
    parent: DictConfig,
    node: DictConfig,
    base: str,
    owner: str,
    owners: dict[str, str],
    problems: list,
) -> None:
    for key in node:
        full = f"{base}.{key}"
        child = node._get_node(key)
        if key not in parent:
            parent[key] = child
            for leaf in _leaf_keys(child, full) if isinstance(child, DictConfig) else [full]:
                owners[leaf] = owner
            continue
        current = parent._get_node(key)
        if isinstance(current, DictConfig) and isinstance(child, DictConfig):
            _merge_into(current, child, full, owner, owners, problems)
            continue
        if _same_declaration(current, child):
            continue
        first = owners.get(full, "core")
        problems.append(
            f"config key {full} is declared by {first} and again, differently, by "
            f"{owner}; the first declaration is kept"
        )


def _same_declaration(a: Any, b: Any) -> bool:
    return type(a) is type(b) and a._value() == b._value()


def _leaf_keys(node: DictConfig, prefix: str) -> list[str]:
    keys = []
    for key in node:
        child = node._get_node(key)
        full = f"{prefix}.{key}"
        keys.extend(_leaf_keys(child, full) if isinstance(child, DictConfig) else [full])
    return keys


def section_classes(registry: Any = None) -> list[tuple[str, type]]:
    """``(path, dataclass)`` of core's schema (path ``""``) and of each installed section: what
    the key walkers of :mod:`polyrl.config.keys` read types from."""
    return [("", PolyrlConfig), *((s.path, s.dataclass) for s in installed_sections(registry))]


__all__ = [
    "ConfigSection",
    "apply_aliases",
    "installed_sections",
    "key_aliases",
    "schema_config",
    "section_classes",
    "section_problems",
]


def following(settings: type, path: str, *, except_keys: tuple[str, ...] = ()) -> Any:
    """An instance of the dataclass ``settings`` whose every field defaults to the same key of
    the section at ``path`` (``"${path.key}"``), except ``except_keys``: a section that follows
    another one key by key unless set, as verl's reference and critic follow the actor."""
    from dataclasses import fields

    values = {
        f.name: f"${{{path}.{f.name}}}" for f in fields(settings) if f.name not in except_keys
    }
    return settings(**values)
