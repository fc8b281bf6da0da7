"""Plugin discovery and lookup.

Discovery loads every entry point of the group ``polyrl`` (plus polyrl's own built-ins, which
register through the same hooks) in whichever process asks: the driver and each Ray worker call
:func:`get_registry` themselves. A plugin that fails to import, or whose hook raises, is recorded
as broken with its error instead of breaking unrelated commands; the error is shown when a user
selects one of its names and in ``polyrl plugins``. That includes a module that calls
``sys.exit`` or raises ``KeyboardInterrupt`` while it imports, and one whose import blocks: it is
abandoned after ``POLYRL_PLUGIN_DISCOVERY_TIMEOUT_S`` (see :mod:`polyrl.plugin_import`).
An installed package that looks like a plugin (named ``polyrl-*``, or depending on polyrl) but
has no entry point in the group is recorded too (:attr:`Registry.silent_packages`, read from
package metadata on first use), so that ``polyrl plugins``, ``polyrl doctor`` and an "unknown
name" error can say what its pyproject lacks.

Environment variables (read at discovery time):

``POLYRL_DISABLE_PLUGIN_AUTOLOAD=1``
    load no installed plugin packages, only polyrl's built-ins (tests, debugging).
``POLYRL_PLUGINS=name1,name2``
    load only these entry points (by entry-point name or distribution name).
``POLYRL_PLUGIN_DISCOVERY_TIMEOUT_S=20``
    how long a plugin's entry-point module (or light implementation) may take to import before
    it is abandoned and the plugin listed as broken.
"""

from __future__ import annotations

import difflib
import importlib.util
import os
import re
import traceback
from collections import defaultdict
from dataclasses import dataclass
from importlib import metadata
from importlib.machinery import PathFinder
from types import ModuleType
from typing import Any

import pluggy
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from polyrl import hookspecs
from polyrl.errors import PolyrlError
from polyrl.plugin_import import (
    DISCOVERY_TIMEOUT_ENV,
    PluginCodeRaised,
    PluginImportBlocked,
    abandoned_imports,
    describe,
    discovery_timeout_s,
    record_abandoned,
    run_bounded,
)
from polyrl.specs import (
    API_VERSION,
    FIRST_PARTY_PACKAGES,
    SPEC_TYPES,
    UNRELEASED_PACKAGES,
    PluginKind,
)
from polyrl.watchdog import IMPORT_TIMEOUT_ENV, deadline, import_timeout_s

ENTRY_POINT_GROUP = "polyrl"
DISABLE_AUTOLOAD_ENV = "POLYRL_DISABLE_PLUGIN_AUTOLOAD"
ONLY_PLUGINS_ENV = "POLYRL_PLUGINS"
BUILTIN_DISTRIBUTION = "polyrl"

HOOK_OF_KIND = {
    PluginKind.TRAINING_ENGINE: "polyrl_training_engines",
    PluginKind.ROLLOUT_ENGINE: "polyrl_rollout_engines",
    PluginKind.ADVANTAGE_ESTIMATOR: "polyrl_advantage_estimators",
    PluginKind.POLICY_LOSS: "polyrl_policy_losses",
    PluginKind.REWARD_PROVIDER: "polyrl_reward_providers",
    PluginKind.LOGGER: "polyrl_loggers",
    PluginKind.ALGORITHM: "polyrl_algorithms",
    PluginKind.DATA_SOURCE_SCORER: "polyrl_data_source_scorers",
    PluginKind.SCHEDULE: "polyrl_schedules",
    PluginKind.ENVIRONMENT: "polyrl_environments",
}
# Kinds whose implementations import torch, vLLM, Megatron ...: ``polyrl plugins`` only locates
# their modules (no import) unless asked to import them.
HEAVY_KINDS = frozenset({PluginKind.TRAINING_ENGINE, PluginKind.ROLLOUT_ENGINE})
# The attribute of each spec type that names its implementation.
IMPLEMENTATION_ATTRIBUTES = (
    "engine",
    "fn",
    "provider",
    "logger",
    "pipeline",
    "schedule",
    "environment",
)
ENTRY_POINT_HINT = '[project.entry-points.polyrl] <name> = "<module>"'


