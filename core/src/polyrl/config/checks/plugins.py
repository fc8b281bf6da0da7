"""Plugins: every selected name exists, its implementation can be located and loaded, it
supports the device, its ``plugins.<name>`` section has only its keys, and its own
``config_check`` passes.

Implementations are first *located* (their module file is found without running it), then the
selected ones are loaded (:meth:`~polyrl.registry.Registration.load`, with the plugin import
timeout), so a missing backend or a misspelled import string is reported here rather than after
a GPU job has started. A plugin's ``config_check`` is imported and run: it must be light (see
:class:`polyrl.specs._Spec`).
"""

from __future__ import annotations

import difflib
import logging
from dataclasses import fields, is_dataclass
from typing import Any

from polyrl.config.checks.checker import MISSING, Checker, Notice, as_list, is_number
from polyrl.config.verl_compat import NOT_SUPPORTED, backend_refusal
from polyrl.errors import PolyrlError
from polyrl.registry import PluginIncompatibleError, Registration
from polyrl.specs import LOSS_LEVELS, SEQUENCE_LEVEL, PluginKind, resolve_object

log = logging.getLogger(__name__)
DEVICES = ("cpu", "cuda")


# ---- locating and loading implementations ------------------------------------------------------
def check_locatable(checker: Checker, key: str, reg: Registration) -> None:
    """The implementation's module can be found (none of its code is run)."""
    why = reg.locate_problem()
    if why:
        checker.add(f"{key}={reg.name!r}: {why}")


def check_not_broken(checker: Checker, key: str, reg: Registration) -> None:
    broken = [
        b
        for b in checker.registry.broken
        if b.distribution == reg.provenance.distribution and b.plugin == reg.provenance.plugin
    ]
    if broken:
        checker.add(
            f"{key}={reg.name!r}: plugin {reg.provenance.plugin} of package "
            f"{reg.provenance.distribution} is broken ({broken[0].error}); reinstall or fix it"
        )


def check_loadable(checker: Checker, key: str, reg: Registration) -> None:
    """The implementation is imported (with the plugin import timeout): a module that imports
    but lacks the named object, or fails while importing, is one line here, not a crash in a
    worker. A plugin whose ``runtime_modules`` are not installed is left to
    :func:`polyrl.preflight.preflight`, which names the pip command before Ray starts."""
    from polyrl.preflight import module_available

    if not all(module_available(module) for module in reg.spec.runtime_modules):
        return
    why = reg.implementation_problem(import_heavy=True)
    if why:
        checker.add(f"{key}={reg.name!r}: {why}")


# ---- selection ---------------------------------------------------------------------------------
def select(checker: Checker, kind: PluginKind, key: str, name: Any) -> Registration | None:
    if name is MISSING or name is None or name == "":
        checker.add(f"{key} is not set: choose one of {', '.join(checker.registry.names(kind))}")
        return None
    if not isinstance(name, str):
        checker.add(f"{key}={name!r} must be a plugin name (a string)")
        return None
    try:
        reg = checker.registry.get(kind, name)
    except PluginIncompatibleError:
        raise  # the installation, not the config, is wrong: one error line, not a problem list
    except PolyrlError as exc:
        refusal = backend_refusal(key, name, checker.registry.names(kind))
        checker.add(refusal or f"{key}: {exc}")
        return None
    before = len(checker.problems)
    check_not_broken(checker, key, reg)
    check_locatable(checker, key, reg)
    if len(checker.problems) == before:
        check_loadable(checker, key, reg)
    return reg


