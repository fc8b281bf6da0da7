"""One optimizer step's bookkeeping, the same in every polyrl engine: the micro-batch loop.

Each micro-batch reaches the loss on the engine's device with ``meta`` keys ``mini_batch_rows``,
``mini_batch_response_tokens`` (this rank's) and ``num_micro_batches``, so a loss can scale
itself to the mini-batch; the loss metrics are averaged over the micro-batches; the policy's
entropy is reported token-weighted unless the loss reports its own; a step with a non-finite
grad norm is reported as skipped. How the engine runs backward and steps its optimizer is its
own (passed in), so that the metrics mean the same whichever engine produced them.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator

import torch

from polyrl.api import Batch, MicroBatchLossFn, needs_entropy_grad
from polyrl_engine_kit.errors import EngineUsageError
from polyrl_engine_kit.logprob import EntropyMode, TokenScores
from polyrl_engine_kit.scoring import response_mask

# A micro-batch's loss and metrics, computed from its forward pass (the head decides which).
MicroLoss = Callable[[Batch], tuple[torch.Tensor, dict[str, float]]]
# An engine's scoring of a micro-batch: log-probs and entropy ``[b, R]``.
PolicyForward = Callable[[Batch, float, EntropyMode], TokenScores]


def require_trainable(optimizer: object, scheduler: object, role: str) -> None:
    """Refuse a training step on a frozen engine (one built without an optimizer)."""
    if optimizer is None or scheduler is None:
        raise EngineUsageError(
            f"train_step called on a non-trainable engine (role {role!r}); "
            f"only the actor role trains"
        )


def entropy_mode(loss_fn: MicroBatchLossFn) -> EntropyMode:
    """With a gradient only when the loss differentiates the entropy (it says so itself)."""
    return EntropyMode.GRAD if needs_entropy_grad(loss_fn) else EntropyMode.DETACHED


class EntropyMean:
    """The token-weighted mean entropy of the response tokens over a step's micro-batches.

    The sums stay on the device until :meth:`report`, so that recording the entropy of a
    micro-batch does not wait for its forward pass (one host sync per step, not per micro-batch).
    """

    def __init__(self) -> None:
        self.sum: torch.Tensor | float = 0.0
        self.tokens: torch.Tensor | float = 0.0

    def add(self, micro: Batch, ent: torch.Tensor | None) -> None:
        if ent is not None:
            mask = response_mask(micro).to(device=ent.device, dtype=ent.dtype)
            self.sum = self.sum + (ent.detach() * mask).sum()
            self.tokens = self.tokens + mask.sum()

    def report(self, result: dict[str, float], prefix: str) -> None:
        """``<prefix>/entropy`` into ``result`` unless the loss already reported one."""
        key = f"{prefix}/entropy"
        tokens = float(self.tokens)
        if key not in result and tokens > 0:
            result[key] = float(self.sum) / tokens


def policy_loss(
    loss_fn: MicroBatchLossFn, mode: EntropyMode, entropy: EntropyMean
) -> Callable[[Batch, torch.Tensor, torch.Tensor | None], tuple[torch.Tensor, dict[str, float]]]:
    """``loss_fn`` on a micro-batch's scores; the entropy reaches ``loss_fn`` only with a
    gradient (``EntropyMode.GRAD``), and is recorded in ``entropy`` either way. For engines
    whose scores come out of a schedule (Megatron's pipeline) rather than a forward call."""

    def scored_loss(
        micro: Batch, log_prob: torch.Tensor, ent: torch.Tensor | None
    ) -> tuple[torch.Tensor, dict[str, float]]:
        passed = ent if mode == EntropyMode.GRAD else None
        loss, metrics = loss_fn(micro, log_prob, passed)
        entropy.add(micro, ent)
        return loss, metrics

    return scored_loss


def policy_micro_loss(
    forward: PolicyForward,
    loss_fn: MicroBatchLossFn,
    temperature: float,
    mode: EntropyMode,
    entropy: EntropyMean,
) -> MicroLoss:
    """:func:`policy_loss` on the scores of ``forward``."""
    scored_loss = policy_loss(loss_fn, mode, entropy)

    def micro_loss(micro: Batch) -> tuple[torch.Tensor, dict[str, float]]:
        scores = forward(micro, temperature, mode)
        return scored_loss(micro, scores.log_prob, scores.entropy)

    return micro_loss


def micro_batches_on(
    mini_batch: Batch, groups: list[list[int]], device: torch.device
) -> Iterator[Batch]:
    """The micro-batches (rows ``groups`` of ``mini_batch``) on ``device``, one at a time, each
    with the mini-batch's ``meta``."""
    meta = {
        "mini_batch_rows": len(mini_batch),
        "mini_batch_response_tokens": float(response_mask(mini_batch).sum()),
        "num_micro_batches": len(groups),
    }
    for group in groups:
        micro = mini_batch.select_rows(torch.tensor(group, dtype=torch.long)).to(device)
        micro.meta.update(meta)
        yield micro


def mean_metrics(records: Iterable[dict[str, float]]) -> dict[str, float]:
    """Each metric averaged over the micro-batches that reported it."""
    sums: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    for metrics in records:
        for key, value in metrics.items():
            sums[key] += float(value)
            counts[key] += 1
    return {key: sums[key] / counts[key] for key in sums}


def accumulate(
    mini_batch: Batch,
    groups: list[list[int]],
    device: torch.device,
    micro_loss: MicroLoss,
    backward: Callable[[torch.Tensor], None],
) -> dict[str, float]:
    """Run ``backward`` on the loss of each micro-batch (rows ``groups`` of ``mini_batch``);
    return the loss metrics averaged over the micro-batches that reported them."""
    records = []
    for micro in micro_batches_on(mini_batch, groups, device):
        loss, metrics = micro_loss(micro)
        backward(loss)
        records.append(metrics)
    return mean_metrics(records)


class StepPeakMemory:
    """The peak GPU memory of one training step, from its start (not the process's: a
    colocated rollout's generation peaks elsewhere), reported as ``<prefix>/peak_memory_gb``;
    nothing on a CPU."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)

    def report(self, result: dict[str, float], prefix: str) -> None:
        if self.device.type == "cuda":
            peak = torch.cuda.max_memory_allocated(self.device) / 2**30
            result[f"{prefix}/peak_memory_gb"] = peak


def report_step(
    result: dict[str, float], prefix: str, grad_norm: float, lr: float, applied: bool
) -> dict[str, float]:
    """Add the step's pre-clip grad norm, its lr and, when it was not ``applied``,
    ``<prefix>/skipped_step``."""
    result[f"{prefix}/grad_norm"] = grad_norm
    result[f"{prefix}/lr"] = lr
    if not applied:
        result[f"{prefix}/skipped_step"] = 1.0
    return result
