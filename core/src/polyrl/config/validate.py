"""Check a resolved config before any device is taken or any model is loaded.

``polyrl validate`` and the trainer call :func:`validate_config`; it returns every problem it finds
(one line each: what is wrong and how to fix it) instead of stopping at the first, so a user can
fix a command line in one go. Nothing here imports torch or a backend: plugin implementations
named by import string are only *located* (their module file is found without running it), so a
missing backend is reported here rather than after a GPU job has started.
"""

from __future__ import annotations

import difflib
import importlib.util
import math
import os
from collections.abc import Callable, Iterable
from dataclasses import fields, is_dataclass
from importlib.machinery import PathFinder
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue

from polyrl.errors import PolyrlError
from polyrl.registry import Registration, Registry, get_registry
from polyrl.specs import PluginKind, resolve_object

LOSS_AGG_MODES = (
    "token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
)
KL_TYPES = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")
KL_CTRL_TYPES = ("fixed", "adaptive")
DEVICES = ("cpu", "cuda")
RESUME_MODES = ("auto", "disable", "resume_path")
WARMUP_STYLES = ("constant", "cosine")
TRUNCATIONS = ("error", "left", "right")
REWARD_ON_ERROR = ("score", "raise")
GENERATED_DATA_PREFIX = "builtin:"
REQUIRED_COLUMNS_FIXED = ("reward_model",)

_MISSING = object()


# ---- small accessors ---------------------------------------------------------------------------
def _get(cfg: DictConfig, key: str) -> Any:
    """The value at ``key``; ``_MISSING`` when the key is absent or set to ``???``."""
    try:
        value = OmegaConf.select(cfg, key, default=_MISSING, throw_on_missing=True)
    except MissingMandatoryValue:
        return _MISSING
    if isinstance(value, (DictConfig, ListConfig)):
        return OmegaConf.to_container(value, resolve=True)
    return value


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _as_list(value: Any) -> list[Any]:
    if value is None or value is _MISSING:
        return []
    if isinstance(value, (list, tuple)):
        return list(value)
    return [value]