def check_selection(checker: Checker) -> dict[str, Registration]:
    """Every plugin selected by name exists and can be located; returns them by config key
    (``trainer.logger[i]`` for loggers). The algorithm, which ``algorithm.name`` may leave to
    ``algorithm.adv_estimator``, is selected by :mod:`polyrl.config.checks.pipeline`."""
    selected: dict[str, Registration] = {}
    for kind in PluginKind:
        if kind is PluginKind.ALGORITHM:
            continue
        if kind is PluginKind.DATA_SOURCE_SCORER:  # used when installed: the rows select them
            for reg in checker.registry.all(kind):
                reg.require_compatible()  # it would score its rows in this run
                selected[f"{kind.config_key}[{reg.name}]"] = reg
            continue
        if kind.flag and checker.get(kind.flag) is not True:  # e.g. no multi-turn: no environment
            continue
        key = kind.config_key
        value = checker.get(key)
        if kind is PluginKind.LOGGER:
            for i, name in enumerate(as_list(value)):
                reg = select(checker, kind, key, name)
                if reg:
                    selected[f"{key}[{i}]"] = reg
            continue
        reg = select(checker, kind, key, value)
        if reg:
            selected[key] = reg
    return selected


# ---- capabilities ------------------------------------------------------------------------------
def _check_groups_of_one(checker: Checker, estimator: Registration, n: Any) -> None:
    """``rollout.n`` below 2 for a group estimator: each prompt is a group of one. An estimator
    that defines what such a group gets (``groups_of_one``, verl's GRPO: the raw score) is
    accepted with a notice saying so; any other is refused."""
    singles = getattr(estimator.spec, "groups_of_one", None)
    if singles:
        checker.notice(
            f"algorithm.adv_estimator={estimator.name!r} with actor_rollout_ref.rollout.n={n}: "
            f"each prompt is a group of one, which has no baseline: {singles}"
        )
        return
    checker.add(
        f"algorithm.adv_estimator={estimator.name!r} compares samples of one prompt, so it "
        f"needs actor_rollout_ref.rollout.n >= 2 (got {n}): n={n} asks for groups of one, "
        f"whose raw score verl takes as the advantage (no baseline; here a group of one "
        f"gets 0) (verl); {NOT_SUPPORTED}: set actor_rollout_ref.rollout.n=4, for example"
    )


def check_capabilities(checker: Checker, selected: dict[str, Registration]) -> None:
    estimator = selected.get(PluginKind.ADVANTAGE_ESTIMATOR.config_key)
    n = checker.get("actor_rollout_ref.rollout.n")
    if estimator is not None and estimator.spec.requires_groups and is_number(n) and n < 2:
        _check_groups_of_one(checker, estimator, n)
    loss = selected.get(PluginKind.POLICY_LOSS.config_key)
    cap = checker.get("actor_rollout_ref.actor.tis_imp_ratio_cap")
    level = getattr(loss.spec, "level", None) if loss is not None else None
    if level not in (None, *LOSS_LEVELS):
        checker.add(
            f"{loss.kind.config_key}={loss.name!r} (package {loss.provenance.distribution}) "
            f"declares level={level!r}; a policy loss is {' or '.join(LOSS_LEVELS)}-level"
        )
    elif level == SEQUENCE_LEVEL and is_number(cap) and cap > 0:
        checker.add(
            f"actor_rollout_ref.actor.tis_imp_ratio_cap={cap}: the truncated importance weights "
            f"are per token, and the policy loss {loss.name!r} is sequence-level; set -1"
        )
    device = checker.get("trainer.device")
    if device not in DEVICES:
        return
    flag = "supports_cpu" if device == "cpu" else "supports_cuda"
    for key, reg in selected.items():
        if reg.kind not in (PluginKind.TRAINING_ENGINE, PluginKind.ROLLOUT_ENGINE):
            continue
        if not getattr(reg.spec, flag, True):
            others = [
                r.name for r in checker.registry.all(reg.kind) if getattr(r.spec, flag, False)
            ]
            alternatives = f" Engines that do: {', '.join(others)}." if others else ""
            checker.add(
                f"{key}={reg.name!r} (package {reg.provenance.distribution}) does not support "
                f"trainer.device={device}.{alternatives}"
            )


