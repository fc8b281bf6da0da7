"""The model: ``actor_rollout_ref.model.path`` is set and exists (a ``builtin:`` model is known
and, for SmolLM2, installed), and a local folder's or GGUF file's structure is sound
(:mod:`polyrl.models.files`: JSON parses, headers fit). No tensor is loaded."""

from __future__ import annotations

import os

from polyrl.config.checks.checker import MISSING, Checker
from polyrl.errors import PolyrlError

BUILTIN_PREFIX = "builtin:"


def looks_local(path: str) -> bool:
    return (
        path.startswith(("/", "./", "../", "~")) or path.endswith(".gguf") or os.path.exists(path)
    )


def check_model(checker: Checker) -> None:
    from polyrl.data.chat_template import TEMPLATE_KEY, template_problem

    value = checker.get(TEMPLATE_KEY)
    template = template_problem(None if value is MISSING else value)
    if template:
        checker.add(template)
    key = "actor_rollout_ref.model.path"
    path = checker.get(key)
    if path is MISSING or path is None or path == "":
        checker.add(
            f"{key} is not set: give a local Hugging Face folder or .gguf file, {key}=<path>"
        )
        return
    if not isinstance(path, str):
        checker.add(f"{key}={path!r} must be a string path")
        return
    if path.startswith(BUILTIN_PREFIX):
        _check_builtin_model(checker, key, path)
        return
    if looks_local(path) and not os.path.exists(os.path.expanduser(path)):
        checker.add(f"{key}={path!r} does not exist: give an existing model folder or .gguf file")
        return
    _check_local_files(checker, os.path.expanduser(path))


def _check_local_files(checker: Checker, path: str) -> None:
    from polyrl.models.cache import is_hf_folder
    from polyrl.models.files import check_gguf_file, check_model_folder

    try:
        if os.path.isdir(path) and is_hf_folder(path):
            check_model_folder(path)
        elif os.path.isfile(path) and path.lower().endswith(".gguf"):
            check_gguf_file(path)
    except PolyrlError as exc:
        checker.add(str(exc))


def _check_builtin_model(checker: Checker, key: str, path: str) -> None:
    """``builtin:<name>`` models: the name is known and, for SmolLM2, its weights are installed
    (located through package metadata; nothing is converted or loaded here)."""
    try:
        from polyrl.models import resolve
    except ImportError:
        return
    name, _, seed = path[len(BUILTIN_PREFIX) :].partition("@")
    if name not in resolve.BUILTIN_NAMES:
        known = ", ".join(BUILTIN_PREFIX + n for n in resolve.BUILTIN_NAMES)
        checker.add(f"{key}={path!r} is not a built-in model; the built-in models are: {known}")
    elif name == "tiny" and seed and not seed.isdigit():
        checker.add(f"{key}={path!r}: the seed after '@' must be an integer, e.g. builtin:tiny@1")
    elif name == resolve.SMOLLM2_NAME:
        try:
            resolve.smollm2_gguf_path()
        except PolyrlError as exc:
            checker.add(f"{key}={path!r}: {exc}")