class _Checker:
    """Collects problems; each helper adds at most one line per key."""

    def __init__(self, cfg: DictConfig, registry: Registry) -> None:
        self.cfg = cfg
        self.registry = registry
        self.problems: list[str] = []

    def add(self, message: str) -> None:
        self.problems.append(message)

    def get(self, key: str) -> Any:
        return _get(self.cfg, key)

    # ---- generic range checks -----------------------------------------------------------
    def number(
        self,
        key: str,
        ok: Callable[[float], bool],
        expectation: str,
        *,
        optional: bool = False,
        integer: bool = False,
    ) -> Any:
        """Check ``key`` is a number satisfying ``ok``; return it (or None when unusable)."""
        value = self.get(key)
        if value is _MISSING:
            self.add(f"{key} is not set: give it on the command line, e.g. {key}=<value>")
            return None
        if value is None:
            if not optional:
                self.add(f"{key} is null but must be {expectation}: set {key}=<value>")
            return None
        if not _is_number(value) or (integer and not isinstance(value, int)):
            kind = "an integer" if integer else "a number"
            self.add(f"{key}={value!r} must be {kind} ({expectation})")
            return None
        if not math.isfinite(value) or not ok(value):
            self.add(f"{key}={value} is out of range: it must be {expectation}")
            return None
        return value

    def choice(self, key: str, allowed: Iterable[str]) -> Any:
        allowed = tuple(allowed)
        value = self.get(key)
        if value not in allowed:
            close = difflib.get_close_matches(str(value), allowed, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            self.add(f"{key}={value!r} is not one of {', '.join(allowed)}.{hint}")
            return None
        return value


# ---- plugin selection --------------------------------------------------------------------------
def _module_findable(module_name: str) -> str | None:
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


def _implementation_target(reg: Registration) -> Any:
    spec = reg.spec
    for attr in ("engine", "fn", "provider", "logger"):
        if hasattr(spec, attr):
            return getattr(spec, attr)
    return None


def _check_implementation_locatable(checker: _Checker, key: str, reg: Registration) -> None:
    target = _implementation_target(reg)
    if not isinstance(target, str):
        return
    module_name, sep, attribute = target.partition(":")
    if not sep or not module_name or not attribute:
        checker.add(
            f"{key}={reg.name!r}: package {reg.provenance.distribution} registers a malformed "
            f"import string {target!r} (expected 'package.module:Attribute'); report it upstream"
        )
        return
    why = _module_findable(module_name)
    if why:
        checker.add(
            f"{key}={reg.name!r}: its implementation {target!r} from package "
            f"{reg.provenance.distribution} {reg.provenance.version} cannot be found ({why}). "
            f"Reinstall it: pip install '{reg.provenance.distribution}'"
        )


def _select(checker: _Checker, kind: PluginKind, key: str, name: Any) -> Registration | None:
    if name is _MISSING or name is None or name == "":
        checker.add(f"{key} is not set: choose one of {', '.join(checker.registry.names(kind))}")
        return None
    if not isinstance(name, str):
        checker.add(f"{key}={name!r} must be a plugin name (a string)")
        return None
    try:
        reg = checker.registry.get(kind, name)
    except PolyrlError as exc:
        checker.add(f"{key}: {exc}")
        return None
    broken = [
        b
        for b in checker.registry.broken
        if b.distribution == reg.provenance.distribution and b.plugin == reg.provenance.plugin
    ]
    if broken:
        checker.add(
            f"{key}={name!r}: plugin {reg.provenance.plugin} of package "
            f"{reg.provenance.distribution} is broken ({broken[0].error}); reinstall or fix it"
        )
    _check_implementation_locatable(checker, key, reg)
    return reg


def _check_plugins(checker: _Checker) -> dict[str, Registration]:
    """Every selected plugin exists and can be located. Returns the selections by config key."""
    selected: dict[str, Registration] = {}
    for kind in PluginKind:
        key = kind.config_key
        value = checker.get(key)
        if kind is PluginKind.LOGGER:
            names = _as_list(value)
            for i, name in enumerate(names):
                reg = _select(checker, kind, key, name)
                if reg:
                    selected[f"{key}[{i}]"] = reg
            continue
        reg = _select(checker, kind, key, value)
        if reg:
            selected[key] = reg
    # The trainer builds no value model or model-based reward yet: accepting these switches
    # would silently train without what the user asked for.
    if checker.get("critic.enable") is True:
        checker.add(
            "critic.enable=true: polyrl has no critic (value model) yet, so PPO with GAE cannot "
            "run; use a critic-free estimator (algorithm.adv_estimator=grpo, drgrpo or rloo)"
        )
    if checker.get("reward_model.enable") is True:
        checker.add(
            "reward_model.enable=true: model-based reward models are not supported yet; score "
            "with the built-in verifiable rewards, custom_reward_function.path, or a reward plugin"
        )
    return selected


def _check_capabilities(checker: _Checker, selected: dict[str, Registration]) -> None:
    estimator = selected.get(PluginKind.ADVANTAGE_ESTIMATOR.config_key)
    n = checker.get("actor_rollout_ref.rollout.n")
    if estimator is not None:
        if estimator.spec.requires_groups and _is_number(n) and n < 2:
            checker.add(
                f"algorithm.adv_estimator={estimator.name!r} compares samples of one prompt, so it "
                f"needs actor_rollout_ref.rollout.n >= 2 (got {n}): set "
                f"actor_rollout_ref.rollout.n=4, for example"
            )
        if estimator.spec.requires_critic:
            checker.add(
                f"algorithm.adv_estimator={estimator.name!r} needs a value model, which polyrl "
                f"does not train yet: pick an estimator without a critic, e.g. grpo"
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
def _check_plugin_sections(checker: _Checker, selected: dict[str, Registration]) -> None:
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
        for reg in by_name.get(name, []):
            _check_section_fields(checker, name, section, reg)


def _check_section_fields(checker: _Checker, name: str, section: Any, reg: Registration) -> None:
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


# ---- required keys and files -------------------------------------------------------------------
def _looks_local(path: str) -> bool:
    return (
        path.startswith(("/", "./", "../", "~")) or path.endswith(".gguf") or os.path.exists(path)
    )


def _check_model(checker: _Checker) -> None:
    key = "actor_rollout_ref.model.path"
    path = checker.get(key)
    if path is _MISSING or path is None or path == "":
        checker.add(
            f"{key} is not set: give a local Hugging Face folder or .gguf file, {key}=<path>"
        )
        return
    if not isinstance(path, str):
        checker.add(f"{key}={path!r} must be a string path")
        return
    if path.startswith(GENERATED_DATA_PREFIX):
        _check_builtin_model(checker, key, path)
        return
    if _looks_local(path) and not os.path.exists(os.path.expanduser(path)):
        checker.add(f"{key}={path!r} does not exist: give an existing model folder or .gguf file")


def _check_builtin_model(checker: _Checker, key: str, path: str) -> None:
    """``builtin:<name>`` models: the name is known and, for SmolLM2, its weights are installed
    (located through package metadata; nothing is converted or loaded here)."""
    try:
        from polyrl.models import resolve
    except ImportError:
        return
    name, _, seed = path[len(GENERATED_DATA_PREFIX) :].partition("@")
    if name not in resolve.BUILTIN_NAMES:
        known = ", ".join(GENERATED_DATA_PREFIX + n for n in resolve.BUILTIN_NAMES)
        checker.add(f"{key}={path!r} is not a built-in model; the built-in models are: {known}")
    elif name == "tiny" and seed and not seed.isdigit():
        checker.add(f"{key}={path!r}: the seed after '@' must be an integer, e.g. builtin:tiny@1")
    elif name == resolve.SMOLLM2_NAME:
        try:
            resolve.smollm2_gguf_path()
        except PolyrlError as exc:
            checker.add(f"{key}={path!r}: {exc}")


def _check_data(checker: _Checker) -> None:
    prompt_key = checker.get("data.prompt_key")
    source_key = checker.get("data.reward_fn_key")
    columns = [c for c in (source_key, prompt_key) if isinstance(c, str)]
    columns += list(REQUIRED_COLUMNS_FIXED)
    for key, required in (("data.train_files", True), ("data.val_files", False)):
        value = checker.get(key)
        if value is _MISSING or value is None or value == []:
            if required:
                checker.add(f"{key} is not set: give a parquet file, {key}=<path.parquet>")
            continue
        for path in _as_list(value):
            _check_data_file(checker, key, path, columns)


def _check_data_file(checker: _Checker, key: str, path: Any, columns: list[str]) -> None:
    if not isinstance(path, str) or not path:
        checker.add(f"{key}: {path!r} is not a file path")
        return
    if path.startswith(GENERATED_DATA_PREFIX):
        _check_generated_data(checker, key, path)
        return
    full = os.path.expanduser(path)
    if not os.path.exists(full):
        checker.add(f"{key}: file {path!r} does not exist")
        return
    if not full.endswith(".parquet") or os.path.isdir(full):
        return
    import pyarrow.parquet as pq

    try:
        schema = pq.read_schema(full)
    except Exception as exc:  # noqa: BLE001 - reported as a problem line
        checker.add(f"{key}: {path!r} is not a readable parquet file ({type(exc).__name__}: {exc})")
        return
    missing = [c for c in columns if c not in schema.names]
    if missing:
        checker.add(
            f"{key}: {path!r} lacks the column(s) {', '.join(missing)} "
            f"(it has: {', '.join(schema.names)}); verl-format data needs "
            f"{', '.join(columns)} (data.prompt_key / data.reward_fn_key name the first two)"
        )


def _check_generated_data(checker: _Checker, key: str, spec: str) -> None:
    """A ``builtin:<generator>[/<task>][?k=v]`` source names a known generator (nothing is
    generated here: that happens when training starts)."""
    try:
        from polyrl.data.generate import GENERATORS
        from polyrl.data.sources import parse_builtin
    except ImportError:  # the data package is optional for validation
        return
    try:
        name, _task, _params = parse_builtin(spec)
    except PolyrlError as exc:
        checker.add(f"{key}: {exc}")
        return
    if name not in GENERATORS:
        close = difflib.get_close_matches(name, list(GENERATORS), n=1)
        hint = f" Did you mean {GENERATED_DATA_PREFIX}{close[0]}?" if close else ""
        checker.add(
            f"{key}: {spec!r} names no built-in dataset generator.{hint} Available: "
            f"{', '.join(GENERATED_DATA_PREFIX + g for g in sorted(GENERATORS))}"
        )


# ---- types and ranges --------------------------------------------------------------------------
def _positive(v: float) -> bool:
    return v > 0


def _at_least(low: float) -> Callable[[float], bool]:
    return lambda v: v >= low


def _unit_open(v: float) -> bool:
    return 0 < v < 1


def _check_ranges(checker: _Checker) -> None:
    c = checker
    actor = "actor_rollout_ref.actor"
    rollout = "actor_rollout_ref.rollout"
    c.number(f"{actor}.optim.lr", _positive, "> 0")
    c.number(f"{actor}.optim.clip_grad", _positive, "> 0")
    c.number(f"{actor}.optim.lr_warmup_steps_ratio", lambda v: 0 <= v <= 1, "in [0, 1]")
    c.number(f"{actor}.optim.min_lr_ratio", lambda v: 0 <= v <= 1, "in [0, 1]")
    c.choice(f"{actor}.optim.warmup_style", WARMUP_STYLES)
    c.number(f"{actor}.clip_ratio", _unit_open, "between 0 and 1 (exclusive), e.g. 0.2")
    for which in ("low", "high"):
        c.number(
            f"{actor}.clip_ratio_{which}",
            _unit_open,
            "between 0 and 1 (exclusive), or null",
            optional=True,
        )
    c.number(f"{actor}.clip_ratio_c", lambda v: v > 1, "> 1 (the dual-clip bound, e.g. 3.0)")
    c.number(f"{actor}.ppo_epochs", _at_least(1), ">= 1", integer=True)
    c.number(f"{actor}.entropy_coeff", _at_least(0), ">= 0")
    c.number(f"{actor}.kl_loss_coef", _at_least(0), ">= 0")
    c.choice(f"{actor}.loss_agg_mode", LOSS_AGG_MODES)
    c.choice(f"{actor}.kl_loss_type", KL_TYPES)

    c.number(f"{rollout}.n", _at_least(1), ">= 1", integer=True)
    c.number(f"{rollout}.temperature", _at_least(0), ">= 0")
    c.number(f"{rollout}.top_p", lambda v: 0 < v <= 1, "in (0, 1]")
    c.number(f"{rollout}.top_k", _at_least(-1), "-1 (off) or a positive count", integer=True)
    c.number(f"{rollout}.gpu_memory_utilization", lambda v: 0 < v <= 1, "in (0, 1]")
    c.number(f"{rollout}.tensor_model_parallel_size", _at_least(1), ">= 1", integer=True)
    val = f"{rollout}.val_kwargs"
    c.number(f"{val}.temperature", _at_least(0), ">= 0")
    c.number(f"{val}.top_p", lambda v: 0 < v <= 1, "in (0, 1]")
    c.number(f"{val}.top_k", _at_least(-1), "-1 (off) or a positive count", integer=True)
    val_n = c.number(f"{val}.n", _at_least(1), ">= 1", integer=True)
    if val_n and val_n > 1 and c.get(f"{val}.do_sample") is False:
        c.add(
            f"{val}.n={val_n} with {val}.do_sample=false gives {val_n} identical greedy answers: "
            f"set {val}.do_sample=true or {val}.n=1"
        )
    if c.get(f"{val}.do_sample") is True and c.get(f"{val}.temperature") == 0:
        c.add(f"{val}.do_sample=true needs {val}.temperature > 0 (e.g. 0.6)")

    c.number("algorithm.gamma", lambda v: 0 <= v <= 1, "in [0, 1]")
    c.number("algorithm.lam", lambda v: 0 <= v <= 1, "in [0, 1]")
    c.choice("algorithm.kl_penalty", KL_TYPES)
    c.choice("algorithm.kl_ctrl.type", KL_CTRL_TYPES)
    c.number("algorithm.kl_ctrl.kl_coef", _at_least(0), ">= 0")

    c.number("data.max_prompt_length", _at_least(1), ">= 1", integer=True)
    c.number("data.max_response_length", _at_least(1), ">= 1", integer=True)
    c.choice("data.truncation", TRUNCATIONS)

    c.choice("trainer.device", DEVICES)
    c.number("trainer.total_epochs", _at_least(1), ">= 1", integer=True)
    c.number(
        "trainer.total_training_steps", _at_least(1), "null or >= 1", optional=True, integer=True
    )
    mode = c.choice("trainer.resume_mode", RESUME_MODES)
    if mode == "resume_path":
        path = c.get("trainer.resume_from_path")
        if not path or path is _MISSING:
            c.add("trainer.resume_mode=resume_path needs trainer.resume_from_path=<checkpoint dir>")
        elif not os.path.exists(os.path.expanduser(str(path))):
            c.add(f"trainer.resume_from_path={path!r} does not exist")

    c.number("reward_model.timeout_s", _positive, "> 0")
    c.number("reward_model.num_workers", _at_least(1), ">= 1", integer=True)
    c.choice("reward_model.on_error", REWARD_ON_ERROR)
    custom = c.get("custom_reward_function.path")
    if isinstance(custom, str) and custom and not os.path.exists(os.path.expanduser(custom)):
        c.add(
            f"custom_reward_function.path={custom!r} does not exist: give the .py file that "
            f"defines {c.get('custom_reward_function.name')}()"
        )


# ---- batch arithmetic --------------------------------------------------------------------------
def _check_batches(checker: _Checker) -> None:
    c = checker
    nnodes = c.number("trainer.nnodes", _at_least(1), ">= 1", integer=True)
    per_node = c.number("trainer.n_gpus_per_node", _at_least(1), ">= 1", integer=True)
    train = c.number("data.train_batch_size", _at_least(1), ">= 1", integer=True)
    n = c.get("actor_rollout_ref.rollout.n")
    if not (nnodes and per_node and train and isinstance(n, int) and n >= 1):
        return
    world = nnodes * per_node
    where = f"world size {world} = trainer.nnodes {nnodes} x trainer.n_gpus_per_node {per_node}"
    if train % world:
        c.add(
            f"data.train_batch_size {train} is not divisible by the {where}: prompts are split "
            f"across ranks before generation; make the batch a multiple of {world}"
        )
    if (train * n) % world:
        c.add(
            f"data.train_batch_size {train} x rollout.n {n} = {train * n} responses are not "
            f"divisible by the {where}"
        )
    tp = c.get("actor_rollout_ref.rollout.tensor_model_parallel_size")
    if isinstance(tp, int) and tp >= 1 and world % tp:
        c.add(
            f"actor_rollout_ref.rollout.tensor_model_parallel_size {tp} does not divide the {where}"
        )
    _check_ppo_batches(c, "actor_rollout_ref.actor", train, n, world, where)


def _check_ppo_batches(c: _Checker, role: str, train: int, n: int, world: int, where: str) -> None:
    mini = c.number(f"{role}.ppo_mini_batch_size", _at_least(1), ">= 1 (prompts)", integer=True)
    micro = c.number(f"{role}.ppo_micro_batch_size_per_gpu", _at_least(1), ">= 1", integer=True)
    if not mini:
        return
    if train < mini:
        c.add(
            f"data.train_batch_size {train} < {role}.ppo_mini_batch_size {mini}: a step needs at "
            f"least one mini-batch; lower {role}.ppo_mini_batch_size to <= {train}"
        )
    elif train % mini:
        c.add(
            f"data.train_batch_size {train} is not divisible by {role}.ppo_mini_batch_size "
            f"{mini}: every mini-batch must be full"
        )
    responses = mini * n
    if responses % world:
        c.add(
            f"{role}.ppo_mini_batch_size {mini} x rollout.n {n} = {responses} responses per "
            f"mini-batch are not divisible by the {where}"
        )
        return
    per_gpu = responses // world
    if micro and c.get(f"{role}.use_dynamic_bsz") is not True and per_gpu % micro:
        c.add(
            f"per-GPU mini-batch {per_gpu} (= {role}.ppo_mini_batch_size {mini} x rollout.n {n} "
            f"/ world {world}) is not divisible by {role}.ppo_micro_batch_size_per_gpu {micro}; "
            f"pick a divisor of {per_gpu} or set {role}.use_dynamic_bsz=true"
        )


# ---- public API --------------------------------------------------------------------------------
def validate_config(cfg: DictConfig, registry: Registry | None = None) -> list[str]:
    """Every problem of ``cfg``, one human-readable line each; an empty list means valid."""
    checker = _Checker(cfg, registry or get_registry())
    selected = _check_plugins(checker)
    _check_capabilities(checker, selected)
    _check_plugin_sections(checker, selected)
    _check_model(checker)
    _check_data(checker)
    _check_ranges(checker)
    _check_batches(checker)
    return checker.problems


def summarize(cfg: DictConfig) -> str:
    """A few lines that say what a run with ``cfg`` would do."""

    def g(key: str) -> Any:
        value = _get(cfg, key)
        return "???" if value is _MISSING else value

    train, n = g("data.train_batch_size"), g("actor_rollout_ref.rollout.n")
    nnodes, per_node = g("trainer.nnodes"), g("trainer.n_gpus_per_node")
    mini = g("actor_rollout_ref.actor.ppo_mini_batch_size")
    lines = [
        f"algorithm: {g('algorithm.adv_estimator')} "
        f"(loss {g('actor_rollout_ref.actor.policy_loss.loss_mode')}, "
        f"agg {g('actor_rollout_ref.actor.loss_agg_mode')}, "
        f"critic {'on' if g('critic.enable') is True else 'off'})",
        f"model: {g('actor_rollout_ref.model.path')}",
        f"engines: train {g('actor_rollout_ref.actor.strategy')}, "
        f"rollout {g('actor_rollout_ref.rollout.name')}, "
        f"reward {g('reward_model.reward_manager')}, "
        f"loggers {', '.join(map(str, _as_list(g('trainer.logger'))))}",
        f"data: train {g('data.train_files')}, val {g('data.val_files')}",
    ]
    if all(isinstance(v, int) and v > 0 for v in (train, n, nnodes, per_node, mini)):
        world = nnodes * per_node
        lines.append(
            f"batch: {train} prompts x n={n} = {train * n} responses per step on {world} "
            f"device(s) ({g('trainer.device')}); {max(train // mini, 1)} mini-batch(es) of "
            f"{mini * n} responses, {g('actor_rollout_ref.actor.ppo_epochs')} epoch(s)"
        )
    steps = g("trainer.total_training_steps")
    lines.append(
        f"length: {g('trainer.total_epochs')} epoch(s)"
        + (f", stop after {steps} steps" if isinstance(steps, int) else "")
    )
    return "\n".join(lines)