class PluginNotFoundError(PolyrlError):
    """No plugin of that kind has that name."""


class PluginConflictError(PolyrlError):
    """Two packages registered the same name for the same kind."""


class PluginBrokenError(PolyrlError):
    """The plugin that provides a name failed to import or to load its implementation."""


class PluginIncompatibleError(PolyrlError):
    """The plugin that provides a name declares a polyrl API range that excludes this polyrl's
    (or an invalid one): no config fixes it, only installing another release does."""


@dataclass(frozen=True)
class Provenance:
    """Where a registration came from."""

    plugin: str
    distribution: str
    version: str


@dataclass(frozen=True)
class Registration:
    """A spec plus where it came from."""

    kind: PluginKind
    spec: Any
    provenance: Provenance

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def incompatibility(self) -> str | None:
        """None when the spec's ``api_version`` admits this polyrl's API (or declares nothing),
        else why not and which release to install (one line)."""
        return api_incompatibility(
            self.spec.api_version, self.provenance.distribution, self.provenance.version
        )

    def require_compatible(self) -> None:
        """Raise :class:`PluginIncompatibleError` (one line) when :attr:`incompatibility` says
        why this registration cannot be used."""
        why = self.incompatibility
        if why:
            raise PluginIncompatibleError(f"{self.kind.value} {self.name!r} is incompatible: {why}")

    @property
    def target(self) -> Any:
        """What the spec names as its implementation (an import string, or the object)."""
        return implementation_target(self.spec)

    def locate_problem(self) -> str | None:
        """None when the implementation's module can be found without running any of its code
        (or the spec holds the object itself), else why not (one line)."""
        target = self.target
        if not isinstance(target, str):
            return None
        distribution = self.provenance.distribution
        module_name, sep, attribute = target.partition(":")
        if not sep or not module_name or not attribute:
            return (
                f"package {distribution} registers a malformed import string {target!r} "
                f"(expected 'package.module:Attribute'); report it upstream"
            )
        why = module_findable(module_name)
        if why:
            return (
                f"its implementation {target!r} from package {distribution} "
                f"{self.provenance.version} cannot be found ({why}). Reinstall it: "
                f"pip install '{distribution}'"
            )
        return None

    def implementation_problem(self, import_heavy: bool = False) -> str | None:
        """None when the implementation resolves, else why not (one line).

        Light kinds (estimators, losses, rewards, loggers, algorithms) are loaded as
        :meth:`load` does, in a thread abandoned after the discovery bound (their modules must
        stay light), so that whatever they do cannot end or hold the listing. Heavy kinds
        (:data:`HEAVY_KINDS`: their import pulls torch, vLLM, Megatron ...) are only located
        unless ``import_heavy``, and then loaded by :meth:`load` itself.
        """
        located = self.locate_problem()
        if located or (self.kind in HEAVY_KINDS and not import_heavy):
            return located
        try:
            if self.kind in HEAVY_KINDS:
                self.load()
            else:
                run_bounded(self.load, discovery_timeout_s())
        except PluginBrokenError as exc:
            return " ".join(str(exc).split())
        except PluginCodeRaised as exc:
            return " ".join(str(exc.cause).split())
        except PluginImportBlocked as exc:
            return (
                f"loading its implementation {self.target!r} from package "
                f"{self.provenance.distribution} {exc}, so it was abandoned: fix or reinstall "
                f"it, or raise {DISCOVERY_TIMEOUT_ENV} if it is only slow"
            )
        return None

    def load(self) -> Any:
        """Resolve the implementation; an import failure names the package and how to fix it."""
        distribution = self.provenance.distribution
        try:
            with deadline(
                f"loading {self.kind.value} {self.name!r} from package {distribution}",
                f"its import blocks: fix or reinstall {distribution}, or raise "
                f"{IMPORT_TIMEOUT_ENV} if it is only slow",
                import_timeout_s(),
            ):
                return self.spec.load()
        except (Exception, SystemExit) as exc:  # a module's own sys.exit is a failure to load
            raise PluginBrokenError(
                f"{self.kind.value} {self.name!r} from package {self.provenance.distribution} "
                f"{self.provenance.version} failed to load: {describe(exc)}. "
                f"Reinstall it or install its missing dependencies "
                f"(pip install '{self.provenance.distribution}')."
            ) from exc


