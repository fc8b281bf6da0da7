"""Contracts: the selected advantage estimator and policy loss are called on a tiny synthetic
batch, and what they return is checked against :class:`polyrl.interfaces.AdvantageEstimatorFn`
and :class:`polyrl.interfaces.PolicyLossFn` (return form, shapes, dtypes, finiteness).

A loss that returns one value per response instead of one per token, or a bare tensor instead of
``(loss, metrics)``, would otherwise fail inside an actor worker after the models are loaded;
here it is one line naming the plugin, its package and the rule it breaks. The rules are the
functions :func:`estimator_output_problems` and :func:`policy_loss_output_problems`, which the
conformance suites of :mod:`polyrl.testing` assert too.

The batch holds exactly the keys the spec's ``requires`` lists, made up by
:func:`synthetic_fields`; a plugin that requires a key this module cannot make up is not called,
and nothing is called while the config has other problems.
torch is imported inside the functions: without it (a machine that only validates configs) the
calls are skipped.
"""

from __future__ import annotations

import math
from typing import Any

from omegaconf import DictConfig, OmegaConf

from polyrl.config.checks.checker import Checker
from polyrl.errors import ConfigError
from polyrl.registry import Registration
from polyrl.specs import SEQUENCE_LEVEL, TOKEN_LEVEL, PluginKind

# The synthetic batch: ROWS responses of LENGTH tokens, two prompts (uids) of two samples each.
ROWS, LENGTH, GROUP_SIZE = 4, 6, 2
# Real tokens of each row: a full row, a one-token row and two in between.
ROW_LENGTHS = (6, 3, 1, 5)
# The config node each kind is called with (see polyrl.interfaces.algorithms).
CONFIG_NODES = {
    PluginKind.ADVANTAGE_ESTIMATOR: "algorithm",
    PluginKind.POLICY_LOSS: "actor_rollout_ref.actor",
}
INTERFACES = {
    PluginKind.ADVANTAGE_ESTIMATOR: "polyrl.interfaces.AdvantageEstimatorFn",
    PluginKind.POLICY_LOSS: "polyrl.interfaces.PolicyLossFn",
}


# ---- the rules (shared with polyrl.testing.conformance) ----------------------------------------
def _describe(value: Any) -> str:
    import torch

    if isinstance(value, torch.Tensor):
        return f"a bare tensor of shape {tuple(value.shape)}"
    if isinstance(value, (tuple, list)):
        return f"a {type(value).__name__} of {len(value)} item(s)"
    return f"a {type(value).__name__}"


def _tensor_problems(name: str, value: Any, shape: tuple[int, ...], real: Any) -> list[str]:
    """``value`` is a floating-point tensor of ``shape``, finite where ``real`` (a bool mask,
    or None for everywhere)."""
    import torch

    if not isinstance(value, torch.Tensor):
        return [f"{name} must be a tensor, got {_describe(value)}"]
    if tuple(value.shape) != shape:
        return [f"{name} must be per token [B, T] = {shape}, got shape {tuple(value.shape)}"]
    if not value.dtype.is_floating_point:
        return [f"{name} must be floating point, got {value.dtype}"]
    finite = torch.isfinite(value.detach())
    if not bool((finite if real is None else finite[real]).all()):
        where = "" if real is None else " on real tokens"
        return [f"{name} has non-finite values (NaN or inf){where}"]
    return []


def estimator_output_problems(result: Any, response_mask: Any) -> list[str]:
    """What breaks the estimator contract in ``result`` (empty: nothing):
    ``(advantages[B, T], returns[B, T])``, floating point and finite everywhere."""
    if not isinstance(result, (tuple, list)) or len(result) != 2:
        return [
            f"it must return a tuple (advantages[B, T], returns[B, T]), got {_describe(result)}"
        ]
    shape = tuple(response_mask.shape)
    problems: list[str] = []
    for name, value in zip(("advantages", "returns"), result):
        problems += _tensor_problems(name, value, shape, None)
    return problems


def policy_loss_output_problems(
    result: Any, response_mask: Any, level: str = TOKEN_LEVEL
) -> list[str]:
    """What breaks the policy-loss contract in ``result`` (empty: nothing):
    ``(loss[B, T], metrics)`` — ``loss[B]`` for a sequence-level loss
    (:attr:`polyrl.specs.PolicyLossSpec.level`) — the loss floating point and finite on real
    tokens (rows), the metrics a dict of names to finite scalars."""
    shape = "[B]" if level == SEQUENCE_LEVEL else "[B, T]"
    if not isinstance(result, (tuple, list)) or len(result) != 2:
        return [f"it must return a tuple (loss{shape}, metrics), got {_describe(result)}"]
    loss, metrics = result
    if level == SEQUENCE_LEVEL:
        rows = response_mask.sum(-1) > 0
        problems = _tensor_problems("the loss", loss, (response_mask.shape[0],), rows)
    else:
        real = response_mask > 0
        problems = _tensor_problems("the loss", loss, tuple(response_mask.shape), real)
    if not isinstance(metrics, dict):
        return [*problems, f"metrics must be a dict of names to scalars, got {_describe(metrics)}"]
    for name, value in metrics.items():
        if not isinstance(name, str):
            problems.append(f"metric name {name!r} must be a string")
        elif not _finite_scalar(value):
            problems.append(f"metric {name!r} is not a finite scalar (got {_describe(value)})")
    return problems


