"""verl's Megatron CPU offload (``megatron.param_offload``, ``grad_offload``,
``optimizer_offload``): the engine's weights and AdamW state wait in host memory between the
calls the driver makes (log-probs, an update, a weight sync, a checkpoint), and come to the
GPU for the call only, so a colocated rollout engine has the GPU's memory meanwhile.

What moves, as verl moves it: the parameters' storage (``param.data``, so the optimizer and
megatron-core keep the same ``Parameter`` objects), and AdamW's moment estimates (every tensor
of the optimizer state except the step counter, which torch keeps where the optimizer wants it;
the state of a parameter the optimizer steps on the host, :mod:`.cpu_optimizer`, stays there).
Gradients need no move: the engine frees them after each optimizer step, so none are held
between calls (``grad_offload`` is satisfied by the step itself). Each call moves the weights
once each way; an update of several mini-batches moves them per mini-batch, since the engine
sees one mini-batch per call.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

KEPT_IN_PLACE = ("step",)  # AdamW's step counter: torch decides its device


@dataclass(frozen=True)
class OffloadSettings:
    """``megatron.{param,grad,optimizer}_offload`` of the role's engine node."""

    params: bool = False
    grads: bool = False
    optimizer: bool = False

    @classmethod
    def from_node(cls, megatron: Any) -> OffloadSettings:
        return cls(
            params=bool(megatron.param_offload),
            grads=bool(megatron.grad_offload),
            optimizer=bool(megatron.optimizer_offload),
        )


class HostOffload:
    """Where one engine's parameters and optimizer state live between calls.

    :meth:`call` wraps one engine call: the parameters come to ``device`` on entry and go back
    to the host on exit (with ``params``); :meth:`optimizer_step` wraps the optimizer step: its
    state comes to ``device`` before and goes back after (with ``optimizer``). Calls may nest
    (an export streams the weights): only the outermost moves anything.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: Callable[[], torch.optim.Optimizer | None],
        device: torch.device,
        settings: OffloadSettings,
        host: torch.device | None = None,
    ) -> None:
        self.model = model
        self.optimizer = optimizer
        self.device = device
        self.host = host or torch.device("cpu")
        self.settings = settings
        self.depth = 0

    def start(self) -> None:
        """After the model and optimizer are built: the parameters go to the host."""
        if self.settings.params:
            self._move_params(self.host)

    @contextmanager
    def call(self) -> Iterator[None]:
        outermost = self.depth == 0
        self.depth += 1
        try:
            if outermost and self.settings.params:
                self._move_params(self.device)
            yield
        finally:
            self.depth -= 1
            if outermost and self.settings.params:
                self._move_params(self.host)

    @contextmanager
    def optimizer_step(self) -> Iterator[None]:
        if self.settings.optimizer:
            self._move_optimizer_state(self.device)
        try:
            yield
        finally:
            self.park_optimizer()

    def park_optimizer(self) -> None:
        """The optimizer state to the host (with ``optimizer``), e.g. after a checkpoint put it
        next to the parameters."""
        if self.settings.optimizer:
            self._move_optimizer_state(self.host)

    def stream(self, tensors: Iterator[Any]) -> Iterator[Any]:
        """``tensors`` (a generator that reads the weights) as one call, ended when it is."""
        with self.call():
            yield from tensors

    @torch.no_grad()
    def _move_params(self, target: torch.device) -> None:
        pinned = target.type == "cpu" and self.device.type == "cuda"
        for param in self.model.parameters():
            if param.device == target:
                continue
            param.data = _moved(param.data, target, pinned)
            if param.grad is not None:
                param.grad = _moved(param.grad, target, pinned)
        if target.type == "cpu" and self.device.type == "cuda":
            torch.cuda.empty_cache()

    @torch.no_grad()
    def _move_optimizer_state(self, target: torch.device) -> None:
        optimizer = self.optimizer()
        if optimizer is None:
            return
        pinned_host = self.device.type == "cuda"
        for param, state in optimizer.state.items():
            if param.device == self.host and target != self.host:
                continue  # a host copy's state (optimizer_cpu_offload): it steps on the host
            for key, value in state.items():
                if isinstance(value, torch.Tensor) and key not in KEPT_IN_PLACE:
                    state[key] = _moved(value, target, target.type == "cpu" and pinned_host)
        if target.type == "cpu" and self.device.type == "cuda":
            torch.cuda.empty_cache()


def _moved(tensor: torch.Tensor, target: torch.device, pinned: bool) -> torch.Tensor:
    """``tensor`` on ``target``; into page-locked host memory when ``pinned`` (the copies back to
    the GPU are then asynchronous)."""
    if not pinned:
        return tensor.to(target, non_blocking=True)
    host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
    host.copy_(tensor)
    return host
