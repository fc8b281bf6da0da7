"""``torch.compile`` where the engine uses it: the fused log-prob statistics and each decoder
layer's forward (regional compilation), both on CUDA only.

Why the layers: profiling an update of the Qwen2-0.5B shape on an H200 (benchmarks/gpu/
profile_update.py) showed the GPU idle half the time. A decoder layer is ~40 small eager ops
(plus Liger's Python wrappers), ~4 ms of host time per layer against ~1.8 ms of GPU work on a
16k-token micro-batch, so the host, not the GPU, set the pace. Compiled, a layer is a few fused
kernels and library matmuls launched from one generated function, and the backward likewise.

Why per layer and not the whole model: every layer runs the same code, so one compiled graph
serves them all (dynamo guards on the layer's type and its tensors' properties, not on which
layer it is), the FSDP2 hooks around each layer stay eager, and the compile takes seconds,
not minutes. ``dynamic=True`` because every micro-batch packs a different number of tokens.

With gradient checkpointing the recomputation goes inside the compiled graph
(``torch.utils.checkpoint`` traced by dynamo), not around it as Hugging Face's layers put it:
their checkpoint re-runs the layer with dynamo disabled, so the recomputed forward is not the
compiled one that saved the activations, and the backward failed on an H200 ("early_stop is
set"). Such a layer must trace into one graph (``fullgraph``); where it cannot, it runs eagerly,
checkpointed the same way.

What keeps the first step short (most of it is compiling, even with Inductor's artefacts cached
on disk): floats are traced as constants (``dynamic=True`` would otherwise make a layer's norm
epsilon a symbol, which Inductor cannot keep, and dynamo restarts the whole trace once it finds
out); Inductor's mixed-order reductions of the backward are fused whatever the token count (by
default a size test becomes a guard, and the first micro-batch under it compiles the layer a
second time); and a no-grad forward of a few tokens (the weight sync's probe) runs eagerly rather
than compiling a no-grad graph that a short run may never use again.

A compiler failure (no toolchain, an op it cannot trace) is logged once and the eager function
runs from then on; an out-of-memory error is the batch's, and is raised.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

import torch
import torch.utils.checkpoint

log = logging.getLogger(__name__)

#: No-grad layer forwards over fewer tokens than this run eagerly (see the module's docstring).
EAGER_NO_GRAD_TOKENS = 1024


def compile_or_eager(
    fn: Callable[..., Any],
    what: str,
    backend: str | Callable[..., Any] = "inductor",
    on: Callable[..., bool] | None = None,
    fullgraph: bool = False,
) -> Callable[..., Any]:
    """``fn`` through ``torch.compile`` when ``on(*args)`` holds (always without ``on``), eager
    otherwise or after the compiler failed once (with ``fullgraph``, a graph break counts as a
    failure). ``what`` names ``fn`` in the warning. The eager ``fn`` stays reachable as
    ``__wrapped__``."""
    state: dict[str, Any] = {"compiled": None, "broken": False}

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        if not state["broken"] and (on is None or on(*args, **kwargs)):
            try:
                if state["compiled"] is None:  # lazily: importing dynamo takes seconds
                    state["compiled"] = torch.compile(
                        fn,
                        dynamic=True,
                        backend=backend,
                        fullgraph=fullgraph,
                        options=_inductor_options() if backend == "inductor" else None,
                    )
                # set and put back by hand: config.patch costs several times more, per layer
                dynamo, floats = torch._dynamo.config, torch._dynamo.config.specialize_float
                dynamo.specialize_float = True
                try:
                    return state["compiled"](*args, **kwargs)
                finally:
                    dynamo.specialize_float = floats
            except torch.OutOfMemoryError:
                raise  # a real failure of this batch, not of the compiler
            except Exception as error:  # noqa: BLE001 - any compiler failure: run eagerly
                state["broken"] = True
                log.warning("%s: torch.compile failed (%s); running eagerly", what, error)
        return fn(*args, **kwargs)

    return run


def _inductor_options() -> dict[str, Any]:
    """Mixed-order reductions fused at any size, where this torch has the switch."""
    import torch._inductor.config as inductor

    if hasattr(inductor.triton, "mix_order_reduction_non_strict_mode"):
        return {"triton.mix_order_reduction_non_strict_mode": True}
    return {}


def compiled_on_cuda(fn: Callable[..., Any]) -> Callable[..., Any]:
    """:func:`compile_or_eager` for functions whose first argument is a tensor: compiled when
    it is on CUDA."""
    return compile_or_eager(fn, fn.__name__, on=lambda first, *_, **__: first.is_cuda)


def worth_compiling(hidden_states: torch.Tensor, *_: Any, **__: Any) -> bool:
    """Whether a decoder layer's call goes through its compiled graph: always under autograd,
    and without it from :data:`EAGER_NO_GRAD_TOKENS` tokens on."""
    return torch.is_grad_enabled() or hidden_states.shape[:-1].numel() >= EAGER_NO_GRAD_TOKENS


def recomputed_in_backward(forward: Callable[..., Any]) -> Callable[..., Any]:
    """``forward`` under non-reentrant activation checkpointing whenever autograd records it
    (a no-grad forward keeps nothing, so it runs as it is)."""

    @functools.wraps(forward)
    def run(*args: Any, **kwargs: Any) -> Any:
        if not torch.is_grad_enabled():
            return forward(*args, **kwargs)
        return torch.utils.checkpoint.checkpoint(forward, *args, use_reentrant=False, **kwargs)

    return run


def compile_decoder_layers(
    model: torch.nn.Module,
    layers: list[torch.nn.Module],
    backend: str | Callable[..., Any] = "inductor",
) -> None:
    """Replace each layer's ``forward`` by a compiled one (an instance attribute: the module,
    its hooks, its parameter names and its state dict stay as they are). When ``model`` has
    Hugging Face's gradient checkpointing on, it is turned off and each compiled layer
    recomputes its own activations instead (see the module's docstring). ``backend``: a CPU
    test passes a counting backend to exercise the wiring without Inductor."""
    checkpointed = bool(getattr(model, "is_gradient_checkpointing", False))
    if checkpointed:
        model.gradient_checkpointing_disable()
    for layer in layers:
        name = f"decoder layer {type(layer).__name__}"
        forward = recomputed_in_backward(layer.forward) if checkpointed else layer.forward
        layer.forward = compile_or_eager(
            forward, name, backend=backend, on=worth_compiling, fullgraph=checkpointed
        )
