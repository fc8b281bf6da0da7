"""megatron-core's optimizer CPU offload (verl's ``optim.override_optimizer_config
.optimizer_cpu_offload`` with ``optimizer_offload_fraction``): the AdamW step of part of the
parameters runs on the host, so their moments never take GPU memory.

Which parameters, as megatron-core's hybrid optimizer picks them: in the model's order, each
parameter while the element count taken so far is below ``fraction`` of the total (1.0: all of
them, 0.0: none). Each of those gets a float32 host copy that the one AdamW steps instead of the
parameter (so the LR schedule, the checkpoint's optimizer state and the grad-norm clipping stay
one optimizer's): before the step the (clipped) gradient is copied to the host, after it the
updated copy is written back to the parameter wherever that lives (the GPU, or the host under
``param_offload``). torch's AdamW groups tensors by device, so one step updates both kinds.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class CpuOffloadSettings:
    """The read part of :class:`.settings.OptimizerOverrides`."""

    enabled: bool = False
    fraction: float = 0.0
    pin: bool = True

    @classmethod
    def from_node(cls, overrides: object | None) -> CpuOffloadSettings:
        if overrides is None:
            return cls()
        return cls(
            enabled=bool(overrides.optimizer_cpu_offload),
            fraction=float(overrides.optimizer_offload_fraction),
            pin=bool(overrides.pin_cpu_params) and bool(overrides.pin_cpu_grads),
        )


def host_stepped(params: Sequence[torch.nn.Parameter], fraction: float) -> list[bool]:
    """Whether each parameter's step runs on the host: megatron-core's rule, in order, while the
    elements taken so far are below ``fraction`` of all."""
    threshold = fraction * sum(p.numel() for p in params)
    taken = 0
    chosen = []
    for param in params:
        take = taken < threshold
        taken += param.numel() if take else 0
        chosen.append(take)
    return chosen


class HostStep:
    """The parameters an AdamW steps (host copies where :func:`host_stepped` says so), and the
    copies around its step."""

    def __init__(self, params: Iterable[torch.nn.Parameter], settings: CpuOffloadSettings) -> None:
        self.params = list(params)
        chosen = host_stepped(self.params, settings.fraction if settings.enabled else 0.0)
        self.pairs: list[tuple[torch.nn.Parameter, torch.nn.Parameter]] = []
        self.stepped: list[torch.nn.Parameter] = []
        for param, on_host in zip(self.params, chosen):
            if not on_host:
                self.stepped.append(param)
                continue
            pinned = settings.pin and param.device.type == "cuda"
            copy = torch.nn.Parameter(_host_copy(param.detach(), pinned))
            self.pairs.append((param, copy))
            self.stepped.append(copy)
        self.pinned = settings.pin

    @property
    def host_count(self) -> int:
        return len(self.pairs)

    @torch.no_grad()
    def gradients_to_host(self) -> None:
        """Each host copy's gradient: its parameter's (the parameter's is dropped)."""
        for param, copy in self.pairs:
            grad = param.grad
            if grad is None:
                copy.grad = None
                continue
            copy.grad = _host_copy(grad, self.pinned and grad.device.type == "cuda")
            param.grad = None
        if any(param.device.type == "cuda" for param, _ in self.pairs):
            torch.cuda.synchronize()

    @torch.no_grad()
    def weights_from_host(self) -> None:
        """Each parameter takes its updated host copy's value; the copies' gradients go."""
        for param, copy in self.pairs:
            param.data.copy_(copy.data, non_blocking=True)
            copy.grad = None

    @torch.no_grad()
    def refresh(self) -> None:
        """The host copies take the parameters' values (after a checkpoint was loaded into the
        model)."""
        for param, copy in self.pairs:
            copy.data.copy_(param.data)


def _host_copy(tensor: torch.Tensor, pinned: bool) -> torch.Tensor:
    host = torch.empty(tensor.shape, dtype=torch.float32, pin_memory=pinned)
    host.copy_(tensor, non_blocking=pinned)
    return host
