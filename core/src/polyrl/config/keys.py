"""Check override keys against the schema before Hydra sees them, to suggest the closest key."""

from __future__ import annotations

import difflib
import functools
from dataclasses import fields, is_dataclass
from typing import Any, TypeVar, get_origin, get_type_hints

from omegaconf import DictConfig, OmegaConf

from polyrl.errors import ConfigError

_T = TypeVar("_T")

# Keys under these prefixes are free-form dicts: anything goes below them.
FREE_FORM_PREFIXES = (
    "plugins",
    "actor_rollout_ref.rollout.engine_kwargs",
    "actor_rollout_ref.model.override_config",
    "trainer.ray_init",
    "trainer.role_pools",
    "trainer.resource_pools",
)
GROUP_KEYS = ("recipe",)


def schema_keys(node: Any = None, prefix: str = "") -> list[str]:
    """Every dotted key the schema declares (leaves and groups): of the dataclass ``node``, or
    by default of the run's whole schema, the installed plugins' sections included."""
    if node is None:
        return _whole_schema(schema_keys)
    return list(_keys_of(node, prefix))


@functools.cache
def _keys_of(node: type, prefix: str) -> tuple[str, ...]:
    # Cached: a dataclass's fields do not change, and every override of a command line asks.
    keys: list[str] = []
    hints = get_type_hints(node)
    for f in fields(node):
        key = f"{prefix}{f.name}"
        keys.append(key)
        hint = hints[f.name]
        if is_dataclass(hint):
            keys.extend(_keys_of(hint, key + "."))
    return tuple(keys)


def free_form_prefixes() -> tuple[str, ...]:
    """Groups that take any key below them: polyrl's open dicts and verl's open groups that
    polyrl does not declare (:mod:`polyrl.config.verl_compat`)."""
    from polyrl.config.verl_compat import open_groups

    mappings = [key for key, kind in schema_types().items() if kind == "a mapping, e.g. {a: 1}"]
    return (*FREE_FORM_PREFIXES, *mappings, *open_groups(set(schema_keys())))


def normalize_overrides(overrides: list[str]) -> list[str]:
    """Overrides with keys below a free-form prefix written as ``++key=value``.

    The schema declares ``plugins`` (and a few others) as open dicts, but Hydra only lets
    ``key=value`` change keys that already exist: ``plugins.mysandbox.url=...`` would need a ``+``
    the first time and must not have one once a recipe sets it. ``++`` means "add or override",
    so users write plugin keys like any other key. verl's ``+key=value`` (verl needs the ``+``
    for keys it does not declare; polyrl may declare them) is read as ``++`` too, and verl's
    ``~key`` on a declared key puts that key back to its default (:func:`_without_removed`).
    """
    prefixes = tuple(p + "." for p in free_form_prefixes())
    out = []
    for item in _without_removed(overrides):
        if item.startswith("+") and not item.startswith("++") and "=" in item:
            item = "+" + item
        bare = item.lstrip("+")
        if bare.startswith(prefixes) and "=" in item:
            out.append("++" + bare)
        else:
            out.append(_as_list_value(item))
    return out


def _without_removed(overrides: list[str]) -> list[str]:
    """``~key`` of a declared key: that key's earlier overrides are dropped, so it keeps its
    default (a schema key cannot be deleted); ``~`` below a free-form group is Hydra's delete."""
    declared = set(schema_keys())
    out: list[str] = []
    for item in overrides:
        key = item.split("=", 1)[0]
        if key.startswith("~") and key[1:] in declared:
            gone = key[1:]
            out = [o for o in out if o.split("=", 1)[0].lstrip("+~") != gone]
            continue
        out.append(item)
    return out


def _as_list_value(override: str) -> str:
    """``trainer.logger=console`` -> ``trainer.logger=[console]``: verl accepts a scalar where a
    list is declared, so a verl command line must work here too. Likewise an empty value of a
    boolean key (``use_kl_loss=``, what bash makes of an unset variable) reads as false: verl's
    config classes keep the empty string, which its code tests as false."""
    key, sep, value = override.partition("=")
    if sep and value == "" and schema_types().get(key.lstrip("+~")) == "true or false":
        return f"{key}=false"
    if not sep or value.startswith("[") or value in ("null", ""):
        return override
    if schema_types().get(key.lstrip("+~")) == "a list, e.g. [a,b]":
        return f"{key}=[{value}]"
    return override


def check_override_keys(overrides: list[str]) -> None:
    """Raise :class:`ConfigError` for an override whose key the schema does not declare.

    Also rewrites ``overrides`` in place: plugins' declared key aliases become the keys they
    mean, and :func:`normalize_overrides` applies, so that callers that pass their list on to
    Hydra get keys under free-form sections (``plugins.<name>.*``) accepted.
    """
    from polyrl.config.sections import apply_aliases
    from polyrl.config.verl_compat import ALIASES, added_key_message, compat_keys

    given = apply_aliases(overrides, extra=ALIASES)
    added = {o.split("=", 1)[0][1:] for o in given if o.startswith("+") and o[1:2] != "+"}
    overrides[:] = normalize_overrides(given)
    declared = set(schema_keys())
    valid = declared | set(compat_keys(declared))
    free = tuple(p + "." for p in free_form_prefixes())
    for override in overrides:
        key = override.split("=", 1)[0].lstrip("+~")
        if "=" not in override and not override.startswith("~"):
            raise ConfigError(
                f"override {override!r} has no value: write it as key=value, "
                f"e.g. trainer.total_training_steps=10"
            )
        if key in GROUP_KEYS or key in valid or key.startswith(free):
            continue
        if key in added:
            raise ConfigError(added_key_message(key))
        raise ConfigError(unknown_key_message(key, valid))