def api_incompatibility(
    declared: object, distribution: str, version: str, api_version: str = API_VERSION
) -> str | None:
    """None when the PEP 440 specifier ``declared`` (a spec's ``api_version``; None: no
    declaration) admits ``api_version``, else one line: what package ``distribution`` ``version``
    supports and what to install instead."""
    if declared is None:
        return None
    package = f"{distribution} {version}"
    major = api_version.split(".")[0]
    try:
        if not isinstance(declared, str):
            raise InvalidSpecifier(f"{declared!r} is not a string")
        supported = SpecifierSet(declared)
    except InvalidSpecifier:
        return (
            f"{package} declares api_version={declared!r}, which is not a PEP 440 version "
            f"specifier (such as '>={major}.0,<{int(major) + 1}'): install another {distribution} "
            f"release, or report it upstream"
        )
    if supported.contains(api_version, prereleases=True):
        return None
    if _asks_newer(supported, Version(api_version)):
        advice = f"upgrade polyrl or install a {distribution} release for API {major}.x"
    else:
        advice = f"install a {distribution} release for API {major}.x"
    return (
        f"{package} supports polyrl API {declared.strip()}, this polyrl has API {api_version}: "
        f"{advice}"
    )


def _asks_newer(supported: SpecifierSet, current: Version) -> bool:
    """Whether a lower bound of ``supported`` lies above ``current`` (the plugin was written for
    a later API, so a newer polyrl may satisfy it; otherwise only an older plugin release can)."""
    for specifier in supported:
        if specifier.operator not in (">", ">=", "~=", "==", "==="):
            continue
        try:
            bound = Version(specifier.version.removesuffix(".*"))
        except InvalidVersion:
            continue
        if bound > current:
            return True
    return False


def implementation_target(spec: Any) -> Any:
    """The import string (or object) a spec names as its implementation, or None."""
    for attr in IMPLEMENTATION_ATTRIBUTES:
        if hasattr(spec, attr):
            return getattr(spec, attr)
    return None


def module_findable(module_name: str) -> str | None:
    """None if ``module_name`` can be found on the path without executing any of it, else why not.

    ``importlib.util.find_spec("a.b")`` would import ``a``; instead the top-level package is located
    with the import system's finders and each submodule inside its parent's folder.
    """
    parts = module_name.split(".")
    try:
        spec = importlib.util.find_spec(parts[0])
    except (ImportError, ValueError) as exc:
        return f"{type(exc).__name__}: {exc}"
    if spec is None:
        return f"No module named {parts[0]!r}"
    for depth in range(1, len(parts)):
        locations = spec.submodule_search_locations
        name = ".".join(parts[: depth + 1])
        if locations is None:
            return f"{'.'.join(parts[:depth])!r} is not a package, so {name!r} cannot exist"
        sub = PathFinder.find_spec(name, list(locations))
        if sub is None:
            return f"No module named {name!r}"
        spec = sub
    return None


@dataclass(frozen=True)
class SilentPackage:
    """An installed distribution that looks like a polyrl plugin but registers nothing: named
    ``polyrl-*``/``polyrl_*``, or depending on polyrl, with no entry point in the group
    ``polyrl``."""

    distribution: str
    version: str
    named_like_plugin: bool

    def message(self) -> str:
        why = "is named like a polyrl plugin" if self.named_like_plugin else "depends on polyrl"
        return (
            f"package {self.distribution} {self.version} {why} and is installed but registers no "
            f"polyrl plugin: its pyproject needs {ENTRY_POINT_HINT} (then reinstall it)"
        )


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirement_name(requirement: str) -> str | None:
    """The distribution a ``Requires-Dist`` line names, unless it is an extra's requirement."""
    name, _, marker = requirement.partition(";")
    if "extra" in marker:
        return None
    found = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", name)
    return _normalized(found.group(1)) if found else None


