"""Engine-neutral reading of the ``actor_rollout_ref.rollout`` config node, shared by the
inference-engine rollout plugins (vLLM, SGLang): the node with the schema's defaults, plain
containers for an engine's argument validation, and verl's ``engine_kwargs`` pass-through
(flat, or nested per backend as ``engine_kwargs.<backend>``).

Light on purpose (OmegaConf only, no engine, no torch): the plugins' config checks import it.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import Any

from omegaconf import OmegaConf

from polyrl.config.nodes import schema_node
from polyrl.errors import PolyrlError

ROLLOUT = "actor_rollout_ref.rollout"
# Separates the default sampling streams of different data-parallel ranks.
SEED_STRIDE = 1_000_003
# polyrl's short dtype names -> the names the engines take.
DTYPE_ALIASES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def rollout_node(config: Any) -> Any:
    """The ``actor_rollout_ref.rollout`` node to read by attribute: a ``DictConfig`` (from the
    schema) as is; a plain or partial dict, or a :class:`~polyrl.config.schema.RolloutConfig`,
    merged over the schema's node (every default comes from the schema)."""
    return schema_node(config, ROLLOUT)


def to_plain(value: Any) -> Any:
    """OmegaConf containers and mappings to plain dicts/lists (engines validate plain types)."""
    if OmegaConf.is_config(value):
        return OmegaConf.to_container(value, resolve=True)
    if isinstance(value, Mapping):
        return {k: to_plain(v) for k, v in value.items()}
    return value


def engine_kwargs_problem(
    raw: Any, *, backend: str, engine_name: str, sections: Collection[str]
) -> str | None:
    """``engine_kwargs`` is a mapping of ``engine_name`` engine arguments; when it is nested per
    backend (any key in ``sections``), its ``backend`` entry is a mapping too."""
    if not isinstance(raw, dict):
        return (
            f"{ROLLOUT}.engine_kwargs must be a mapping of {engine_name} engine arguments, got "
            f"{type(raw).__name__}: {raw!r}"
        )
    if set(raw) & set(sections) and not isinstance(raw.get(backend) or {}, dict):
        return f"{ROLLOUT}.engine_kwargs.{backend} must be a mapping, got {raw[backend]!r}"
    return None


def passthrough_engine_kwargs(
    config: Any,
    *,
    backend: str,
    sections: Collection[str],
    problem: Callable[[Any], str | None],
    error: Callable[[str], Exception],
) -> dict[str, Any]:
    """``engine_kwargs`` of the rollout node as the ``backend`` engine's arguments. verl nests
    them per backend (``engine_kwargs.<backend>.<arg>``, recognised by any key in ``sections``);
    a flat mapping is accepted too. ``problem`` checks the plain mapping; what it finds is
    raised as ``error(message)``."""
    raw = to_plain(rollout_node(config).engine_kwargs)
    found = problem(raw)
    if found:
        raise error(found)
    if set(raw) & set(sections):
        return dict(raw.get(backend) or {})
    return dict(raw)


class RolloutEngineNotInstalledError(PolyrlError, ImportError):
    """A rollout engine was selected but its library cannot be imported. Each plugin subclasses
    it with its ``engine`` (the rollout name), ``library`` and ``install_hint``.

    Also an :class:`ImportError`, so code that probes optional backends with
    ``except ImportError`` keeps working.
    """

    engine = ""
    library = ""
    install_hint = ""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(
            f"the {self.engine!r} rollout engine needs {self.library}, which cannot be imported "
            f"here ({type(cause).__name__}: {cause}); {self.install_hint}"
        )
