"""The step: the selected algorithm, its pipeline, and the pipeline's data chain.

The algorithm is ``algorithm.name``, or the one that owns ``algorithm.adv_estimator`` (see
:func:`polyrl.plan.select_algorithm`). Its pipeline is built by the run plan, as the driver
builds it (:func:`polyrl.plan.assemble`; no model is loaded), and
:meth:`~polyrl.step.pipeline.StepPipeline.check` proves that every batch key a stage reads is
provided by the data loader or an earlier stage. The step's roles also decide whether
``critic.enable`` and ``reward_model.enable`` can be honoured.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from polyrl.config.checks.checker import MISSING, Checker
from polyrl.config.checks.plugins import check_locatable, check_not_broken
from polyrl.errors import ConfigError, PolyrlError
from polyrl.registry import PluginIncompatibleError, Registration, Registry
from polyrl.specs import PluginKind

if TYPE_CHECKING:
    from polyrl.plan import RunPlan
    from polyrl.step.pipeline import StepPipeline

ALGORITHM_KEY = PluginKind.ALGORITHM.config_key
# Roles that a config switch asks for; refused when the selected step has no such role.
SWITCHED_ROLES = {
    "critic.enable": (
        "critic",
        "a critic (value model)",
        "drop critic.enable, or pick an algorithm that trains one with algorithm.name=<name>",
    ),
    "reward_model.enable": (
        "reward_model",
        "the reward model",
        "drop reward_model.enable, or pick an algorithm whose step scores sampled responses "
        "(the policy-gradient family runs the reward_model stage after reward)",
    ),
}


def _package(reg: Registration) -> str:
    return f"package {reg.provenance.distribution}"


def select_algorithm(checker: Checker) -> Registration | None:
    """The algorithm the config selects (its problems reported), or None."""
    name = checker.get(ALGORITHM_KEY)
    estimator = checker.get("algorithm.adv_estimator")
    if name is MISSING or (name is not None and not isinstance(name, str)):
        checker.add(
            f"{ALGORITHM_KEY}={name!r} must be an algorithm name, or null (the algorithm "
            f"that owns algorithm.adv_estimator)"
        )
        return None
    try:
        from polyrl.plan import select_algorithm as select
    except ImportError as exc:
        checker.add(f"{ALGORITHM_KEY}: the step machinery cannot be imported ({exc})")
        return None
    try:
        reg = select(name or None, str(estimator), checker.registry)
    except ConfigError as exc:
        checker.add(" ".join(str(exc).split()))
        return None
    except PluginIncompatibleError:
        raise  # the installation, not the config, is wrong (see checks.plugins.select)
    except PolyrlError as exc:
        key = ALGORITHM_KEY if name else "algorithm.adv_estimator"
        checker.add(f"{key}: {' '.join(str(exc).split())}")
        return None
    check_not_broken(checker, ALGORITHM_KEY, reg)
    check_locatable(checker, ALGORITHM_KEY, reg)
    return reg


def build_plan(cfg: Any, registry: Registry) -> RunPlan:
    """The run plan of ``cfg`` with ``registry``, its step bound but not checked (may raise)."""
    from polyrl.plan import assemble

    return assemble(cfg, registry, check=False)


def build_step(cfg: Any, registry: Registry) -> StepPipeline:
    """The step of the algorithm ``cfg`` selects, built with ``registry`` (may raise)."""
    return build_plan(cfg, registry).pipeline


def _all_selected(checker: Checker, selected: dict[str, Registration]) -> bool:
    """Whether every plugin the config names was selected (the others are reported already:
    assembling the plan would only repeat them)."""
    from polyrl.plan import SINGLE_KINDS

    loggers = PluginKind.LOGGER.config_key
    logger_count = sum(key.startswith(loggers + "[") for key in selected)
    named = checker.get(loggers)
    wanted = len([named] if isinstance(named, str) else list(named or ()))
    if logger_count != wanted or any(k.config_key not in selected for k in SINGLE_KINDS):
        return False
    # An algorithm's own plugin keys (the critic's critic.strategy) are its config check's to
    # report, with what that key needs (a value head).
    algorithm = selected.get(ALGORITHM_KEY)
    for key, kind in dict(getattr(algorithm.spec, "plugin_keys", {}) if algorithm else {}).items():
        if str(checker.get(key)) not in checker.registry.names(PluginKind(kind)):
            return False
    return True


def check_step(
    checker: Checker, selected: dict[str, Registration], algorithm: Registration | None
) -> StepPipeline | None:
    """Assemble the run plan and check its step's chain; returns the step, or None when it
    cannot be built."""
    if algorithm is None or not _all_selected(checker, selected):
        return None
    owner = f"algorithm {algorithm.name!r} ({_package(algorithm)})"
    pipeline = None
    try:
        pipeline = build_step(checker.cfg, checker.registry)
    except ConfigError as exc:
        checker.add(" ".join(str(exc).split()))
    except PolyrlError as exc:
        checker.add(f"{owner}: its step cannot be built: {' '.join(str(exc).split())}")
    except Exception as exc:  # noqa: BLE001 - a plugin bug is a problem line, not a crash
        checker.add(
            f"{owner}: building its step failed ({type(exc).__name__}: "
            f"{' '.join(str(exc).split())}); report it to {algorithm.provenance.distribution}"
        )
    if pipeline is not None:
        for problem in pipeline.check():
            checker.add(f"{owner}: {problem}")
    roles = pipeline.roles() if pipeline is not None else tuple(algorithm.spec.roles)
    _check_switched_roles(checker, algorithm, roles)
    _check_keys_of_other_algorithms(checker, algorithm)
    return pipeline


def _check_keys_of_other_algorithms(checker: Checker, algorithm: Registration) -> None:
    """A key that only another algorithm reads (DAPO's ``algorithm.filter_groups.enable``),
    changed from its default, would be silently ignored by the selected one."""
    from omegaconf import OmegaConf

    from polyrl.config.sections import schema_defaults

    defaults = schema_defaults(checker.registry)
    owners: dict[str, list[Registration]] = {}  # a key several algorithms read: any of them
    for other in checker.registry.all(PluginKind.ALGORITHM):
        for key in other.spec.owned_keys:
            owners.setdefault(key, []).append(other)
    for key, readers in owners.items():
        if any(
            r.name == algorithm.name or r.spec.pipeline == algorithm.spec.pipeline for r in readers
        ):
            continue
        for leaf, value in _leaves(OmegaConf.select(checker.cfg, key), key).items():
            if value != _default_of(defaults, checker.cfg, leaf):
                checker.add(f"{leaf}={value!r} {_read_only_by(readers, algorithm.name)}")


def _read_only_by(readers: list[Registration], selected: str) -> str:
    if len(readers) == 1:
        (only,) = readers
        return (
            f"is read only by the algorithm {only.name!r} ({_package(only)}), but {selected!r} "
            f"is selected and would ignore it: select it with algorithm.name={only.name} or "
            f"drop the key"
        )
    names = ", ".join(repr(r.name) for r in readers)
    return (
        f"is read only by the algorithms {names} ({_package(readers[0])}), but {selected!r} is "
        f"selected and would ignore it: select one of them with algorithm.name or drop the key"
    )


def _leaves(node: Any, key: str) -> dict[str, Any]:
    """The resolved values under ``key``, by dotted path down to the leaves (a group nested in
    the owned group, like a teacher's settings, is compared key by key, not as a whole)."""
    from omegaconf import DictConfig, ListConfig, OmegaConf

    if isinstance(node, ListConfig):
        return {key: OmegaConf.to_container(node, resolve=True)}
    if not isinstance(node, DictConfig):
        return {key: node}
    leaves: dict[str, Any] = {}
    for name in node:
        leaves.update(_leaves(OmegaConf.select(node, str(name)), f"{key}.{name}"))
    return leaves


_NO_DEFAULT = object()


def _default_of(defaults: Any, cfg: Any, key: str) -> Any:
    """The schema's default of ``key``; an interpolated default (``${data.train_batch_size}``)
    is resolved against the run's config, since that is what the key would be if left alone."""
    from omegaconf import OmegaConf

    parent, _, leaf = key.rpartition(".")
    group = OmegaConf.select(defaults, parent)
    if group is None or leaf not in group:  # a key added to a free-form dict: not a default
        return _NO_DEFAULT
    raw = OmegaConf.to_container(group, resolve=False)[leaf]
    if isinstance(raw, str) and raw.startswith("${") and raw.endswith("}"):
        return OmegaConf.select(cfg, raw[2:-1])
    return raw


def _check_switched_roles(
    checker: Checker, algorithm: Registration, roles: tuple[str, ...]
) -> None:
    for key, (role, what, fix) in SWITCHED_ROLES.items():
        if checker.get(key) is not True or role in roles:
            continue
        others = [
            f"{r.name} ({r.provenance.distribution})"
            for r in checker.registry.all(PluginKind.ALGORITHM)
            if role in r.spec.roles
        ]
        having = (
            f"algorithms with one: {', '.join(others)}"
            if others
            else "no installed algorithm has one"
        )
        checker.add(
            f"{key}=true: the selected algorithm {algorithm.name!r} ({_package(algorithm)}) has "
            f"no {role!r} role, so {what} would not be trained or used (its step uses "
            f"{', '.join(roles) or 'no role'}; {having}): {fix}"
        )
