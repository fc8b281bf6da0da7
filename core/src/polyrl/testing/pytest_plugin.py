"""pytest fixtures for plugin tests (loaded by pytest through the ``pytest11`` entry point).

- ``polyrl_registry``: a fresh registry discovered from the installed plugins.
- ``isolated_registry``: a registry of polyrl's built-ins only; the process registry is replaced
  by it for the test and ``POLYRL_DISABLE_PLUGIN_AUTOLOAD=1`` is set, so subprocesses (Ray
  workers) started by the test see the same isolation.
- ``register_plugin``: a function that registers an in-process plugin (a module or object with
  ``@hookimpl`` functions, or a bare spec) into the process registry for one test.

This module is loaded in every pytest run of an environment where polyrl is installed: it must
not import torch or any backend.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from polyrl import registry as registry_module
from polyrl.inprocess import plugin_from_specs
from polyrl.registry import (
    DISABLE_AUTOLOAD_ENV,
    ONLY_PLUGINS_ENV,
    Provenance,
    Registry,
    discover,
)
from polyrl.specs import SPEC_TYPES, PluginKind


def copy_registry(source: Registry) -> Registry:
    """A registry with the same registrations, broken plugins and libraries as ``source``,
    which later additions to the copy leave untouched."""
    copy = Registry()
    for kind in PluginKind:
        copy.registrations[kind] = defaultdict(
            list, {name: list(regs) for name, regs in source.registrations[kind].items()}
        )
    copy.broken = list(source.broken)
    copy.libraries = list(source.libraries)
    copy.detect_silent = source.detect_silent  # the packages that register nothing, as found
    return copy


@pytest.fixture
def polyrl_registry() -> Registry:
    """A registry freshly discovered from the installed plugins (honours the POLYRL_* env vars)."""
    return discover()


@pytest.fixture
def isolated_registry(monkeypatch: pytest.MonkeyPatch) -> Iterator[Registry]:
    """Only polyrl's built-ins, in this process and in subprocesses the test starts."""
    monkeypatch.setenv(DISABLE_AUTOLOAD_ENV, "1")
    monkeypatch.delenv(ONLY_PLUGINS_ENV, raising=False)
    previous = registry_module._registry
    isolated = discover()
    registry_module.set_registry(isolated)
    try:
        yield isolated
    finally:
        registry_module.set_registry(previous)


@pytest.fixture
def register_plugin() -> Iterator[Callable[..., Registry]]:
    """``register_plugin(plugin, name="test", distribution="test-plugin", version="0")``.

    ``plugin`` is a module or object with ``@hookimpl`` functions, or one spec, or a list of specs.
    It is added to a copy of the process registry, which replaces it until the test ends; the
    copy is returned. Combine with ``isolated_registry`` (request it first) to see only built-ins
    plus your plugin.
    """
    previous = registry_module._registry

    def register(
        plugin: Any,
        name: str = "test",
        distribution: str = "test-plugin",
        version: str = "0",
    ) -> Registry:
        if isinstance(plugin, tuple(SPEC_TYPES.values())):
            plugin = plugin_from_specs(plugin)
        elif isinstance(plugin, (list, tuple)):
            plugin = plugin_from_specs(*plugin)
        updated = copy_registry(registry_module.get_registry())
        updated.add_plugin(plugin, Provenance(name, distribution, version))
        registry_module.set_registry(updated)
        return updated

    try:
        yield register
    finally:
        registry_module.set_registry(previous)