# ---- plugin config sections --------------------------------------------------------------------
def check_sections(checker: Checker, selected: dict[str, Registration]) -> None:
    from polyrl.config.sections import section_problems

    # A section that cannot be mounted stops the run only when its plugin is selected; for the
    # others it is a warning (their keys are then unknown).
    owners = {f"({reg.provenance.distribution})" for reg in selected.values()}
    for problem in section_problems(checker.registry):
        if any(owner in problem for owner in owners):
            checker.add(problem)
        else:
            log.warning(problem)
    sections = checker.get("plugins")
    if not isinstance(sections, dict):
        return
    by_name: dict[str, list[Registration]] = {}
    for reg in selected.values():
        by_name.setdefault(reg.name, []).append(reg)
    all_names = sorted({reg.name for reg in checker.registry.all()})
    for name, section in sections.items():
        if name not in all_names:
            close = difflib.get_close_matches(name, all_names, n=1)
            hint = f" Did you mean plugins.{close[0]}?" if close else ""
            checker.add(f"plugins.{name} configures no installed plugin.{hint}")
            continue
        for reg in _unique(by_name.get(name, [])):
            _check_section_fields(checker, name, section, reg)


def _unique(regs: list[Registration]) -> list[Registration]:
    seen: list[Registration] = []
    for reg in regs:
        if not any(reg is other for other in seen):
            seen.append(reg)
    return seen


def _check_section_fields(checker: Checker, name: str, section: Any, reg: Registration) -> None:
    config_class = getattr(reg.spec, "config_class", None)
    if config_class is None:
        return
    try:
        cls = resolve_object(config_class)
    except Exception as exc:  # noqa: BLE001 - reported as a problem line
        checker.add(
            f"plugins.{name}: config class {config_class!r} of package "
            f"{reg.provenance.distribution} cannot be loaded ({type(exc).__name__}: {exc})"
        )
        return
    if not is_dataclass(cls):
        checker.add(
            f"plugins.{name}: package {reg.provenance.distribution} declares config_class "
            f"{cls!r}, which is not a dataclass; report it upstream"
        )
        return
    if not isinstance(section, dict):
        checker.add(f"plugins.{name} must be a mapping of keys to values, got {section!r}")
        return
    valid = [f.name for f in fields(cls)]
    for key in section:
        if key not in valid:
            close = difflib.get_close_matches(str(key), valid, n=1)
            hint = f" Did you mean plugins.{name}.{close[0]}?" if close else ""
            checker.add(
                f"unknown key plugins.{name}.{key} for {reg.kind.value} {name!r}.{hint} "
                f"Valid keys: {', '.join(valid)}"
            )


# ---- the plugins' own checks -------------------------------------------------------------------
def run_plugin_checks(checker: Checker, selected: dict[str, Registration]) -> None:
    """Run the ``config_check`` of every selected plugin (each check once). A check that cannot
    be imported, raises, or returns something other than a list of strings is one line naming
    its package. A returned :class:`~polyrl.config.checks.checker.Notice` is logged once, not
    counted as a problem."""
    done: set[Any] = set()
    for key, reg in selected.items():
        check = reg.spec.config_check
        identity = check if isinstance(check, str) else id(check)
        if check is None or identity in done:
            continue
        done.add(identity)
        owner = f"{key.split('[')[0]}={reg.name!r} (package {reg.provenance.distribution})"
        try:
            found = resolve_object(check)(checker.cfg)
        except Exception as exc:  # noqa: BLE001 - a plugin bug is a problem line, not a crash
            checker.add(
                f"{owner}: its config check {_describe(check)} failed "
                f"({type(exc).__name__}: {' '.join(str(exc).split())}); report it to "
                f"{reg.provenance.distribution}"
            )
            continue
        if not isinstance(found, (list, tuple)) or not all(isinstance(p, str) for p in found):
            checker.add(
                f"{owner}: its config check {_describe(check)} returned {type(found).__name__}, "
                f"not a list of strings; report it to {reg.provenance.distribution}"
            )
            continue
        for line in found:
            if isinstance(line, Notice):  # how a setting is honoured: logged, not refused
                checker.notice(" ".join(line.split()))
            else:
                checker.add(" ".join(line.split()))


def _describe(check: Any) -> str:
    if isinstance(check, str):
        return repr(check)
    module = getattr(check, "__module__", None)
    name = getattr(check, "__qualname__", None) or type(check).__name__
    return f"'{module}:{name}'" if module else repr(name)