def unknown_key_message(key: str, valid: set[str]) -> str:
    parent = key.rpartition(".")[0]
    siblings = [k for k in valid if k.rpartition(".")[0] == parent]
    close = difflib.get_close_matches(key, siblings, n=1, cutoff=0.6) or difflib.get_close_matches(
        key, sorted(valid), n=1, cutoff=0.6
    )
    hint = f" Did you mean {close[0]!r}?" if close else ""
    owner = _uninstalled_owner(key)
    if owner:
        return (
            f"unknown config key {key!r}: it belongs to {owner}, which is not installed "
            f"(pip install {owner})."
        )
    return f"unknown config key {key!r}.{hint} Run `polyrl config` to see every key."


def _uninstalled_owner(key: str) -> str | None:
    """The first-party package that declares the group ``key`` lies in, when not installed."""
    from importlib import metadata

    from polyrl.specs import FIRST_PARTY_SECTIONS

    for group, package in FIRST_PARTY_SECTIONS.items():
        if key == group or key.startswith(group + "."):
            try:
                metadata.distribution(package)
            except metadata.PackageNotFoundError:
                return package
    return None


def hydra_error_to_config_error(exc: Exception) -> ConfigError:
    """Hydra's messages are long and mention internals; keep the line that says what is wrong."""
    message = str(exc).strip()
    if "recipe" in message and ("Could not find" in message or "not found" in message):
        from polyrl.config.recipes import available_recipes

        return ConfigError(
            f"unknown recipe. Available recipes: {', '.join(available_recipes())}. "
            f"({message.splitlines()[0]})"
        )
    if type(exc).__name__ == "OverrideParseException":
        first = message.splitlines()[0]
        return ConfigError(
            f"cannot parse an override ({first}). A value containing = ? , [ ] {{ }} or spaces "
            f"must be quoted, e.g. "
            f"'data.train_files=\"builtin:reasoning_gym/chain_sum?train_size=64\"'"
        )
    cause = exc.__cause__
    if type(cause).__name__ == "ValidationError":
        return ConfigError(f"invalid config: {override_type_error(message, str(cause))}")
    return ConfigError(f"invalid config: {' '.join(message.split())}")


def override_type_error(message: str, cause: str) -> str:
    """OmegaConf's type error for an override as one line: the override, what was wrong with its
    value, and the type the key takes (from the schema)."""
    what = cause.splitlines()[0].strip()
    override = message.removeprefix("Error merging override ").strip()
    key = override.split("=", 1)[0].lstrip("+~")
    expected = schema_types().get(key)
    hint = f"; {key} takes {expected}" if expected else ""
    return f"{override}: {what}{hint}"


def schema_types(node: Any = None, prefix: str = "") -> dict[str, str]:
    """The declared type of every leaf key, written as a user would (``an integer``, ``a list,
    e.g. [a,b]`` ...); by default of the run's whole schema."""
    if node is None:
        return _whole_schema(schema_types)
    return dict(_types_of(node, prefix))


@functools.cache
def _types_of(node: type, prefix: str) -> tuple[tuple[str, str], ...]:
    names = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}
    types: dict[str, str] = {}
    hints = get_type_hints(node)
    for f in fields(node):
        key, hint = f"{prefix}{f.name}", hints[f.name]
        if is_dataclass(hint):
            types.update(_types_of(hint, key + "."))
        elif get_origin(hint) is list:
            types[key] = "a list, e.g. [a,b]"
        elif get_origin(hint) is dict:
            types[key] = "a mapping, e.g. {a: 1}"
        elif hint in names:
            types[key] = names[hint]
    return tuple(types.items())


def _whole_schema(walk: Any) -> Any:
    """``walk`` (:func:`schema_keys` or :func:`schema_types`) over core's schema and every
    installed plugin's config section; for keys, with the groups a section's path creates."""
    from polyrl.config.sections import section_classes

    if walk is schema_types:
        types: dict[str, str] = {}
        for path, cls in section_classes():
            types.update(schema_types(cls, f"{path}." if path else ""))
        return types
    keys: list[str] = []
    for path, cls in section_classes():
        parts = path.split(".") if path else []
        keys.extend(".".join(parts[: i + 1]) for i in range(len(parts)))
        keys.extend(schema_keys(cls, f"{path}." if path else ""))
    return list(dict.fromkeys(keys))


def plugin_settings(node: Any, name: str, config_class: type[_T]) -> _T:
    """A plugin's own section ``plugins.<name>`` of the run config, as ``config_class``.

    ``node`` is any config node the plugin was handed (the ``algorithm`` node an estimator gets,
    ``ctx.reward_model`` of a reward provider, the whole config, or the plain dict of the whole
    config that workers receive): the section is looked up from the root of that config. Absent
    keys take the dataclass defaults; an unknown key raises :class:`ConfigError` naming the closest
    valid key (``polyrl validate`` reports the same before the run starts).
    """
    section: Any = None
    if isinstance(node, DictConfig):
        root = node._get_root()
        found = OmegaConf.select(root, f"plugins.{name}", default=None)
        if found is not None:
            section = OmegaConf.to_container(found, resolve=True)
    elif isinstance(node, dict):
        section = (node.get("plugins") or {}).get(name)
    section = dict(section or {})
    valid = [f.name for f in fields(config_class)]  # type: ignore[arg-type]
    for key in section:
        if key not in valid:
            close = difflib.get_close_matches(str(key), valid, n=1)
            hint = f" Did you mean plugins.{name}.{close[0]}?" if close else ""
            raise ConfigError(
                f"unknown key plugins.{name}.{key}.{hint} Valid keys: {', '.join(valid)}"
            )
    return config_class(**section)
