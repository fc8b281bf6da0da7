"""The part of the run plan a worker builds its roles from (:mod:`polyrl.plan` makes it).

Workers get the registrations the driver selected, pickled with their other arguments, and load
implementations from them: no worker consults a registry, so what the driver selected (an
installed plugin, or one registered in-process with :func:`polyrl.register`) is what runs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from polyrl.errors import PolyrlError
from polyrl.specs import PluginKind


@dataclass(frozen=True)
class WorkerPlan:
    """The part of the run plan a worker builds its roles from: the selected registration of
    each ``(kind, name)`` the roles may load, and the classes of roles beyond core's."""

    registrations: Mapping[tuple[PluginKind, str], Any] = field(default_factory=dict)
    role_classes: Mapping[str, type | str] = field(default_factory=dict)

    def registration(self, kind: PluginKind, name: str) -> Any:
        """The registration the plan selected for ``name``; an error naming what the plan holds
        when it selected none (a role asking for a plugin no config key selects)."""
        found = self.registrations.get((kind, str(name)))
        if found is None:
            held = sorted(n for k, n in self.registrations if k is kind)
            raise PolyrlError(
                f"the run plan selected no {kind.value} {name!r} (it holds {held}): a role may "
                f"only build plugins a config key selects; an algorithm names extra keys in "
                f"AlgorithmSpec.plugin_keys"
            )
        return found

    def load(self, kind: PluginKind, name: str) -> Any:
        """The implementation (class or callable) of the selected plugin ``name``."""
        return self.registration(kind, name).load()