def find_silent_packages() -> list[SilentPackage]:
    """Installed distributions that look like polyrl plugins but have no ``polyrl`` entry point
    (read from package metadata only: nothing is imported)."""
    seen: set[str] = set()
    silent: list[SilentPackage] = []
    for dist in metadata.distributions():
        meta = dist.metadata
        name = meta["Name"] if meta is not None else None
        if not name or _normalized(name) in seen:
            continue  # a distribution on two path entries: the first one is the one imported
        seen.add(_normalized(name))
        if _normalized(name) == BUILTIN_DISTRIBUTION:
            continue
        named_like = _normalized(name).startswith(f"{BUILTIN_DISTRIBUTION}-")
        depends = any(
            _requirement_name(req) == BUILTIN_DISTRIBUTION
            for req in meta.get_all("Requires-Dist") or ()
        )
        if (named_like or depends) and not any(
            ep.group == ENTRY_POINT_GROUP for ep in dist.entry_points
        ):
            silent.append(SilentPackage(name, dist.version, named_like))
    return sorted(silent, key=lambda p: _normalized(p.distribution))


@dataclass(frozen=True)
class BrokenPlugin:
    """A plugin module that could not be imported, or whose hook raised."""

    plugin: str
    distribution: str
    version: str
    error: str
    traceback: str


