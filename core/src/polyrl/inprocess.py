"""In-process registration: plugins defined in a notebook, a script or a test, not installed.

:func:`register` adds them to this process's registry. The run plan (:mod:`polyrl.plan`) selects
them like installed ones and hands the selected registrations to the workers, so nothing needs
to be installed where the workers run. Implementations whose module no installed distribution
provides (a notebook's ``__main__``, a script, a test module) travel to Ray workers by value.
"""

from __future__ import annotations

import itertools
import sys
import types
from collections import defaultdict
from importlib import metadata
from typing import Any

from polyrl.hookspecs import hookimpl
from polyrl.specs import SPEC_TYPES, PluginKind

IN_PROCESS_DISTRIBUTION = "in-process"
_modules = itertools.count(1)


def plugin_from_specs(*specs: Any) -> types.ModuleType:
    """A plugin module whose hooks return ``specs`` (grouped by kind)."""
    from polyrl.registry import HOOK_OF_KIND

    module = types.ModuleType(f"polyrl_inprocess_plugin_{next(_modules)}")
    by_kind: dict[PluginKind, list[Any]] = defaultdict(list)
    for spec in specs:
        kind = next((k for k, t in SPEC_TYPES.items() if isinstance(spec, t)), None)
        if kind is None:
            raise TypeError(f"{spec!r} is not a polyrl spec (see polyrl.specs)")
        by_kind[kind].append(spec)
    for kind, kind_specs in by_kind.items():
        hook_name = HOOK_OF_KIND[kind]

        def hook(_specs: list[Any] = kind_specs) -> list[Any]:
            return list(_specs)

        hook.__name__ = hook_name
        setattr(module, hook_name, hookimpl(hook))
    return module


def register(
    *plugins: Any, name: str = "in-process", version: str = "0", registry: Any = None
) -> None:
    """Register ``plugins`` (specs such as ``PolicyLossSpec(...)``, or modules/objects with
    ``@polyrl.hookimpl`` functions) in this process, under the distribution ``in-process``.

    Example (a notebook)::

        import polyrl
        from polyrl.specs import PolicyLossSpec

        def my_loss(batch, log_prob, config): ...

        polyrl.register(PolicyLossSpec(name="mine", description="...", fn=my_loss))
        polyrl.train(["recipe=tiny", "actor_rollout_ref.actor.policy_loss.loss_mode=mine"])

    A name that an installed package also registers is a conflict, reported when selected.
    """
    from polyrl.registry import Provenance, get_registry

    target = registry if registry is not None else get_registry()
    specs = [p for p in plugins if isinstance(p, tuple(SPEC_TYPES.values()))]
    others = [p for p in plugins if not isinstance(p, tuple(SPEC_TYPES.values()))]
    for module in ([plugin_from_specs(*specs)] if specs else []) + others:
        before = len(target.broken)
        target.add_plugin(module, Provenance(name, IN_PROCESS_DISTRIBUTION, version))
        if len(target.broken) > before:
            raise TypeError(f"polyrl.register: {target.broken[-1].error}")
    for spec in specs:
        _travel_by_value(spec)


def _travel_by_value(spec: Any) -> None:
    """Have Ray pickle the implementations of ``spec`` by value when no installed distribution
    provides their module: a worker could not import a notebook's or a test's module."""
    installed = metadata.packages_distributions()
    for value in vars(spec).values():
        module_name = getattr(value, "__module__", None)
        if not module_name or module_name == "__main__" or isinstance(value, str):
            continue
        if module_name.partition(".")[0] in installed:
            continue
        module = sys.modules.get(module_name)
        if module is None:
            continue
        try:
            from ray import cloudpickle
        except ImportError:
            return
        cloudpickle.register_pickle_by_value(module)
