"""Model folders for every form of ``actor_rollout_ref.model.path`` (local folder, .gguf file,
hub id, built-in models), cached and converted once. Heavy imports (torch, transformers) happen
only inside the functions."""

from polyrl.models.cache import default_cache_dir
from polyrl.models.resolve import BUILTIN_NAMES, resolve_model_path, smollm2_gguf_path
from polyrl.models.tiny import build_tiny_model

__all__ = [
    "BUILTIN_NAMES",
    "build_tiny_model",
    "default_cache_dir",
    "resolve_model_path",
    "smollm2_gguf_path",
]