class Registry:
    """Every registration of every kind, with provenance, conflicts and broken plugins."""

    def __init__(self) -> None:
        self.registrations: dict[PluginKind, dict[str, list[Registration]]] = {
            kind: defaultdict(list) for kind in PluginKind
        }
        self.broken: list[BrokenPlugin] = []
        # Entry points whose module loads and registers nothing on purpose: libraries that
        # plugins depend on (polyrl-engine-kit), listed so that an install can be checked.
        self.libraries: list[Provenance] = []
        # Installed plugin packages that POLYRL_PLUGINS / POLYRL_DISABLE_PLUGIN_AUTOLOAD kept
        # from loading: an unknown name they may provide must say so, not "install it".
        self.filtered_out: list[str] = []
        # Installed packages that look like plugins but register nothing (see SilentPackage):
        # found on first use when ``detect_silent`` (set by discover()), so that processes that
        # never list plugins or miss a name do not pay for reading every package's metadata.
        self.detect_silent = False
        self._silent_packages: list[SilentPackage] | None = None
        self.plugin_manager = pluggy.PluginManager(hookspecs.PROJECT_NAME)
        self.plugin_manager.add_hookspecs(hookspecs)

    # ---- building --------------------------------------------------------------------------
    def add_plugin(self, module: ModuleType | object, provenance: Provenance) -> None:
        """Register a plugin module (or object with hookimpls) and collect its registrations."""
        try:
            # Name by distribution too: two packages may use the same entry-point name, and
            # pluggy refuses a second plugin under a name it already holds.
            self.plugin_manager.register(
                module, name=f"{provenance.distribution}/{provenance.plugin}"
            )
        except Exception as exc:  # noqa: BLE001 - a broken plugin is reported, not fatal
            self._mark_broken(provenance, exc)
            return
        try:
            # A misspelled hook name (``polyrl_algorithm`` for ``polyrl_algorithms``) would
            # otherwise register nothing, silently.
            self.plugin_manager.check_pending()
        except pluggy.PluginValidationError as exc:
            self.plugin_manager.unregister(module)
            self._mark_broken(provenance, exc)
            return
        hooked = False
        for kind, hook_name in HOOK_OF_KIND.items():
            for impl in getattr(self.plugin_manager.hook, hook_name).get_hookimpls():
                if impl.plugin is not module:
                    continue
                hooked = True
                try:
                    specs = run_bounded(
                        lambda function=impl.function: list(function() or ()),
                        discovery_timeout_s(),
                    )
                    for spec in specs:
                        self._add_spec(kind, spec, provenance)
                except PluginImportBlocked as exc:
                    self._mark_broken_blocked(provenance, f"its hook {hook_name}", exc)
                except Exception as exc:  # noqa: BLE001 - a broken plugin is reported, not fatal
                    self._mark_broken(provenance, exc)
        if not hooked:
            self.libraries.append(provenance)

    def _add_spec(self, kind: PluginKind, spec: Any, provenance: Provenance) -> None:
        expected = SPEC_TYPES[kind]
        if not isinstance(spec, expected):
            raise TypeError(
                f"hook {HOOK_OF_KIND[kind]} must yield {expected.__name__} objects, "
                f"got {type(spec).__name__}"
            )
        self.registrations[kind][spec.name].append(Registration(kind, spec, provenance))

    def _mark_broken(self, provenance: Provenance, exc: BaseException) -> None:
        if isinstance(exc, PluginCodeRaised):
            exc = exc.cause
        self.broken.append(
            BrokenPlugin(
                plugin=provenance.plugin,
                distribution=provenance.distribution,
                version=provenance.version,
                error=describe(exc),
                traceback="".join(traceback.format_exception(exc)),
            )
        )

    def _mark_broken_blocked(self, provenance: Provenance, what: str, why: object) -> None:
        """Record a plugin whose code blocked (``why`` says for how long) and was abandoned."""
        distribution = provenance.distribution
        self.broken.append(
            BrokenPlugin(
                plugin=provenance.plugin,
                distribution=distribution,
                version=provenance.version,
                error=(
                    f"import blocked: {what} of package {distribution} {why} and was abandoned; "
                    f"fix or uninstall it (pip uninstall {distribution}), or raise "
                    f"{DISCOVERY_TIMEOUT_ENV} if it is only slow"
                ),
                traceback="",
            )
        )

    @property
    def silent_packages(self) -> list[SilentPackage]:
        """Installed packages named like a polyrl plugin (or depending on polyrl) that register
        nothing; empty for a registry not built by :func:`discover`."""
        if self._silent_packages is None:
            self._silent_packages = find_silent_packages() if self.detect_silent else []
        return self._silent_packages

    @silent_packages.setter
    def silent_packages(self, packages: list[SilentPackage]) -> None:
        self._silent_packages = list(packages)

    # ---- lookup ----------------------------------------------------------------------------
    def names(self, kind: PluginKind) -> list[str]:
        return sorted(self.registrations[kind])

    def all(self, kind: PluginKind | None = None) -> list[Registration]:
        kinds = [kind] if kind else list(PluginKind)
        return [
            reg
            for k in kinds
            for name in sorted(self.registrations[k])
            for reg in self.registrations[k][name]
        ]

    def get(self, kind: PluginKind, name: str) -> Registration:
        """The registration of ``name``, or an error that tells the user what to do
        (:class:`PluginIncompatibleError` when its ``api_version`` excludes this polyrl's)."""
        found = self.registrations[kind].get(name, [])
        if len(found) == 1:
            found[0].require_compatible()
            return found[0]
        if len(found) > 1:
            providers = ", ".join(
                f"{r.provenance.distribution} {r.provenance.version} (plugin {r.provenance.plugin})"
                for r in found
            )
            raise PluginConflictError(
                f"{kind.value} {name!r} is registered by more than one package: {providers}. "
                f"Uninstall one, or limit loading with {ONLY_PLUGINS_ENV}=<plugin,...>."
            )
        raise PluginNotFoundError(self._unknown_name_message(kind, name))

    def load(self, kind: PluginKind, name: str) -> Any:
        """Shortcut: look up ``name`` and resolve its implementation."""
        return self.get(kind, name).load()

    def _unknown_name_message(self, kind: PluginKind, name: str) -> str:
        lines = [f"unknown {kind.value} {name!r} (config key {kind.config_key})."]
        available = self.all(kind)
        if available:
            listing = ", ".join(f"{r.name} ({r.provenance.distribution})" for r in available)
            lines.append(f"Valid names: {listing}.")
        else:
            lines.append("No plugin of this kind is installed.")
        close = difflib.get_close_matches(name, self.names(kind), n=1)
        if close:
            lines.append(f"Did you mean {close[0]!r}?")
        package = FIRST_PARTY_PACKAGES[kind].get(name)
        if self.filtered_out and (package is None or package in self.filtered_out):
            candidates = [package] if package else self.filtered_out
            lines.append(
                f"Installed but not loaded because of {ONLY_PLUGINS_ENV}/{DISABLE_AUTOLOAD_ENV}: "
                f"{', '.join(candidates)}; add it to {ONLY_PLUGINS_ENV} or unset those variables"
            )
            return " ".join([*lines, *self._silent_hint(name)])
        if package:
            broken = [b for b in self.broken if b.distribution == package]
            if broken:
                lines.append(
                    f"Package {package} is installed but failed to load: {broken[0].error}"
                )
            elif package in UNRELEASED_PACKAGES:
                lines.append(
                    f"{name!r} is planned as the package {package}, which is not released yet; "
                    f"pick one of the valid names"
                )
            else:
                lines.append(
                    f"{name!r} is provided by the package {package}: pip install {package}"
                )
        elif self.broken:
            failed = "; ".join(f"{b.distribution} ({b.error})" for b in self.broken)
            lines.append(f"These plugin packages failed to load and may provide it: {failed}")
        return " ".join([*lines, *self._silent_hint(name)])

    def _silent_hint(self, name: str) -> list[str]:
        """Installed packages that register nothing and may have been meant to provide ``name``:
        those whose name contains it, else all of them."""
        silent = self.silent_packages
        if not silent:
            return []
        wanted = _normalized(name)
        matching = [p for p in silent if wanted and wanted in _normalized(p.distribution)]
        listed = ", ".join(f"{p.distribution} {p.version}" for p in matching or silent)
        if matching:
            return [
                f"The installed package {listed} looks like it should provide {name!r} but "
                f"registers no polyrl plugin: its pyproject needs {ENTRY_POINT_HINT} "
                f"(then reinstall it)."
            ]
        return [
            f"Installed packages that register no polyrl plugin (one may be meant to provide "
            f"it): {listed}; a plugin's pyproject needs {ENTRY_POINT_HINT}."
        ]


