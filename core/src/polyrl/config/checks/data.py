"""The data: train (and val) files are set, exist, and have the columns verl-format data needs
(read from the parquet schema, not the rows); ``builtin:`` sources name a known generator.

An algorithm that brings its own data (``AlgorithmSpec.data``) reads other files: only their
existence is checked here, and its own ``config_check`` checks their columns (DPO's preference
pairs: ``polyrl_algo_dpo.config.preference_file_problems``).
"""

from __future__ import annotations

import difflib
import os
from typing import Any

from polyrl.config.checks.checker import MISSING, Checker, as_list
from polyrl.errors import PolyrlError

GENERATED_DATA_PREFIX = "builtin:"
REQUIRED_COLUMNS_FIXED = ("reward_model",)
DATA_FILE_KEYS = ("data.train_files", "data.val_files")


def check_data(checker: Checker) -> None:
    from polyrl.data.chat_template import KWARGS_KEY, kwargs_problem
    from polyrl.data.custom_dataset import custom_dataset_problems
    from polyrl.data.sampler import sampler_problems

    for line in sampler_problems(checker.cfg.data.sampler):
        checker.add(line)
    for line in custom_dataset_problems(checker.cfg.data.custom_cls):
        checker.add(line)
    kwargs = checker.get(KWARGS_KEY)
    problem = kwargs_problem(None if kwargs is MISSING else kwargs)
    if problem:
        checker.add(problem)
    prompt_key = checker.get("data.prompt_key")
    source_key = checker.get("data.reward_fn_key")
    columns = [c for c in (source_key, prompt_key) if isinstance(c, str)]
    columns += list(REQUIRED_COLUMNS_FIXED)
    if _algorithm_brings_own_data(checker) or checker.cfg.data.custom_cls.path is not None:
        columns = []  # the algorithm's or verl's custom dataset class reads the files
    for key, required in zip(DATA_FILE_KEYS, (True, False)):
        value = checker.get(key)
        if value is MISSING or value is None or value == []:
            if required:
                checker.add(f"{key} is not set: give a parquet file, {key}=<path.parquet>")
            continue
        for path in as_list(value):
            _check_data_file(checker, key, path, columns)


def _check_data_file(checker: Checker, key: str, path: Any, columns: list[str]) -> None:
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


def _algorithm_brings_own_data(checker: Checker) -> bool:
    """Whether the selected algorithm reads its own files (``AlgorithmSpec.data``); a selection
    problem is reported by the pipeline checks, not here."""
    from polyrl.plan import select_algorithm

    name, estimator = checker.get("algorithm.name"), checker.get("algorithm.adv_estimator")
    try:
        registration = select_algorithm(
            name if isinstance(name, str) else None, str(estimator), checker.registry
        )
    except PolyrlError:
        return False
    return registration.spec.data is not None


def _check_generated_data(checker: Checker, key: str, spec: str) -> None:
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


def __getattr__(name: str) -> Any:
    """``preference_file_problems`` moved to the DPO plugin (``polyrl_algo_dpo.config``); the
    old import still resolves, with a DeprecationWarning, while the plugin is installed."""
    if name != "preference_file_problems":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib
    import warnings

    value = getattr(importlib.import_module("polyrl_algo_dpo.config"), name)
    warnings.warn(
        f"{__name__}.{name} is deprecated: import it from polyrl_algo_dpo.config",
        DeprecationWarning,
        stacklevel=2,
    )
    return value
