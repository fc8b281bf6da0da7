"""Distillation's rules for a run config (``AlgorithmSpec.config_check``), run by
``polyrl validate`` and before Ray starts. Light on purpose (no torch). The teachers'
tokenizers are compared when the teacher role is built (that needs their folders)."""

from __future__ import annotations

import os
from typing import Any

from polyrl.api import Checker, at_least, get_registry, looks_local
from polyrl_algo_distill.settings import SIGNALS

# The dtype names the training engines accept (polyrl-engine-kit's table).
DTYPE_NAMES = ("bfloat16", "bf16", "float16", "fp16", "half", "float32", "fp32", "float")


def check_config(cfg: Any) -> list[str]:
    """One line per problem of a distillation run config."""
    c = Checker(cfg, get_registry())
    signal = c.get("distill.signal")
    if signal == "loss":
        c.add(
            "distill.signal=loss is not available: a policy loss sees only the actor's config "
            "and cannot wrap the selected loss; use distill.signal=advantage (the reverse KL as "
            "per-token reward, whose expected update is the KL's gradient)"
        )
    else:
        c.choice("distill.signal", SIGNALS)
    c.number("distill.coef", lambda v: v > 0, "> 0, e.g. 1.0")
    c.number("distill.task_reward_weight", at_least(0), ">= 0 (0: the teacher's signal alone)")
    _check_teachers(c)
    return c.problems


def _check_teachers(c: Checker) -> None:
    listed = list(c.get("distill.teachers") or ())
    if listed and c.get("distill.teacher.model_path") is not None:
        c.add(
            "distill.teacher.model_path and distill.teachers are both set: give one teacher "
            "in distill.teacher or several in distill.teachers, not both"
        )
    keys = [f"distill.teachers[{i}]" for i in range(len(listed))] or ["distill.teacher"]
    for key in keys:
        _check_teacher(c, key)
    if not listed:
        return
    weights = [c.get(f"{key}.weight") for key in keys]
    if all(isinstance(w, int | float) and w >= 0 for w in weights) and sum(weights) <= 0:
        c.add(
            "distill.teachers: every weight is 0, so rows of no teacher's data_source have no "
            "teacher; give at least one teacher a weight > 0"
        )
    sources = [c.get(f"{key}.data_source") for key in keys]
    named = [s for s in sources if s is not None]
    repeated = sorted({str(s) for s in named if named.count(s) > 1})
    if repeated:
        c.add(
            f"distill.teachers: data_source {repeated} is named by several teachers; one "
            f"teacher per data source (rows of other sources get the weighted mix)"
        )


def _check_teacher(c: Checker, key: str) -> None:
    path = c.get(f"{key}.model_path")
    if path is None or path == "":
        c.add(
            f"{key}.model_path is not set: distillation needs a teacher; set "
            f"{key}.model_path=<model folder, hub id or builtin:tiny>"
        )
    elif not isinstance(path, str):
        c.add(f"{key}.model_path={path!r} must be a model path (a folder, hub id or builtin:...)")
    elif looks_local(path) and not os.path.exists(os.path.expanduser(path)):
        c.add(f"{key}.model_path={path!r} does not exist: give an existing model folder")
    c.number(f"{key}.weight", at_least(0), ">= 0")
    dtype = str(c.get(f"{key}.dtype")).lower().replace("torch.", "")
    if dtype not in DTYPE_NAMES:
        c.add(
            f"{key}.dtype={dtype!r} is not a dtype the engines know; use bfloat16, float16 "
            f"or float32"
        )
    source = c.get(f"{key}.data_source")
    if source is not None and not isinstance(source, str):
        c.add(f"{key}.data_source={source!r} must be a data_source string, or null")