def _distribution_of(entry_point: metadata.EntryPoint) -> tuple[str, str]:
    dist = getattr(entry_point, "dist", None)
    if dist is None:
        return "unknown", "unknown"
    return dist.metadata["Name"], dist.version


def _selected(entry_point: metadata.EntryPoint, distribution: str) -> bool:
    only = os.environ.get(ONLY_PLUGINS_ENV, "").strip()
    if not only:
        return True
    wanted = {item.strip() for item in only.split(",") if item.strip()}
    return entry_point.name in wanted or distribution in wanted


def discover() -> Registry:
    """Build a registry from the built-ins and the installed entry points (see module doc)."""
    from polyrl import builtins  # light: only specs with import strings

    registry = Registry()
    registry.detect_silent = True
    registry.add_plugin(builtins, Provenance("builtins", BUILTIN_DISTRIBUTION, _core_version()))
    autoload = os.environ.get(DISABLE_AUTOLOAD_ENV, "").lower() not in ("1", "true", "yes")
    seen: set[tuple[str, str]] = set()
    for entry_point in metadata.entry_points(group=ENTRY_POINT_GROUP):
        distribution, version = _distribution_of(entry_point)
        if not autoload or not _selected(entry_point, distribution):
            if distribution not in registry.filtered_out:
                registry.filtered_out.append(distribution)
            continue
        if (entry_point.name, distribution) in seen:
            continue
        seen.add((entry_point.name, distribution))
        provenance = Provenance(entry_point.name, distribution, version)
        what = f"importing {entry_point.value!r}"
        if entry_point.value in abandoned_imports():
            registry._mark_broken_blocked(
                provenance, what, "did not finish in the process that started this one"
            )
            continue
        try:
            module = run_bounded(entry_point.load, discovery_timeout_s())
        except PluginImportBlocked as exc:
            record_abandoned(entry_point.value)
            registry._mark_broken_blocked(provenance, what, exc)
            continue
        except PluginCodeRaised as exc:
            registry._mark_broken(provenance, exc)
            continue
        registry.add_plugin(module, provenance)
    return registry


def _core_version() -> str:
    try:
        return metadata.version(BUILTIN_DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return "unknown"


_registry: Registry | None = None


def get_registry() -> Registry:
    """The process-wide registry, discovered on first use."""
    global _registry
    if _registry is None:
        _registry = discover()
    return _registry


def set_registry(registry: Registry | None) -> None:
    """Replace (or with ``None``, forget) the process-wide registry; used by ``polyrl.testing``."""
    global _registry
    _registry = registry
