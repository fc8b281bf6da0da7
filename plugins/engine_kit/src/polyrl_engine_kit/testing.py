"""Test helpers shared by the training engines' test suites (not used at run time).

The engines read their settings from the nodes of a whole run config, so a test composes one
from the schema, as the worker does, and hands the engine its ``actor_rollout_ref.model`` and
``actor_rollout_ref.actor`` nodes; and they all score the same ragged ``[prompt | response]``
rows (of polyrl's tiny model). Keeping them here keeps the engines' tests comparing like with like.
"""

from __future__ import annotations

import functools
import tempfile
from collections.abc import Sequence
from typing import Any

import torch
from omegaconf import OmegaConf

from polyrl.api import Batch, EngineContext
from polyrl.api.testing import build_tiny_model, schema_config


@functools.cache
def tiny_model(prefix: str) -> str:
    """polyrl's tiny model, saved once per ``prefix`` per test process (every engine of a
    conformance module loads the same folder)."""
    return build_tiny_model(tempfile.mkdtemp(prefix=prefix) + "/m")


def composed_context(
    model_path: str,
    *,
    model: dict[str, Any],
    actor: dict[str, Any],
    plugins: dict[str, Any] | None = None,
    device: str = "cpu",
    rank: int = 0,
    world_size: int = 1,
    role: str = "actor",
    seed: int = 3,
    total_training_steps: int = 4,
) -> EngineContext:
    """An :class:`EngineContext` whose nodes come from the schema merged with ``model``
    (``actor_rollout_ref.model``), ``actor`` (``actor_rollout_ref.actor``) and ``plugins``."""
    overrides: dict[str, Any] = {
        "actor_rollout_ref": {"model": {"path": model_path, **model}, "actor": actor}
    }
    if plugins is not None:
        overrides["plugins"] = plugins
    cfg = OmegaConf.merge(schema_config(), overrides)
    return EngineContext(
        role=role,
        model_path=model_path,
        model=cfg.actor_rollout_ref.model,
        engine=cfg.actor_rollout_ref.actor,
        device=device,
        rank=rank,
        world_size=world_size,
        seed=seed,
        total_training_steps=total_training_steps,
        trainable=role != "ref",
    )


def ragged_batch(
    prompt_lens: Sequence[int],
    response_lens: Sequence[int],
    prompt_width: int,
    response_width: int,
    generator: torch.Generator,
) -> Batch:
    """Rows of left-padded prompts and right-padded responses of the given real lengths, with
    token ids in [3, 400) drawn from ``generator`` row by row."""
    rows = len(prompt_lens)
    ids = torch.zeros((rows, prompt_width + response_width), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, (p, r) in enumerate(zip(prompt_lens, response_lens)):
        span = slice(prompt_width - p, prompt_width + r)
        ids[i, span] = torch.randint(3, 400, (p + r,), generator=generator)
        mask[i, span] = 1
    return Batch(
        {
            "input_ids": ids,
            "attention_mask": mask,
            "position_ids": (mask.cumsum(1) - 1).clamp(min=0),
            "responses": ids[:, prompt_width:].clone(),
            "response_mask": mask[:, prompt_width:].clone(),
        }
    )


def record_stepped_gradients(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """A dict that each ``optimizer.step()`` fills with this rank's copy (its shard, for FSDP2's
    DTensors) of every gradient it steps on, by parameter name, after clipping.

    Two paths that should give the same step are compared here rather than by their weights
    after AdamW: its first update ``lr * g / (|g| + eps)`` turns a rounding-level difference in
    a near-zero gradient into one of up to ``2 * lr`` in the weight.
    """
    names = {id(param): name for name, param in model.named_parameters()}
    stepped: dict[str, torch.Tensor] = {}

    def record(opt: torch.optim.Optimizer, *_: Any) -> None:
        for group in opt.param_groups:
            for param in group["params"]:
                if param.grad is not None:
                    grad = param.grad
                    local = grad.to_local() if hasattr(grad, "to_local") else grad
                    stepped[names[id(param)]] = local.detach().float().cpu().clone()

    optimizer.register_step_pre_hook(record)
    return stepped