def _finite_scalar(value: Any) -> bool:
    try:
        number = float(value.item()) if hasattr(value, "item") else float(value)
    except (TypeError, ValueError, RuntimeError):
        return False
    return math.isfinite(number)


# ---- the synthetic batch -----------------------------------------------------------------------
def synthetic_fields() -> dict[str, Any]:
    """Every batch key this module can make up, for :data:`ROWS` ragged responses of
    :data:`LENGTH` tokens in groups of :data:`GROUP_SIZE` (deterministic; the global RNG is
    untouched). ``log_probs`` (the current policy's) drifts a little from ``old_log_probs``."""
    import numpy as np
    import torch

    gen = torch.Generator().manual_seed(0)
    lengths = torch.tensor(ROW_LENGTHS)
    mask = (torch.arange(LENGTH).unsqueeze(0) < lengths.unsqueeze(1)).float()
    rewards = torch.zeros(ROWS, LENGTH)
    rewards[torch.arange(ROWS), lengths - 1] = torch.tensor([1.0, 0.0, 0.5, -0.5])
    old = -torch.rand(ROWS, LENGTH, generator=gen) * 3 * mask
    advantages = (torch.randn(ROWS, 1, generator=gen) * mask).contiguous()
    values = torch.randn(ROWS, LENGTH, generator=gen) * mask
    return {
        "response_mask": mask,
        "token_level_rewards": rewards,
        "token_level_scores": rewards.clone(),
        "uid": np.array([f"prompt-{i // GROUP_SIZE}" for i in range(ROWS)], dtype=object),
        "values": values,
        "returns": advantages + values,
        "advantages": advantages,
        "old_log_probs": old,
        "log_probs": old + 0.1 * torch.randn(ROWS, LENGTH, generator=gen) * mask,
        "rollout_log_probs": old + 0.05 * torch.randn(ROWS, LENGTH, generator=gen) * mask,
        "ref_log_prob": old + 0.05 * torch.randn(ROWS, LENGTH, generator=gen) * mask,
    }


def required_batch(requires: tuple[str, ...], fields: dict[str, Any]) -> tuple[Any, list[str]]:
    """``(batch of exactly the required keys, [])``, or ``(None, missing keys)`` when
    ``fields`` lacks some."""
    from polyrl.batch import Batch

    missing = [key for key in requires if key not in fields]
    if missing:
        return None, missing
    batch = Batch()
    for key in requires:
        batch[key] = fields[key]
    return batch, []


# ---- the check ---------------------------------------------------------------------------------
def check_contracts(checker: Checker, selected: dict[str, Registration]) -> None:
    """Call the selected estimator and policy loss on the synthetic batch; each one that raises
    or breaks its contract is one line.

    Run last, and only on a config with no other problem: the plugins read their knobs from it,
    so a bad value (``clip_ratio_high=abc``) would make them fail for a reason already reported.
    Skipped without torch; a plugin that cannot be loaded (reported by :mod:`.plugins`) or
    requires a key that cannot be made up is not called."""
    if checker.problems:
        return
    try:
        import torch
    except Exception:  # noqa: BLE001 - no (working) torch here: nothing to call
        return
    for key, reg in selected.items():
        if reg.kind not in CONFIG_NODES:
            continue
        node = OmegaConf.select(checker.cfg, CONFIG_NODES[reg.kind], default=None)
        if not isinstance(node, DictConfig):
            continue
        try:
            implementation = reg.load()
        except Exception:  # noqa: BLE001 - reported by the plugin selection check
            continue
        with torch.random.fork_rng(devices=[]):
            problem = _call(reg, implementation, node)
        if problem:
            owner = (
                f"{key}={reg.name!r} (package {reg.provenance.distribution} "
                f"{reg.provenance.version})"
            )
            checker.add(f"{owner}: {problem}; see {INTERFACES[reg.kind]}")


def _call(reg: Registration, implementation: Any, node: DictConfig) -> str | None:
    """Why the call on the synthetic batch breaks the contract (one line), or None."""
    fields = synthetic_fields()
    batch, missing = required_batch(tuple(reg.spec.requires), fields)
    if missing:
        return None  # it needs keys this check cannot make up: its conformance tests cover it
    where = f"on a synthetic batch of {ROWS} x {LENGTH} tokens"
    mask = fields["response_mask"]
    try:
        if reg.kind is PluginKind.POLICY_LOSS:
            log_prob = fields["log_probs"].clone().requires_grad_(True)
            output = implementation(batch, log_prob, node)
            problems = policy_loss_output_problems(output, mask, reg.spec.level)
        else:
            problems = estimator_output_problems(implementation(batch, node), mask)
    except ConfigError:
        return None  # a config problem (its plugins.<name> section): reported by other checks
    except Exception as exc:  # noqa: BLE001 - a plugin bug is a problem line, not a crash
        return f"calling it {where} raised {type(exc).__name__}: {' '.join(str(exc).split())}"
    if not problems:
        return None
    return f"it breaks its contract {where}: {'; '.join(problems)}"
